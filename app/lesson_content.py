"""The classroom lesson: recorded traces -> chapter texts, figures and token views (pure functions).

`load_lesson()` reads what `python -m nanospec record-lesson` wrote to assets/lesson/; every other
function takes that `Lesson` plus (chapter, prompt id, step) and returns Markdown, HTML or a Plotly
figure. Nothing here loads a model or touches Gradio, so each chapter is testable without a browser.
"""

from __future__ import annotations

import gzip
import html
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nanospec import metrics
from nanospec.events import RunSummary, StepEvent, events_to_frame

from .inputs import DEFAULTS

from .charts import (ACCEPTED, BONUS, ORIGIN_COLORS, PHASE_COLORS, VOCAB_MISS, compare_figure, coverage_figure,
                     token_label, token_origins, tree_figure, vocab_figure)

LESSON_DIR = Path(__file__).resolve().parent.parent / "assets" / "lesson"
RUNS_FILE = "lesson_runs.json.gz"     # names shared with nanospec/lesson/record.py
SWEEP_FILE = "lm_head_sweep.json"
COMMAND = "python -m nanospec record-lesson"
RUN_LABELS = {"ar": "ar", "greedy": "greedy chain", "full": "full", "static": "static",
              "nanospec": "nanospec", "hybrid": "hybrid"}
SEEN = {"prompt": ("in the prompt", "#3b6fd8"), "output": ("earlier in the answer", "#2e9d5b"),
        "top3": ("in the target's earlier top-3", "#f2b134"), "new": ("new", "#d64545")}
CURRENT = "#111111"
SHORT = {3072: "NanoSpec", 32000: "Llama-2", 49152: "SmolLM2", 128256: "Llama-3", 151936: "Qwen", 256000: "Gemma"}


# -- the recorded material -------------------------------------------------------------------
@dataclass
class LessonRun:
    """One recorded (prompt, run) trace with its frame and per-token bookkeeping precomputed."""

    prompt_id: str
    key: str
    events: list[StepEvent]
    summary: RunSummary
    meta: dict
    frame: pd.DataFrame = field(init=False)
    token_steps: list[int] = field(init=False)   # step that emitted each output token

    def __post_init__(self):
        self.frame = events_to_frame(self.events)
        self.token_steps = [e.step for e in self.events for _ in e.tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.summary.output_ids

    @property
    def pieces(self) -> list[str]:
        return self.meta.get("pieces") or [f"⟨{t}⟩" for t in self.output_ids]

    @property
    def token_text(self) -> dict[int, str]:
        return {int(k): v for k, v in self.meta.get("token_text", {}).items()}

    @property
    def last_step(self) -> int:
        return self.events[-1].step

    def event(self, step: int) -> StepEvent:
        return self.events[max(0, min(step, self.last_step))]

    def tokens_through(self, step: int) -> int:
        """Output tokens emitted up to and including `step`."""
        return sum(1 for s in self.token_steps if s <= step)


@dataclass
class Lesson:
    runs: dict[tuple[str, str], LessonRun]
    prompts: list[dict]
    info: dict                  # command, recorded_at, machine, pair, settings
    sweep: dict | None
    derived: dict = field(default_factory=dict, repr=False)  # memo of whole-lesson aggregates

    def run(self, prompt_id: str, key: str) -> LessonRun:
        if (prompt_id, key) not in self.runs:
            raise ValueError(f"no recorded run {key!r} for prompt {prompt_id!r}")
        return self.runs[(prompt_id, key)]

    @property
    def prompt_ids(self) -> list[str]:
        return [p["id"] for p in self.prompts]

    def prompt(self, prompt_id: str) -> dict:
        return next(p for p in self.prompts if p["id"] == prompt_id)

    def keys(self, prompt_id: str) -> list[str]:
        return [k for (p, k) in self.runs if p == prompt_id]


def load_lesson(folder: str | Path | None = None) -> Lesson:
    """Read the recorded runs (+ sweep, if present). FileNotFoundError / ValueError say what is wrong."""
    folder = Path(folder) if folder is not None else LESSON_DIR
    path = folder / RUNS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no lesson traces at {path}; record them with `{COMMAND}`")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or doc.get("format") != "nanospec-lesson":
        raise ValueError(f"{path.name} is not a lesson bundle written by `{COMMAND}`")
    runs = {}
    for trace in doc["runs"]:
        meta = trace["meta"]
        run = LessonRun(meta["prompt_id"], meta["run"], [StepEvent.from_dict(e) for e in trace["events"]],
                        RunSummary(**trace["summary"]), meta)
        runs[(run.prompt_id, run.key)] = run
    sweep_path = folder / SWEEP_FILE
    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else None
    info = {k: doc.get(k) for k in ("command", "recorded_at", "machine", "pair", "settings")}
    return Lesson(runs, doc["prompts"], info, sweep)


# -- measurements on the traces ----------------------------------------------------------------
def locality(prompt_ids: list[int], output_ids: list[int], top3: list[list[int]]) -> list[str]:
    """Where each output token was seen before it was emitted (first match wins): the prompt, earlier
    output, the target's top-3 at an earlier position (not the guess for this very position), or new."""
    n = len(prompt_ids)
    in_prompt = set(prompt_ids)
    seen_out: set[int] = set()
    guessed: set[int] = set()
    upto = 0  # top3 rows already added; row i holds the guesses for position i + 1
    out = []
    for j, tok in enumerate(output_ids):
        # token j sits at position n + j; its own guess is row n + j - 1, so take rows before that
        for row in top3[upto: n + j - 1]:
            guessed.update(row)
        upto = max(upto, n + j - 1)
        if tok in in_prompt:
            out.append("prompt")
        elif tok in seen_out:
            out.append("output")
        elif tok in guessed:
            out.append("top3")
        else:
            out.append("new")
        seen_out.add(tok)
    return out


def run_locality(run: LessonRun) -> list[str]:
    return locality(run.meta["prompt_ids"], run.output_ids, run.meta["top3"])


def ctx_breakdown(run: LessonRun) -> dict:
    """What NanoSpec's Ctx step adds at prefill: unique prompt ids, plus more from the top-3 guesses."""
    prompt = run.meta["prompt_ids"]
    top = [t for row in run.meta["top3"][: len(prompt)] for t in row]
    unique_prompt = len(set(prompt))
    return {"prompt_tokens": len(prompt), "unique_prompt": unique_prompt,
            "from_top3": len(set(prompt) | set(top)) - unique_prompt}


def lm_head_share(run: LessonRun) -> float:
    decode = run.frame[run.frame["step"] > 0]
    draft = float(decode["draft_ms"].sum())
    return float(decode["phase_lm_head"].sum()) / draft if draft > 0 else 0.0


def summary_table(lesson: Lesson, prompt_id: str) -> pd.DataFrame:
    """One row per recorded run of a prompt, with speedup over `ar` (same prompt, same recording)."""
    rows = []
    ar = lesson.run(prompt_id, "ar").summary.tokens_per_s
    for key in lesson.keys(prompt_id):
        s = lesson.run(prompt_id, key).summary
        rows.append({"method": RUN_LABELS.get(key, key), "tokens_per_s": s.tokens_per_s,
                     "speedup": metrics.speedup(s.tokens_per_s, ar), "tau": s.tau,
                     "draft_ms_per_step": s.draft_ms_per_step, "mean_active": s.mean_active,
                     "coverage": s.coverage, "identical": lesson.run(prompt_id, key).meta.get("identical_to_first")})
    return pd.DataFrame(rows)


# -- figure helpers ----------------------------------------------------------------------------
def base_layout(title: str, presenter: bool = False, height: int = 420) -> dict:
    size = 17 if presenter else 13
    return dict(template="plotly_white", height=int(height * (1.2 if presenter else 1.0)),
                font=dict(size=size), margin=dict(l=64, r=24, t=84, b=120),
                title=dict(text=title, font=dict(size=size + 3), x=0, xanchor="left", y=0.98, yanchor="top"),
                legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, font=dict(size=size - 1)))


def presentable(fig: go.Figure, presenter: bool) -> go.Figure:
    """Scale a figure made by app/charts.py for the room: larger fonts and node labels."""
    size = 17 if presenter else 13
    fig.update_layout(font=dict(size=size), title_font_size=size + 3, legend_font_size=size - 1)
    if presenter:
        fig.update_layout(height=int((fig.layout.height or 400) * 1.2))
        fig.update_traces(textfont_size=15, selector=dict(mode="markers+text"))
    return fig


def mark_step(fig: go.Figure, step: int, label: str | None = None, xref: str = "x") -> go.Figure:
    """A vertical line at the current step, so the chart points at what the text talks about."""
    fig.add_shape(type="line", x0=step, x1=step, y0=0, y1=1, xref=xref, yref="paper",
                  line=dict(color=CURRENT, width=2, dash="dot"))
    fig.add_annotation(x=step, y=1, xref=xref, yref="paper", text=label or f"step {step}", showarrow=False,
                       yanchor="top", xanchor="left", font=dict(color=CURRENT), bgcolor="rgba(255,255,255,0.85)")
    return fig


def _opacity(xs, current) -> list[float]:
    return [1.0 if x == current else 0.35 for x in xs]


def _tok(run: LessonRun, token_id: int, width: int = 12) -> str:
    return token_label(token_id, run.token_text)[:width]


# -- chapter figures ---------------------------------------------------------------------------
def ar_figure(run: LessonRun, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 1: one bar per target forward; the current one dark; tokens so far on a second axis."""
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    median = statistics.median(decode["wall_ms"]) if len(decode) else 0.0
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=steps, y=decode["wall_ms"].tolist(), name="one target forward (ms)",
                         marker_color="#3b6fd8", marker_opacity=_opacity(steps, step),
                         hovertext=[f"step {s}: emitted «{_tok(run, t)}»"
                                    for s, t in zip(steps, decode["bonus_token"])],
                         hovertemplate="%{hovertext}<br>%{y:.1f} ms<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=steps, y=list(range(1, len(steps) + 1)), name="tokens written so far",
                             mode="lines", line=dict(color="#2e9d5b", width=3)), secondary_y=True)
    if step > 0:
        cur = decode[decode["step"] == step]
        fig.add_trace(go.Bar(x=cur["step"].tolist(), y=cur["wall_ms"].tolist(), name=f"step {step}",
                             marker_color=CURRENT, hoverinfo="skip"), secondary_y=False)
    fig.update_layout(**base_layout(f"Autoregressive: 1 token per target forward · median {median:.1f} ms "
                                    f"per forward", presenter), bargap=0.15, barmode="overlay")
    fig.update_xaxes(title_text="decode step = token number")
    fig.update_yaxes(title_text="ms per forward", secondary_y=False)
    fig.update_yaxes(title_text="tokens", showgrid=False, rangemode="tozero", secondary_y=True)
    return mark_step(fig, step) if step > 0 else fig


def chain_figure(run: LessonRun, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 2: the drafted chain of one step against what the target says, and τ per step below."""
    e = run.event(step)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.58, 0.42], vertical_spacing=0.2,
                        subplot_titles=(f"Step {e.step}: drafter proposes a chain, target verifies it in one forward",
                                        "Tokens per target forward, every step (green = accepted, blue = bonus)"))
    n_acc = len(e.accepted_tokens)
    drafted = e.tree_tokens[1:]
    size = 16 if presenter else 12
    marker = 46 if presenter else 38
    # the root (last token written) on the left; drafted tokens at x = 1..k
    fig.add_trace(go.Scatter(x=[0], y=[0.5], mode="markers+text", text=[_tok(run, e.root_token, 9)],
                             textposition="middle center", marker=dict(symbol="square", size=marker, color="#e6e6e6",
                             line=dict(color="#555", width=1.5)), textfont=dict(size=size), name="last token",
                             hoverinfo="skip", showlegend=False), row=1, col=1)
    colors = ["#2e9d5b" if i < n_acc else ("#d64545" if i == n_acc else "#c8c8c8") for i in range(len(drafted))]
    words = ["accepted" if i < n_acc else ("first mismatch" if i == n_acc else "discarded")
             for i in range(len(drafted))]
    if drafted:
        fig.add_trace(go.Scatter(x=list(range(1, len(drafted) + 1)), y=[1] * len(drafted), mode="markers+text",
                                 text=[_tok(run, t, 9) for t in drafted], textposition="middle center",
                                 textfont=dict(size=size, color="white"), name="drafted",
                                 marker=dict(symbol="square", size=marker, color=colors), showlegend=False,
                                 hovertext=words, hoverinfo="text"), row=1, col=1)
    target_x = list(range(1, n_acc + 2))
    target_txt = ["✓"] * n_acc + [_tok(run, e.bonus_token, 9)]
    fig.add_trace(go.Scatter(x=target_x, y=[0] * len(target_x), mode="markers+text", text=target_txt,
                             textposition="middle center", textfont=dict(size=size, color="white"),
                             marker=dict(symbol="square", size=marker,
                                         color=["#2e9d5b"] * n_acc + [ORIGIN_COLORS[BONUS]]),
                             hovertext=["target agrees"] * n_acc + ["bonus token: the target's own choice"],
                             hoverinfo="text", showlegend=False), row=1, col=1)
    fig.update_yaxes(tickvals=[0, 1], ticktext=["target", "drafter"], range=[-0.6, 1.6], row=1, col=1)
    fig.update_xaxes(range=[-0.7, max(len(drafted), n_acc + 1) + 0.7], dtick=1, title_text="position after the "
                     "last token", row=1, col=1)
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    for name, ys, color in (("accepted", decode["n_accepted"].tolist(), ORIGIN_COLORS[ACCEPTED]),
                            ("bonus", [1] * len(steps), ORIGIN_COLORS[BONUS])):
        fig.add_trace(go.Bar(x=steps, y=ys, name=name, marker_color=color, marker_opacity=_opacity(steps, step),
                             showlegend=False, hovertemplate="step %{x}: %{y}<extra>" + name + "</extra>"),
                      row=2, col=1)
    fig.update_layout(**base_layout(f"Draft and verify (greedy chain) · τ = {run.summary.tau:.2f} tokens per "
                                    "target forward", presenter, 520), barmode="stack", bargap=0.15)
    fig.update_xaxes(title_text="decode step", row=2, col=1)
    fig.update_yaxes(title_text="tokens", row=2, col=1)
    fig.update_annotations(font_size=size)
    return mark_step(fig, step, xref="x2") if step > 0 else fig


def tree_chapter_figure(run: LessonRun, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 3: the EAGLE-2 tree of the current step, accepted path in green (app/charts.tree_figure)."""
    fig = tree_figure(run.frame, step, run.token_text)
    fig.update_layout(title_text=fig.layout.title.text + f" · τ over the run = {run.summary.tau:.2f}")
    return presentable(fig, presenter)


def bottleneck_figure(run: LessonRun, sweep: dict | None, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 4: draft time per step split by phase (full vocabulary) | LM-head time vs vocabulary size."""
    share = lm_head_share(run)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12,
                        subplot_titles=(f"Draft time per step, full vocabulary: LM head = {share:.0%}",
                                        "LM-head matmul vs vocabulary size (6 rows, hidden 576)"))
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    for phase in ("draft_layers", "lm_head", "topk", "gather_wait"):
        fig.add_trace(go.Bar(x=steps, y=decode[f"phase_{phase}"].tolist(), name=phase,
                             marker_color=PHASE_COLORS[phase], marker_opacity=_opacity(steps, step),
                             hovertemplate="step %{x}: %{y:.2f} ms<extra>" + phase + "</extra>"), row=1, col=1)
    fig.update_xaxes(title_text="decode step", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    if sweep:
        pts = [p for p in sweep["points"] if p["rows"] == 6]
        labels = [f"{p['vocab'] / 1000:.0f}k<br>{SHORT.get(p['vocab'], p['label'])}" for p in pts]
        colors = ["#2e9d5b" if p["vocab"] < 10_000 else ("#e8743b" if p["vocab"] == run.summary.vocab_size
                                                         else "#7f8c8d") for p in pts]
        fig.add_trace(go.Bar(x=labels, y=[p["ms"] for p in pts], marker_color=colors, showlegend=False,
                             text=[f"{p['ms']:.2f}" for p in pts], textposition="outside", cliponaxis=False,
                             hovertemplate="%{x}: %{y:.3f} ms<extra>median of " + str(sweep["repeats"]) + "</extra>"),
                      row=1, col=2)
        fig.update_yaxes(title_text="ms per matmul (median)", rangemode="tozero", row=1, col=2)
        fig.update_xaxes(tickangle=0, tickfont=dict(size=11), row=1, col=2)
        fig.add_annotation(text="measured on<br>" + sweep["machine"]["text"].replace(" · torch", "<br>torch"),
                           xref="x2 domain", yref="y2 domain", x=0.02, y=0.98, showarrow=False, xanchor="left",
                           yanchor="top", align="left", font=dict(size=11, color="#555"))
    else:
        fig.add_annotation(text=f"sweep not recorded: run `{COMMAND}`", xref="x2 domain", yref="y2 domain",
                           x=0.5, y=0.5, showarrow=False)
    fig.update_layout(**base_layout("The vocabulary bottleneck: the drafter's LM head scores every token",
                                    presenter, 460), barmode="stack", bargap=0.15)
    fig.update_annotations(font_size=15 if presenter else 12, selector=dict(showarrow=False, xref="paper"))
    return mark_step(fig, step) if step > 0 else fig


def locality_figure(lesson: Lesson, prompt_id: str, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 5: running share of 'seen before' tokens for this prompt | the split for every prompt."""
    run = lesson.run(prompt_id, "ar")
    kinds = run_locality(run)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=(f"{prompt_id}: where each new token was seen before",
                                        "All recorded prompts"))
    xs = list(range(1, len(kinds) + 1))
    for kind, (label, color) in SEEN.items():
        running = [100 * sum(k == kind for k in kinds[:i]) / i for i in xs]
        fig.add_trace(go.Scatter(x=xs, y=running, name=label, mode="lines", stackgroup="seen",
                                 line=dict(color=color, width=0.5), legendgroup=kind,
                                 hovertemplate="after %{x} tokens: %{y:.0f}%<extra>" + label + "</extra>"),
                      row=1, col=1)
    fig.update_xaxes(title_text="tokens written", row=1, col=1)
    fig.update_yaxes(title_text="% of tokens so far", range=[0, 100], row=1, col=1)
    ids = lesson.prompt_ids
    shares = {pid: run_locality(lesson.run(pid, "ar")) for pid in ids}
    for kind, (label, color) in SEEN.items():
        ys = [100 * sum(k == kind for k in shares[p]) / max(1, len(shares[p])) for p in ids]
        fig.add_trace(go.Bar(x=[f"<b>{p}</b>" if p == prompt_id else p for p in ids], y=ys, name=label,
                             marker_color=color, legendgroup=kind, showlegend=False,
                             text=[f"{y:.0f}%" for y in ys], textposition="inside",
                             hovertemplate="%{x}: %{y:.0f}%<extra>" + label + "</extra>"), row=1, col=2)
    fig.update_yaxes(title_text="% of emitted tokens", range=[0, 100], row=1, col=2)
    fig.update_layout(**base_layout("Temporal locality: most tokens were seen before they are written",
                                    presenter, 440), barmode="stack")
    token_no = run.tokens_through(step)
    return mark_step(fig, token_no, f"token {token_no}") if token_no > 0 else fig


def active_set_figure(run: LessonRun, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 6: active-set size per step against V and the capacity (app/charts.vocab_figure)."""
    fig = vocab_figure(run.frame)
    cap = run.meta["config"]["vocab"]["capacity"]
    fig.add_shape(type="line", x0=0, x1=1, xref="x domain", y0=cap, y1=cap, yref="y",
                  line=dict(color="#2e9d5b", dash="dot"))
    fig.add_annotation(x=0.99, xref="x domain", y=math.log10(cap), yref="y", text=f"capacity {cap:,}",
                       showarrow=False, xanchor="right", yanchor="bottom", font=dict(color="#2e9d5b"))
    fig.update_layout(height=420, title_text=f"NanoSpec's active set: {run.summary.mean_active:,.0f} rows on "
                      f"average = {run.summary.active_frac:.1%} of V")
    return mark_step(presentable(fig, presenter), step)


def misses_figure(run: LessonRun, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 7: vocab vs draft misses per step and running coverage (app/charts.coverage_figure)."""
    fig = coverage_figure(run.frame)
    counts = run.summary.miss_counts
    fig.update_layout(height=420, title_text=f"Misses: {counts.get('vocab', 0)} vocab, {counts.get('draft', 0)} "
                      f"draft in {run.summary.steps} steps · coverage {run.summary.coverage or 0:.1%}")
    fig = presentable(fig, presenter)
    return mark_step(fig, step) if step > 0 else fig


SYSTEM_PHASES = ("draft_layers", "lm_head", "gather_wait", "topk", "vocab_update")


def phase_means(lesson: Lesson, keys: list[str]) -> dict[str, dict[str, float]]:
    """Mean ms per decode step of each draft-side phase, per run key, over every recorded prompt."""
    memo = lesson.derived.setdefault("phase_means", {})
    for key in keys:
        if key not in memo:
            decode = pd.concat([lesson.run(p, key).frame for p in lesson.prompt_ids if (p, key) in lesson.runs])
            decode = decode[decode["step"] > 0]
            memo[key] = {ph: float(decode[f"phase_{ph}"].mean()) for ph in SYSTEM_PHASES}
    return memo


def system_figure(lesson: Lesson, prompt_id: str, step: int, presenter: bool = False) -> go.Figure:
    """Ch. 8: mean draft-side ms per step by phase for each policy | LM-head ms per step, full vs nanospec."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.1,
                        subplot_titles=("Draft-side time per step (mean over all prompts)",
                                        f"{prompt_id}: LM-head time per step"))
    keys = [k for k in ("full", "static", "nanospec", "hybrid") if (prompt_id, k) in lesson.runs]
    means = phase_means(lesson, keys)
    for phase in SYSTEM_PHASES:
        fig.add_trace(go.Bar(x=keys, y=[means[k][phase] for k in keys],
                             name=phase if phase != "vocab_update" else "vocab_update (set upkeep)",
                             marker_color=PHASE_COLORS[phase],
                             hovertemplate="%{x}: %{y:.2f} ms<extra>" + phase + "</extra>"), row=1, col=1)
    fig.update_yaxes(title_text="ms per decode step", row=1, col=1)
    for key, color in (("full", "#7f8c8d"), ("nanospec", "#e8743b")):
        if (prompt_id, key) not in lesson.runs:
            continue
        d = lesson.run(prompt_id, key).frame
        d = d[d["step"] > 0]
        fig.add_trace(go.Scatter(x=d["step"].tolist(), y=d["phase_lm_head"].tolist(), mode="lines+markers",
                                 name=f"{key}: lm_head", line=dict(color=color, width=2.5), marker=dict(size=5),
                                 hovertemplate="step %{x}: %{y:.2f} ms<extra>" + key + "</extra>"), row=1, col=2)
    fig.update_xaxes(title_text="decode step", row=1, col=2)
    fig.update_yaxes(title_text="ms (log scale)", type="log", dtick=1, row=1, col=2)
    fig.update_layout(**base_layout("The system side: where draft time goes, before (full) and after (nanospec)",
                                    presenter, 440), barmode="stack")
    return mark_step(fig, step, xref="x2") if step > 0 else fig


def try_figure(lesson: Lesson, prompt_id: str, presenter: bool = False) -> go.Figure:
    """Ch. 9: the recorded runs side by side (app/charts.compare_figure)."""
    fig = compare_figure(summary_table(lesson, prompt_id))
    fig.update_layout(height=380, title_text=f"{prompt_id}: every recorded run, same prompt, same machine",
                      margin=dict(t=90))
    return presentable(fig, presenter)


# -- the token view under each chart -----------------------------------------------------------
def token_view(run: LessonRun, step: int, colors: list[str] | None = None, legend: dict[str, str] | None = None,
               title: str = "The answer so far") -> str:
    """The run's output as coloured token chips; tokens of `step` outlined, later tokens faded."""
    chips = []
    for piece, tok_step, color in zip(run.pieces, run.token_steps, colors or ["#3b6fd8"] * len(run.pieces)):
        if not piece:
            continue
        text = html.escape(piece).replace("\n", "⏎<br>")
        cls = "now" if tok_step == step else ("later" if tok_step > step else "done")
        chips.append(f"<span class='tok {cls}' style='--c:{color}' title='step {tok_step}'>{text}</span>")
    keys = "".join(f"<span class='key' style='--c:{c}'>{html.escape(k)}</span>" for k, c in (legend or {}).items())
    return (f"<div class='lesson-tokens'><div class='tokens-head'><b>{html.escape(title)}</b> · "
            f"outlined = written at step {step}, faded = not written yet {keys}</div><div class='tokens-body'>"
            + "".join(chips) + "</div></div>")


def origin_view(run: LessonRun, step: int) -> str:
    origins = token_origins(run.frame)
    return token_view(run, step, [ORIGIN_COLORS[o] for o in origins],
                      {ACCEPTED: ORIGIN_COLORS[ACCEPTED], BONUS: ORIGIN_COLORS[BONUS],
                       VOCAB_MISS: ORIGIN_COLORS[VOCAB_MISS]})


def locality_view(run: LessonRun, step: int) -> str:
    return token_view(run, step, [SEEN[k][1] for k in run_locality(run)], {v[0]: v[1] for v in SEEN.values()},
                      "Each token coloured by where it was seen before")


# -- chapters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chapter:
    number: int
    title: str
    run: str     # the recorded run the step controls walk through
    idea: str    # a few plain sentences, one idea
    live: dict   # settings for "Try it live" (names match the app's controls)


_TREE = {k: DEFAULTS[k] for k in ("depth", "top_k", "total_tokens")}  # the engine's default tree
CHAPTERS = (
    Chapter(1, "Autoregressive decoding", "ar",
            "A language model writes **one token at a time**. For each token the big **target** model runs one "
            "full forward pass (earlier tokens are cached) and picks its most likely next token. So there are as "
            "many target forwards as tokens, and every forward costs about the same: the speed limit is **one "
            "token per forward**.",
            {"method": "ar", **_TREE}),
    Chapter(2, "Draft and verify", "greedy",
            "A small, cheap **drafter** guesses the next few tokens as a chain. The target then checks all guesses "
            "**in a single forward**: it keeps the longest prefix that matches what it would have written itself "
            "(**accepted**, green) and adds one token of its own after it (the **bonus** token, blue). Every kept "
            "token is exactly the target's own choice, so the text is **identical** to plain decoding (lossless) — "
            "only fewer forwards are needed.",
            {"method": "full", "depth": 5, "top_k": 1, "total_tokens": 6}),
    Chapter(3, "Draft trees", "full",
            "A chain is lost at its first wrong guess. A **draft tree** keeps several candidates at every level "
            f"(here the best {_TREE['top_k']} per level, {_TREE['depth']} levels, {_TREE['total_tokens'] - 1} drafted "
            "tokens) and the target verifies the **whole tree in "
            "one forward**: an attention mask lets each node see only its own ancestors. The longest branch the "
            "target agrees with is accepted (green path), so more tokens survive per forward.",
            {"method": "full", **_TREE}),
    Chapter(4, "The vocabulary bottleneck", "full",
            "To score its guesses the drafter multiplies its output by the **LM head**: one row for **every** "
            "token of the vocabulary (V = 49,152 here). That one matmul is a large share of the drafter's time, "
            "and it grows in step with V — and modern tokenizers have 128k to 256k tokens.",
            {"method": "full", **_TREE}),
    Chapter(5, "Temporal locality", "ar",
            "The tokens a model writes are **rarely new**. Most already appeared in the prompt or earlier in the "
            "answer, or were among the target's own **top-3 guesses** at an earlier position. So the drafter "
            "does not need the whole vocabulary: the recent context already holds the likely candidates.",
            {"method": "nanospec", **_TREE}),
    Chapter(6, "NanoSpec's active vocabulary", "nanospec",
            "NanoSpec lets the drafter score only an **active set** of tokens. At prefill (**Ctx**) it adds every "
            "prompt token plus the target's top-3 guesses at every prompt position. After each verification "
            "(**Ext**) it adds every token of the draft tree plus the target's top-3 at every tree node. The set "
            f"only grows during a request (up to a capacity of {DEFAULTS['capacity']:,}, oldest out first) and starts "
            "fresh for the "
            "next request.",
            {"method": "nanospec", **_TREE}),
    Chapter(7, "Coverage misses", "nanospec",
            "If the token the target wants is **not** in the active set, the drafter cannot propose it: a **vocab "
            "miss** (red). The target still verifies over the full vocabulary, so it simply writes that token as "
            "the bonus — the output stays **exact**; we only lose the tokens that could have been accepted after "
            "it (a lower τ). A **draft miss** (yellow) is different: the token was in the set, the drafter just "
            "ranked it too low — that also happens with the full vocabulary.",
            {"method": "nanospec", **_TREE}),
    Chapter(8, "The system side", "nanospec",
            "Scoring fewer rows helps only if keeping the set up to date is cheap. NanoSpec keeps the active LM-head "
            "rows in **one contiguous buffer** and copies in **only the new rows** each step. On a GPU that copy runs "
            "on a **side stream**, overlapping the draft layer, and the membership mask and id buffer **stay on "
            "the device**, so the loop never waits for the CPU.",
            {"method": "nanospec", **_TREE}),
    Chapter(9, "Try it", "nanospec",
            "Now run it yourself. **Try it live** opens the Live tab with this chapter's prompt and NanoSpec's "
            "settings. Switch the method to `full` or `ar` and compare: every method writes the **same text**; "
            "they differ in how many target forwards and how much draft time it takes.",
            {"method": "nanospec", **_TREE}),
)


def chapter(number: int) -> Chapter:
    if not isinstance(number, int) or not 1 <= number <= len(CHAPTERS):
        raise ValueError(f"chapter must be an integer in [1, {len(CHAPTERS)}]; got {number!r}")
    return CHAPTERS[number - 1]


def provenance(lesson: Lesson, prompt_id: str, run_key: str) -> str:
    """The line every chapter ends with: the trace is real, which pair, machine and command made it."""
    pair, machine = lesson.info.get("pair") or {}, lesson.info.get("machine") or {}
    head = "the project's shipped draft head" if pair.get("head_kind") == "shipped" else f"head `{pair.get('head')}`"
    warn = ("\n\n> ⚠️ **Development traces:** recorded with an untrained random head, so τ is about 1. "
            f"Re-record with `{COMMAND}` once the shipped head exists.") if pair.get("head_kind") == "random" else ""
    return (f"<div class='provenance'><b>Real recorded trace</b> — run <code>{RUN_LABELS.get(run_key, run_key)}"
            f"</code> on prompt <code>{prompt_id}</code>: {html.escape(str(pair.get('target')))} + {head}, "
            f"{pair.get('device')} {pair.get('dtype')}, greedy, recorded {lesson.info.get('recorded_at')} on "
            f"{html.escape(str(machine.get('text')))} by <code>{html.escape(str(lesson.info.get('command')))}</code>. "
            f"No model runs on this page.</div>{warn}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _q(run: LessonRun, token_id: int) -> str:
    return f"«{html.escape(token_label(token_id, run.token_text))}»"


def _ar_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "ar")
    e = run.event(step)
    if e.step == 0:
        return (f"**Step 0 (prefill):** the target reads the whole prompt ({len(run.meta['prompt_ids'])} tokens) "
                f"in one forward ({e.wall_ms:.0f} ms) and writes its first token {_q(run, e.bonus_token)}.")
    return (f"**Step {e.step}:** the target reads {_q(run, e.root_token)} and writes {_q(run, e.bonus_token)} in "
            f"{e.wall_ms:.1f} ms. So far: **{run.tokens_through(e.step)} tokens, {e.step + 1} forwards**. The whole "
            f"answer took {run.summary.steps + 1} forwards for {run.summary.new_tokens} tokens "
            f"({run.summary.tokens_per_s:.1f} tokens/s).")


def _chain_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "greedy")
    e = run.event(step)
    same = run.meta.get("identical_to_first")
    tail = (f" Lossless check: the full answer is **{'identical ✓' if same else 'DIFFERENT ✗'}** to plain "
            f"autoregressive decoding, in {run.summary.steps} forwards instead of "
            f"{lesson.run(pid, 'ar').summary.steps}.")
    if e.step == 0:
        return ("**Step 0 (prefill):** the target reads the prompt and writes the first token; drafting starts "
                "at step 1." + tail)
    n = len(e.accepted_tokens)
    drafted = " ".join(_q(run, t) for t in e.tree_tokens[1:])
    return (f"**Step {e.step}:** the drafter guessed {drafted}. The target agreed with the first **{n}**, then "
            f"wrote its own bonus {_q(run, e.bonus_token)}: **{_n(n + 1, 'token')} from one forward**." + tail)


def _tree_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "full")
    e = run.event(step)
    chain = lesson.run(pid, "greedy").summary.tau if (pid, "greedy") in lesson.runs else math.nan
    tail = f" Over the whole answer τ = **{run.summary.tau:.2f}** with the tree vs {chain:.2f} with the chain."
    if e.step == 0:
        return "**Step 0 (prefill):** no tree yet; drag the step slider or press Step ▶." + tail
    path = " → ".join(_q(run, t) for t in e.accepted_tokens) or "nothing"
    return (f"**Step {e.step}:** {len(e.tree_tokens) - 1} drafted tokens, verified together. Accepted path: "
            f"{path}, then the bonus {_q(run, e.bonus_token)} — **{_n(len(e.tokens), 'token')}** this "
            "forward." + tail)


def _bottleneck_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "full")
    e = run.event(step)
    share = lm_head_share(run)
    text = (f"In this trace the LM head took **{share:.0%} of the drafter's time** (measured by the engine's phase "
            f"timer on this recording, not quoted from a paper).")
    if e.step > 0 and e.draft_ms > 0:
        text += (f" **Step {e.step}:** draft {e.draft_ms:.1f} ms, of which LM head "
                 f"{e.phases.get('lm_head', 0):.1f} ms over {e.active_size:,} rows.")
    if lesson.sweep:
        pts = {p["vocab"]: p["ms"] for p in lesson.sweep["points"] if p["rows"] == 6}
        if 32000 in pts and 256000 in pts:
            text += (f" Right: the same matmul for other vocabularies — {pts[32000]:.2f} ms at 32k vs "
                     f"**{pts[256000]:.2f} ms at 256k** ({pts[256000] / pts[32000]:.1f}×), on "
                     f"{html.escape(lesson.sweep['machine']['text'])}.")
    return text


def _locality_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "ar")
    kinds = run_locality(run)
    n = len(kinds)
    shares = {k: sum(x == k for x in kinds) / max(1, n) for k in SEEN}
    text = (f"On this prompt **{1 - shares['new']:.0%} of the {n} written tokens were seen before**: "
            f"{shares['prompt']:.0%} in the prompt, {shares['output']:.0%} earlier in the answer, "
            f"{shares['top3']:.0%} among the target's earlier top-3 guesses; only {shares['new']:.0%} were new.")
    e = run.event(step)
    if e.tokens:
        j = run.tokens_through(e.step) - 1
        text += f" **Token {j + 1}** {_q(run, e.tokens[-1])}: {SEEN[kinds[j]][0]}."
    return text


def _active_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "nanospec")
    ctx = ctx_breakdown(run)
    e = run.event(step)
    text = (f"**Ctx** at prefill: {ctx['unique_prompt']} distinct prompt tokens + {ctx['from_top3']} more from the "
            f"target's top-3 guesses = **{run.events[0].active_size:,} ids**.")
    if e.step > 0:
        text += (f" **Step {e.step}:** the drafter scored **{e.active_size:,} rows = "
                 f"{e.active_size / e.vocab_size:.1%} "
                 f"of V** ({e.vocab_size:,}); **Ext** then added {e.added_ids} new ids.")
    text += (f" Final size {run.events[-1].active_size + run.events[-1].added_ids:,}; mean "
             f"{run.summary.mean_active:,.0f} = {run.summary.active_frac:.1%} of V.")
    return text


def _misses_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "nanospec")
    e = run.event(step)
    kind = {"none": "no miss — the whole accepted path ran to a leaf of the tree",
            "vocab": f"**vocab miss** — the target's token {_q(run, e.bonus_token)} was not in the active set",
            "draft": f"**draft miss** — {_q(run, e.bonus_token)} was in the set but ranked too low"}
    taus = " · ".join(f"{RUN_LABELS[k]} {lesson.run(pid, k).summary.tau:.2f}"
                      for k in ("full", "static", "nanospec", "hybrid") if (pid, k) in lesson.runs)
    same = all(lesson.run(pid, k).meta.get("identical_to_first") for k in lesson.keys(pid))
    text = f"**Step {e.step}:** {kind.get(e.miss_kind, e.miss_kind)}." if e.step else "**Step 0:** prefill."
    return (text + f" τ on this prompt: {taus}. Output of every method identical to `ar`: "
            f"**{'yes ✓' if same else 'NO ✗'}**.")


def _system_now(lesson, pid, step) -> str:
    run = lesson.run(pid, "nanospec")
    decode = run.frame[run.frame["step"] > 0]
    gathered = int(run.events[0].added_ids + decode["added_ids"].sum())
    regather = int(decode["active_size"].sum())
    full = lesson.run(pid, "full").summary if (pid, "full") in lesson.runs else None
    text = (f"Rows copied into the buffer over the whole answer: **{gathered:,}** (only new ones) instead of "
            f"{regather:,} if the active rows were gathered afresh each step.")
    if full:
        text += (f" Draft time per step: full {full.draft_ms_per_step:.1f} ms → nanospec "
                 f"**{run.summary.draft_ms_per_step:.1f} ms**.")
    e = run.event(step)
    if e.step > 0:
        text += (f" **Step {e.step}:** draft layers {e.phases.get('draft_layers', 0):.1f} ms, LM head "
                 f"{e.phases.get('lm_head', 0):.2f} ms over {e.active_size:,} rows, set upkeep "
                 f"{e.phases.get('vocab_update', 0):.2f} ms.")
    if str((lesson.info.get("pair") or {}).get("device", "cpu")).startswith("cpu"):
        text += (" *Recorded on a CPU: the gather runs synchronously there (no side stream), so the overlap "
                 "only shows on a GPU.*")
    return text


def _try_now(lesson, pid, step) -> str:
    c = chapter(9)
    prompt = " ".join(lesson.prompt(pid)["text"].split())
    cli = (f"python -m nanospec generate --method nanospec --depth {c.live['depth']} --top-k {c.live['top_k']} "
           f"--total-tokens {c.live['total_tokens']} --max-new-tokens "
           f"{(lesson.info.get('settings') or {}).get('max_new_tokens', 96)}")
    return (f"Prompt `{pid}`: *{html.escape(prompt[:160])}{'…' if len(prompt) > 160 else ''}*\n\n"
            f"On the command line: `{cli} \"…\"`. A live run on a CPU takes a few seconds (the model loads once).")


_NOW = {1: _ar_now, 2: _chain_now, 3: _tree_now, 4: _bottleneck_now, 5: _locality_now, 6: _active_now,
        7: _misses_now, 8: _system_now, 9: _try_now}


def chapter_text(lesson: Lesson, number: int, prompt_id: str, step: int) -> str:
    """Markdown: chapter heading, the idea, what the chart shows at this step, and where the trace came from."""
    c = chapter(number)
    return (f"## Chapter {c.number} · {c.title}\n\n{c.idea}\n\n{_NOW[number](lesson, prompt_id, step)}\n\n"
            + provenance(lesson, prompt_id, c.run))


def chapter_figure(lesson: Lesson, number: int, prompt_id: str, step: int, presenter: bool = False) -> go.Figure:
    c = chapter(number)
    run = lesson.run(prompt_id, c.run)
    builders = {
        1: lambda: ar_figure(run, step, presenter),
        2: lambda: chain_figure(run, step, presenter),
        3: lambda: tree_chapter_figure(run, step, presenter),
        4: lambda: bottleneck_figure(run, lesson.sweep, step, presenter),
        5: lambda: locality_figure(lesson, prompt_id, step, presenter),
        6: lambda: active_set_figure(run, step, presenter),
        7: lambda: misses_figure(run, step, presenter),
        8: lambda: system_figure(lesson, prompt_id, step, presenter),
        9: lambda: try_figure(lesson, prompt_id, presenter),
    }
    return builders[number]()


def chapter_tokens(lesson: Lesson, number: int, prompt_id: str, step: int) -> str:
    run = lesson.run(prompt_id, chapter(number).run)
    return locality_view(run, step) if number == 5 else origin_view(run, step)


def chapter_steps(lesson: Lesson, number: int, prompt_id: str) -> int:
    """The last step of the chapter's run (the step slider's maximum)."""
    return lesson.run(prompt_id, chapter(number).run).last_step


def start_step(lesson: Lesson, number: int, prompt_id: str) -> int:
    """A step worth opening a chapter on: a multi-token step, or a vocab miss in chapter 7."""
    run = lesson.run(prompt_id, chapter(number).run)
    decode = [e for e in run.events if e.step > 0]
    if not decode:
        return 0
    if number == 7:
        miss = next((e.step for e in decode if e.miss_kind == "vocab"), None)
        if miss is not None:
            return miss
    if number in (2, 3):
        best = max(decode[: max(1, len(decode) // 2)], key=lambda e: len(e.tokens))
        return best.step
    return 1 if number not in (5,) else min(run.last_step, 8)


def live_settings(lesson: Lesson, number: int, prompt_id: str) -> dict:
    """What "Try it live" puts into the app's controls: the chapter's prompt and decoding settings."""
    settings = (lesson.info.get("settings") or {})
    return {"prompt": lesson.prompt(prompt_id)["text"], "max_new_tokens": settings.get("max_new_tokens", 96),
            "temperature": 0.0, "top_p": 1.0, "seed": 0, "capacity": 3072, **chapter(number).live}
