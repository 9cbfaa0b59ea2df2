"""The lesson's chapter figures: pure functions `(lesson, run, step, size) -> go.Figure`.

`run` is the recorded run the chapter's step controls walk through; figures that compare runs
find the others through `lesson`. Built on app/charts/ where the Live tab has the same chart; the
shared helpers are in figure_kit.py, chapters 9 and 11 in budget_figure.py and sampling_figure.py.
"""

from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts import ACCEPTED, BONUS, ORIGIN_COLORS, PHASE_COLORS, coverage_figure, tree_figure, vocab_figure
from app.race import LANE_COLORS as RACE_COLORS
from app.lesson.data import COMMAND, SEEN, SYSTEM_PHASES, Lesson, LessonRun, lm_head_share, phase_means, run_locality, \
    summary_table
from app.lesson.figure_kit import (CURRENT, SHORT, SIZE, step_opacity, token_text, base_layout, fit_text, mark_step,  # noqa: F401
                                   presentable, text_size, title_size)
from app.lesson.budget_figure import budget_figure  # noqa: F401  (chapter 9)
from app.lesson.sampling_figure import sampling_figure  # noqa: F401  (chapter 11)

# -- chapter figures ---------------------------------------------------------------------------
def ar_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 1: one bar per target forward; the current one dark; tokens so far on a second axis."""
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    median = statistics.median(decode["wall_ms"]) if len(decode) else 0.0
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=steps, y=decode["wall_ms"].tolist(), name="one target forward (ms)",
                         marker_color="#3b6fd8", marker_opacity=step_opacity(steps, step),
                         hovertext=[f"step {s}: emitted «{token_text(run, t)}»"
                                    for s, t in zip(steps, decode["bonus_token"])],
                         hovertemplate="%{hovertext}<br>%{y:.1f} ms<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=steps, y=list(range(1, len(steps) + 1)), name="tokens written so far",
                             mode="lines", line=dict(color="#2e9d5b", width=3)), secondary_y=True)
    if step > 0:
        cur = decode[decode["step"] == step]
        fig.add_trace(go.Bar(x=cur["step"].tolist(), y=cur["wall_ms"].tolist(), name=f"step {step}",
                             marker_color=CURRENT, hoverinfo="skip"), secondary_y=False)
    fig.update_layout(**base_layout(f"Autoregressive: 1 token per target forward · median {median:.1f} ms "
                                    f"per forward", size), bargap=0.15, barmode="overlay")
    fig.update_xaxes(title_text="decode step = token number")
    fig.update_yaxes(title_text="ms per forward", secondary_y=False)
    fig.update_yaxes(title_text="tokens", showgrid=False, rangemode="tozero", secondary_y=True)
    return mark_step(fig, step) if step > 0 else fig


def chain_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 2: the drafted chain of one step against what the target says, and τ per step below."""
    e = run.event(step)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.58, 0.42], vertical_spacing=0.2,
                        subplot_titles=(f"Step {e.step}: drafter proposes a chain, target verifies it in one forward",
                                        "Tokens per target forward, every step (green = accepted, blue = bonus)"))
    n_acc = len(e.accepted_tokens)
    drafted = e.tree_tokens[1:]
    marker = round(size * 2.9)   # a square that holds a short token at the figure's text size
    # the root (last token written) on the left; drafted tokens at x = 1..k
    fig.add_trace(go.Scatter(x=[0], y=[0.5], mode="markers+text", text=[token_text(run, e.root_token, 9)],
                             textposition="middle center", marker=dict(symbol="square", size=marker, color="#e6e6e6",
                             line=dict(color="#555", width=1.5)), textfont=dict(size=size), name="last token",
                             hoverinfo="skip", showlegend=False), row=1, col=1)
    colors = ["#2e9d5b" if i < n_acc else ("#d64545" if i == n_acc else "#c8c8c8") for i in range(len(drafted))]
    words = ["accepted" if i < n_acc else ("first mismatch" if i == n_acc else "discarded")
             for i in range(len(drafted))]
    if drafted:
        fig.add_trace(go.Scatter(x=list(range(1, len(drafted) + 1)), y=[1] * len(drafted), mode="markers+text",
                                 text=[token_text(run, t, 9) for t in drafted], textposition="middle center",
                                 textfont=dict(size=size, color="white"), name="drafted",
                                 marker=dict(symbol="square", size=marker, color=colors), showlegend=False,
                                 hovertext=words, hoverinfo="text"), row=1, col=1)
    target_x = list(range(1, n_acc + 2))
    target_txt = ["✓"] * n_acc + [token_text(run, e.bonus_token, 9)]
    fig.add_trace(go.Scatter(x=target_x, y=[0] * len(target_x), mode="markers+text", text=target_txt,
                             textposition="middle center", textfont=dict(size=size, color="white"),
                             marker=dict(symbol="square", size=marker,
                                         color=["#2e9d5b"] * n_acc + [ORIGIN_COLORS[BONUS]]),
                             hovertext=["target agrees"] * n_acc + ["bonus token: the target's own choice"],
                             hoverinfo="text", showlegend=False), row=1, col=1)
    fig.update_yaxes(tickvals=[0, 1], ticktext=["target", "drafter"], range=[-0.6, 1.6], row=1, col=1)
    # positions are named on the ticks ("last token", +1, +2, ...), not in an axis title: a title there
    # would sit in the gap that holds the lower panel's title and collide with it on a short screen
    width = max(len(drafted), n_acc + 1)
    fig.update_xaxes(range=[-0.7, width + 0.7], tickvals=list(range(width + 1)),
                     ticktext=["last token", *(f"+{i}" for i in range(1, width + 1))], row=1, col=1)
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    for name, ys, color in (("accepted", decode["n_accepted"].tolist(), ORIGIN_COLORS[ACCEPTED]),
                            ("bonus", [1] * len(steps), ORIGIN_COLORS[BONUS])):
        fig.add_trace(go.Bar(x=steps, y=ys, name=name, marker_color=color, marker_opacity=step_opacity(steps, step),
                             showlegend=False, hovertemplate="step %{x}: %{y}<extra>" + name + "</extra>"),
                      row=2, col=1)
    fig.update_layout(**base_layout(f"Draft and verify (greedy chain) · τ = {run.summary.tau:.2f} tokens per "
                                    "target forward", size, 520), barmode="stack", bargap=0.15)
    fig.update_xaxes(title_text="decode step", row=2, col=1)
    fig.update_yaxes(title_text="tokens", row=2, col=1)
    fig.update_annotations(font_size=size)
    return mark_step(fig, step, xref="x2") if step > 0 else fig


def tree_chapter_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 3: the EAGLE-2 tree of the current step, accepted path in green (app/charts.tree_figure)."""
    fig = tree_figure(run.frame, step, run.token_text)
    fig.update_layout(title_text=fig.layout.title.text + f" · τ over the run = {run.summary.tau:.2f}")
    return presentable(fig, size)


def bottleneck_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 4: draft time per step split by phase (full vocabulary) | LM-head time vs vocabulary size, one
    horizontal bar per vocabulary (names on the axis never collide, whatever the width)."""
    share, sweep = lm_head_share(run), lesson.sweep
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.2,
                        subplot_titles=("Draft ms per step, by phase", "LM-head ms vs vocabulary size"))
    decode = run.frame[run.frame["step"] > 0]
    steps = decode["step"].tolist()
    for phase in ("draft_layers", "lm_head", "topk", "gather_wait"):
        fig.add_trace(go.Bar(x=steps, y=decode[f"phase_{phase}"].tolist(), name=phase,
                             marker_color=PHASE_COLORS[phase], marker_opacity=step_opacity(steps, step),
                             hovertemplate="step %{x}: %{y:.2f} ms<extra>" + phase + "</extra>"), row=1, col=1)
    fig.update_xaxes(title_text="decode step", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    if sweep:
        pts = [p for p in sweep["points"] if p["rows"] == 6]
        labels = [f"{SHORT.get(p['vocab'], p['label'])} {p['vocab'] / 1000:.0f}k" for p in pts]
        colors = ["#2e9d5b" if p["vocab"] < 10_000 else ("#e8743b" if p["vocab"] == run.summary.vocab_size
                                                         else "#7f8c8d") for p in pts]
        top = max(p["ms"] for p in pts)
        where = f"median of {sweep['repeats']}, 6 rows, hidden {sweep.get('hidden', 576)}, {sweep['machine']['text']}"
        fig.add_trace(go.Bar(y=labels, x=[p["ms"] for p in pts], orientation="h", marker_color=colors,
                             showlegend=False, text=[f"{p['ms']:.1f}" for p in pts], textposition="outside",
                             cliponaxis=False, hovertemplate="%{y}: %{x:.3f} ms<extra>" + where + "</extra>"),
                      row=1, col=2)
        fig.update_xaxes(title_text="ms per matmul", range=[0, top * 1.35], row=1, col=2)
        fig.update_yaxes(autorange="reversed", row=1, col=2)
    else:
        fig.add_annotation(text=f"sweep not recorded: run `{COMMAND}`", xref="x2 domain", yref="y2 domain",
                           x=0.5, y=0.5, showarrow=False)
    fig.update_layout(**base_layout(f"The vocabulary bottleneck: the LM head is {share:.0%} of draft time",
                                    size, 460), barmode="stack", bargap=0.15)
    return mark_step(fig, step) if step > 0 else fig


def locality_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 5: running share of 'seen before' tokens for this prompt | the split for every prompt."""
    prompt_id = run.prompt_id
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
                                    size, 440), barmode="stack")
    token_no = run.tokens_through(step)
    return mark_step(fig, token_no, f"token {token_no}") if token_no > 0 else fig


def active_set_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 6: active-set size per step against V and the capacity (app/charts.vocab_figure)."""
    fig = vocab_figure(run.frame)
    cap = run.meta["config"]["vocab"]["capacity"]
    fig.add_shape(type="line", x0=0, x1=1, xref="x domain", y0=cap, y1=cap, yref="y",
                  line=dict(color="#2e9d5b", dash="dot"))
    fig.add_annotation(x=0.99, xref="x domain", y=math.log10(cap), yref="y", text=f"capacity {cap:,}",
                       showarrow=False, xanchor="right", yanchor="bottom", font=dict(color="#2e9d5b"))
    fig.update_layout(height=420, title_text=f"NanoSpec's active set: {run.summary.mean_active:,.0f} rows on "
                      f"average = {run.summary.active_frac:.1%} of V")
    return mark_step(presentable(fig, size), step)


def misses_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 7: vocab vs draft misses per step and running coverage (app/charts.coverage_figure)."""
    fig = coverage_figure(run.frame)
    counts = run.summary.miss_counts
    fig.update_layout(height=420, title_text=f"Misses: {counts.get('vocab', 0)} vocab, {counts.get('draft', 0)} "
                      f"draft in {run.summary.steps} steps · coverage {run.summary.coverage or 0:.1%}")
    fig = presentable(fig, size)
    return mark_step(fig, step) if step > 0 else fig


def system_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 8: mean draft-side ms per step by phase for each policy | LM-head ms per step, full vs nanospec."""
    prompt_id = run.prompt_id
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
                                    size, 440), barmode="stack")
    return mark_step(fig, step, xref="x2") if step > 0 else fig


TRY_METRICS = (("tokens_per_s", "tokens/s", "{:.1f}"), ("speedup", "speedup vs ar", "{:.2f}×"), ("tau", "τ", "{:.2f}"),
               ("draft_ms_per_step", "draft ms/step", "{:.1f}"))


def try_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 10: the recorded runs side by side: one panel per metric, one horizontal bar per run (`ar` grey),
    the value written at the end of each bar."""
    table = summary_table(lesson, run.prompt_id)
    fig = make_subplots(rows=1, cols=len(TRY_METRICS), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[label for _, label, _ in TRY_METRICS])
    methods = table["method"].tolist()
    colors = ["#7f8c8d" if m == "ar" else "#3b6fd8" for m in methods]
    for col, (key, label, fmt) in enumerate(TRY_METRICS, start=1):
        values = [float(v) for v in table[key]]
        fig.add_trace(go.Bar(y=methods, x=values, orientation="h", marker_color=colors, showlegend=False,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate="%{y}: %{x:.3g}<extra>" + label + "</extra>"), row=1, col=col)
        fig.update_xaxes(range=[0, max([1e-9, *values]) * 1.7], showticklabels=False, row=1, col=col)
    fig.add_vline(x=1.0, line=dict(color="#555", dash="dash"), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(**base_layout(f"{run.prompt_id}: every recorded run, same prompt, same machine", size, 380),
                      bargap=0.25)
    fig.update_layout(margin_b=size)   # no legend: the bars are named on the left
    return fig


def predict_figure(size: int = SIZE, height: int | None = None) -> go.Figure:
    """The chart's place while the chapter's question is open: nothing to peek at yet."""
    fig = go.Figure()
    fig.add_annotation(text="Predict first<br><span style='font-size:0.7em'>answer the question on the left: "
                       "the chart from the recorded run appears here</span>", x=0.5, y=0.5, xref="paper",
                       yref="paper", showarrow=False, font=dict(size=round(size * 1.6), color="#e8743b"))
    fig.update_layout(template="plotly_white", height=height or 420, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig


# -- the race (chapter 12) --------------------------------------------------------------------------
RACE_RUNS = ("ar", "full", "nanospec")


def race_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 12: tokens written against recorded time for each run of the race; the dotted line is
    where the stepped run (nanospec) is at this step."""
    fig = go.Figure()
    for key in RACE_RUNS:
        if (run.prompt_id, key) not in lesson.runs:
            continue
        r = lesson.run(run.prompt_id, key)
        t = [0.0]
        for e in r.events:
            t.append(t[-1] + e.wall_ms)
        n = [0] + [r.tokens_through(e.step) for e in r.events]
        fig.add_trace(go.Scatter(x=[x / 1000 for x in t], y=n, mode="lines", line_shape="hv", name=key,
                                 line=dict(width=3, color=RACE_COLORS.get(key)),
                                 hovertemplate="%{x:.2f} s: %{y} tokens<extra>" + key + "</extra>"))
    now = sum(e.wall_ms for e in run.events[: step + 1]) / 1000
    fig.update_layout(**base_layout("Tokens written over recorded time (steps are the jumps)", size, 420))
    fig.update_xaxes(title_text="seconds since the request (recorded)")
    fig.update_yaxes(title_text="tokens written", rangemode="tozero")
    return mark_step(fig, now, f"{run.key} step {step}")
