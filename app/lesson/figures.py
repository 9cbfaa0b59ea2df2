"""The lesson's chapter figures: pure functions `(lesson, run, step, size) -> go.Figure`.

`run` is the recorded run the chapter's step controls walk through; figures that compare runs
find the others through `lesson`. Built on app/charts.py where the Live tab has the same chart.
"""

from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts import (ACCEPTED, BONUS, ORIGIN_COLORS, PHASE_COLORS, compare_figure, coverage_figure, token_label,
                      tree_figure, vocab_figure)
from app.race import LANE_COLORS as RACE_COLORS
from app.lesson.data import COMMAND, SEEN, SYSTEM_PHASES, Lesson, LessonRun, budget_curve, budget_step, lm_head_share, \
    phase_means, run_locality, summary_table

CURRENT = "#111111"
SHORT = {3072: "NanoSpec", 32000: "Llama-2", 49152: "SmolLM2", 128256: "Llama-3", 151936: "Qwen", 256000: "Gemma"}


# -- figure helpers ----------------------------------------------------------------------------
SIZE = 13                  # px: tick labels, axis titles, legends, bar labels on a desk screen
PRESENTER_SIZE = 18        # px in presenter mode when the page height is unknown
PRESENTER_SIZE_VH = 0.0175 # presenter mode: text grows with the page height (19 px at 1080 px, 14 at 720 px)
PRESENTER_SIZES = (14, 26)


def text_size(presenter: bool, screen: int | None = None) -> int:
    """The figures' text size in px: `SIZE` on a desk; in presenter mode a share of the page height
    `screen` (px, the height the lesson fills), so a projector's 1080 px get ~19 px and 720 px get 14."""
    if not presenter:
        return SIZE
    if not screen:
        return PRESENTER_SIZE
    lo, hi = PRESENTER_SIZES
    return int(min(max(round(screen * PRESENTER_SIZE_VH), lo), hi))


def title_size(size: int) -> int:
    return round(size * 1.25)


def base_layout(title: str, size: int = SIZE, height: int = 420) -> dict:
    """Title top left, legend in one row along the bottom edge, margins that grow with the text."""
    return dict(template="plotly_white", height=int(height * (1.2 if size > SIZE else 1.0)),
                font=dict(size=size), margin=dict(l=8, r=16, t=round(size * 4.6), b=round(size * 3.2)),
                title=dict(text=title, font=dict(size=title_size(size)), x=0.01, xanchor="left", xref="container",
                           y=0.99, yanchor="top", yref="container"),
                legend=dict(orientation="h", yanchor="bottom", y=0.005, yref="container", x=0.01, xref="container",
                            xanchor="left", font=dict(size=size)))


def fit_text(fig: go.Figure, size: int) -> go.Figure:
    """Every text of a figure at `size` px (titles a little larger): layout font, title, legend, subplot
    titles and notes, axis titles, tick labels and the labels on bars, so that presenter mode reaches
    every word; axes grow the margins they need instead of cutting labels."""
    fig.update_layout(font_size=size, title_font_size=title_size(size), legend_font_size=size,
                      uniformtext=dict(minsize=size, mode="show"))
    fig.update_annotations(font_size=size)
    fig.update_xaxes(tickfont_size=size, title_font_size=size, automargin=True)
    fig.update_yaxes(tickfont_size=size, title_font_size=size, automargin=True, ticklabelstandoff=4)
    fig.update_traces(textfont_size=size, selector=dict(type="bar"))
    fig.update_traces(constraintext="none", selector=dict(type="bar", textposition="outside"))
    fig.update_traces(textfont_size=size, selector=dict(mode="markers+text"))
    return fig


def presentable(fig: go.Figure, size: int) -> go.Figure:
    """A figure made by app/charts.py, laid out for the lesson: title top left, legend along the bottom."""
    layout = base_layout(fig.layout.title.text or "", size, fig.layout.height or 400)
    fig.update_layout(title=layout["title"], legend=layout["legend"], margin=layout["margin"],
                      height=layout["height"])
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
def ar_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
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
                             marker_color=PHASE_COLORS[phase], marker_opacity=_opacity(steps, step),
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


KEPT, DROPPED, NEEDED = "#3b6fd8", "#c8c8c8", "#d64545"


def budget_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Ch. 9: every node the drafter drafted at this step, likeliest first, its calibrated chance p beside
    its price (the tokens its share of the forward's time would earn: a red tick; verified: blue, accepted:
    green, dropped: grey) | the target's measured cost curve with what this step verified and what
    verifying every drafted node would have cost."""
    bs, curve = budget_step(run, step), budget_curve(run)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.56, 0.44], horizontal_spacing=0.16,
                        subplot_titles=("Chance each drafted node is accepted, and its price",
                                        "Target forward time (measured)"))
    if curve is None:
        fig.add_annotation(text=f"no budgeted run recorded: run `{COMMAND}`", xref="paper", yref="paper", x=0.5,
                           y=0.5, showarrow=False)
        fig.add_trace(go.Scatter(x=[None], y=[None], showlegend=False))
        fig.update_layout(**base_layout("The draft budget", size, 440))
        return fig
    if bs is not None:
        labels = _labels([f"{_tok(run, n.token, 12)} · d{n.depth}" for n in bs.nodes])
        for word, color, pick in (("accepted", ORIGIN_COLORS[ACCEPTED], lambda n: n.kept and n.accepted),
                                  ("verified", KEPT, lambda n: n.kept and not n.accepted),
                                  ("dropped", DROPPED, lambda n: not n.kept)):
            rows = [(lab, n) for lab, n in zip(labels, bs.nodes) if pick(n)]
            fig.add_trace(go.Bar(y=[lab for lab, _ in rows], x=[n.p for _, n in rows], orientation="h", name=word,
                                 marker_color=color, text=[f"{n.p:.2f}" for _, n in rows], textposition="outside",
                                 cliponaxis=False, legendgroup=word,
                                 hovertemplate="%{y}: p = %{x:.3f}<extra>" + word + "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=bs.prices, y=labels, mode="markers", name="price (tokens its time would earn)",
                                 marker=dict(symbol="line-ns", size=18, line=dict(width=3, color=NEEDED), color=NEEDED),
                                 hovertemplate="%{y}: price %{x:.3f} tokens<extra>λ × its extra ms</extra>"),
                      row=1, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed", row=1, col=1)
        fig.update_xaxes(range=[0, 1.22], dtick=0.25, title_text="p (calibrated)", row=1, col=1)
    sizes, ms = curve.sizes, curve.ms
    fig.add_trace(go.Scatter(x=sizes, y=ms, mode="lines+markers", name="measured", showlegend=False,
                             line=dict(color="#7f8c8d", width=2.5), marker=dict(size=8),
                             hovertemplate="%{x} tokens: %{y:.1f} ms<extra>one target forward</extra>"),
                  row=1, col=2)
    if bs is not None:
        verified, drafted = len(bs.kept) + 1, len(bs.nodes) + 1
        # this step on the curve: what it verified (root included) and what verifying every drafted node costs;
        # the curve rises, so above-left and below-right of a point are free for its label
        marks = [(verified, "this step", "circle", "bottom right")]
        if drafted > verified:
            marks.insert(0, (drafted, "all drafted", "circle-open", "top left"))
        for n, word, symbol, where in marks:
            fig.add_trace(go.Scatter(x=[n], y=[curve.ms_at(n)], mode="markers+text", showlegend=False,
                                     text=[f"{word} ({n})"], textposition=where, textfont=dict(color=KEPT),
                                     cliponaxis=False,
                                     marker=dict(size=16, symbol=symbol, color=KEPT, line=dict(width=3, color=KEPT)),
                                     hovertemplate=f"{word}: %{{x}} tokens, %{{y:.1f}} ms<extra></extra>"),
                          row=1, col=2)
    # room on the right for a label below-right of this step's point
    fig.update_xaxes(title_text="tokens verified", tickangle=0, range=[0, sizes[-1] * 1.35], row=1, col=2)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
    title = (f"Step {bs.step}: verified {len(bs.kept)} of {len(bs.nodes)} drafted nodes, expected "
             f"{bs.expected:.2f} tokens" if bs is not None else "The draft budget: prefill has no draft")
    fig.update_layout(**base_layout(title, size, 440), barmode="overlay", bargap=0.25)
    return fig


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


# -- sampling (chapter 11) -------------------------------------------------------------------------
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
    fig.add_trace(go.Bar(y=_labels([_tok(run, t, 10) for t, _ in top]), x=[p for _, p in top], orientation="h",
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


def _labels(names: list[str]) -> list[str]:
    """Category names made unique (two tokens can print alike), keeping the first as it is."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else name + "\u200b" * (seen[name] - 1))
    return out


def _check_title(check: dict | None) -> str:
    if not check:
        return "First speculative token over many runs"
    return f"{check['kept']} seeded runs vs the target"


def _check_bars(fig: go.Figure, check: dict, run: LessonRun) -> None:
    n = check["kept"]
    rows = check["tokens"][:TOP_TOKENS]
    text = {int(k): v for k, v in check.get("token_text", {}).items()}
    labels = _labels([token_label(r["token"], text)[:10] for r in rows])
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
