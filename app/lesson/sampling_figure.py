"""Chapter 11's figure: speculative sampling at one step, and the many-runs check against the target."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts import ACCEPTED, BONUS, ORIGIN_COLORS, token_label
from app.lesson.data import COMMAND, Lesson, LessonRun
from app.lesson.figure_kit import SIZE, unique_labels, token_text, base_layout

def _trial_colors(run: LessonRun, entry: dict) -> dict[int, tuple[str, str]]:
    """token -> (colour, word) for the root's drafted candidates and the bonus of one step."""
    marks: dict[int, tuple[str, str]] = {}
    levels = entry.get("levels") or []
    if levels:
        for t in levels[0]["tried"]:
            marks[t["token"]] = ((ORIGIN_COLORS[ACCEPTED], "drafted, accepted") if t["accepted"]
                                 else ("#d64545", "drafted, rejected"))
        if "bonus" in levels[0]:
            marks[levels[0]["bonus"]["token"]] = (ORIGIN_COLORS[BONUS], "drawn from what is left")
    return marks


def sampling_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 11: the target's distribution at this step's root with the drafted candidates marked | the
    first speculative token over many seeded runs against the target's own distribution. Tokens run down
    the axis (horizontal bars), so their names are written whole and never run into each other."""
    check = lesson.checks.get(run.prompt_id)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.22,
                        subplot_titles=(f"Step {step}: target's p(x), first position", _check_title(check)))
    trials = run.meta.get("trials") or []
    entry = trials[min(step, len(trials) - 1)] if trials else {}
    top = (entry.get("target_top") or [])[:TOP_TOKENS]
    marks = _trial_colors(run, entry)
    fig.add_trace(go.Bar(y=unique_labels([token_text(run, t, 10) for t, _ in top]), x=[p for _, p in top], orientation="h",
                         showlegend=False, marker_color=[marks.get(t, ("#c8c8c8", ""))[0] for t, _ in top],
                         text=[f"{p:.2f}" for _, p in top], textposition="outside", cliponaxis=False,
                         hovertext=[marks.get(t, ("", "not drafted"))[1] for t, _ in top],
                         hovertemplate="%{y}: p = %{x:.3f}<br>%{hovertext}<extra></extra>"), row=1, col=1)
    for word, color in (("drafted, accepted", ORIGIN_COLORS[ACCEPTED]), ("drafted, rejected", "#d64545"),
                        ("drawn from what is left", ORIGIN_COLORS[BONUS]), ("not drafted", "#c8c8c8")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=word,
                                 marker=dict(symbol="square", size=12, color=color)), row=1, col=1)
    fig.update_xaxes(title_text="target probability", range=[0, max([0.1, *(p for _, p in top)]) * 1.3],
                     row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    if check:
        _check_bars(fig, check, run)
    else:
        fig.add_annotation(text=f"not recorded: run `{COMMAND}`", xref="x2 domain", yref="y2 domain", x=0.5,
                           y=0.5, showarrow=False)
    temp = run.meta.get("config", {}).get("sampling", {}).get("temperature")
    fig.update_layout(**base_layout(f"Speculative sampling at temperature {temp}: accept x with probability p(x)",
                                    size, 460), barmode="group", bargap=0.2)
    return fig


TOP_TOKENS = 8  # tokens per panel in chapter 11


def _check_title(check: dict | None) -> str:
    if not check:
        return "First speculative token over many runs"
    return f"{check['kept']} seeded runs vs the target"


def _check_bars(fig: go.Figure, check: dict, run: LessonRun) -> None:
    n = check["kept"]
    rows = check["tokens"][:TOP_TOKENS]
    text = {int(k): v for k, v in check.get("token_text", {}).items()}
    labels = unique_labels([token_label(r["token"], text)[:10] for r in rows])
    target = [r["p"] for r in rows]
    band = [1.96 * math.sqrt(max(p * (1 - p), 0.0) / n) for p in target]   # 95% range of n exact draws
    fig.add_trace(go.Bar(y=labels, x=target, orientation="h", name="target p(x)", marker_color="#7f8c8d",
                         error_x=dict(type="data", array=band, visible=True, color="#555"),
                         hovertemplate="%{y}: p = %{x:.3f}<extra>target</extra>"), row=1, col=2)
    fig.add_trace(go.Bar(y=labels, x=[r["count"] / n for r in rows], orientation="h",
                         name=f"speculative, {n} runs", marker_color="#e8743b",
                         hovertemplate="%{y}: %{x:.3f}<extra>speculative sampling</extra>"), row=1, col=2)
    fig.update_xaxes(title_text=f"share of runs (total variation {check['total_variation']:.3f})",
                     rangemode="tozero", row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
