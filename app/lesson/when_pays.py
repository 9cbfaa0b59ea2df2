"""Chapter "When does speculation pay?": figure, narration and question, all computed from the recording.

A speculative step writes τ tokens in the time of one verification forward plus drafting and bookkeeping;
plain decoding writes one token per plain step. So a method's speed-up is τ / c, where c is its step's
cost in plain steps, and it pays above the break-even τ = c (`nanospec.metrics.break_even_tau`). The
figure puts this machine's measured cost curve beside the plane of τ against c with iso-speed-up lines,
every recorded method on it, and the same methods under a flat cost curve (verification as cheap as one
plain forward, roughly a GPU's case), drawn hollow and labelled as a model.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nanospec import metrics

from app.lesson import questions as q
from app.lesson.data import RUN_LABELS, Lesson, LessonRun, budget_curve
from app.lesson.figure_kit import SIZE, base_layout
from app.lesson.verdicts import Pays, pays, verdict

METHODS = ("greedy", "full", "static", "nanospec", "hybrid", "budget")
ISO = (1.0, 1.5, 2.0)
COLORS = {"greedy": "#7f8c8d", "full": "#3b6fd8", "static": "#9b7fc7", "nanospec": "#e8743b", "hybrid": "#2e9d5b",
          "budget": "#d64545"}


def recorded(lesson: Lesson, prompt_id: str) -> list[Pays]:
    return [p for k in METHODS if (p := pays(lesson, prompt_id, k)) is not None]


def cost(p: Pays) -> float:
    """The step's cost in plain steps (= the break-even τ)."""
    return p.step_ms / p.plain_ms


def flat_cost(p: Pays) -> float:
    """The same step if verifying the tree cost one plain forward (a model: a flat cost curve)."""
    return metrics.speculative_step_ms(p.plain_ms, p.draft_ms, p.other_ms) / p.plain_ms


def when_pays_figure(lesson: Lesson, run: LessonRun, step: int, size: int = SIZE) -> go.Figure:
    """Measured cost curve | τ against the step's cost in plain steps, iso-speed-up lines, measured and flat."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.14,
                        subplot_titles=("Target forward ms (measured)", "τ against a step's cost"))
    curve = budget_curve(lesson.run(run.prompt_id, "budget")) if lesson.has(run.prompt_id, "budget") else None
    if curve is not None:
        fig.add_trace(go.Scatter(x=curve.sizes, y=curve.ms, mode="lines+markers", showlegend=False,
                                 line=dict(color="#7f8c8d", width=2.5),
                                 hovertemplate="%{x} tokens: %{y:.1f} ms<extra>measured</extra>"), row=1, col=1)
    fig.update_xaxes(title_text="tokens verified", row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    points = recorded(lesson, run.prompt_id)
    top_c = max([2.5, *(cost(p) * 1.15 for p in points)])
    top_t = max([3.0, *(p.tau * 1.15 for p in points)])
    for s in ISO:
        fig.add_trace(go.Scatter(x=[0.9, top_c], y=[s * 0.9, s * top_c], mode="lines", showlegend=False,
                                 line=dict(color="#999", dash="dot", width=1.5), hoverinfo="skip"), row=1, col=2)
        # named below its line, well inside the plane (the panel's title sits right above the plane's top)
        x_lab = min(top_c * 0.9, 0.75 * top_t / s)
        fig.add_annotation(x=x_lab, y=s * x_lab, text=f"{s:g}×", showarrow=False, xanchor="left",
                           yanchor="top", xref="x2", yref="y2", font=dict(color="#666"))
    fig.add_trace(go.Scatter(x=[cost(p) for p in points], y=[p.tau for p in points], mode="markers",
                             name="measured", marker=dict(size=13, color=[COLORS[p.key] for p in points]),
                             hovertext=[RUN_LABELS.get(p.key, p.key) for p in points],
                             hovertemplate="%{hovertext}: τ %{y:.2f}, step = %{x:.2f} plain steps<extra></extra>"),
                  row=1, col=2)
    fig.add_trace(go.Scatter(x=[flat_cost(p) for p in points], y=[p.tau for p in points], mode="markers",
                             name="flat cost curve (a model)",
                             marker=dict(size=13, symbol="circle-open", line=dict(width=2.5),
                                         color=[COLORS[p.key] for p in points]),
                             hovertext=[RUN_LABELS.get(p.key, p.key) for p in points],
                             hovertemplate="%{hovertext}: τ %{y:.2f}, step = %{x:.2f} plain steps<extra>model, not "
                                           "a measurement</extra>"), row=1, col=2)
    fig.update_xaxes(title_text="step cost (plain steps)", range=[0.9, top_c], row=1, col=2)
    fig.update_yaxes(title_text="τ", range=[0.9, top_t], row=1, col=2)
    fig.update_layout(**base_layout(f"{run.prompt_id}: speculation pays above the 1× line", size, 440))
    return fig


def when_pays_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    """Break-even τ per method, from its recorded step costs, and what a flat cost curve would change."""
    points = recorded(lesson, run.prompt_id)
    if not points:
        return "*This recording has no speculative runs to place.*"
    rows = "; ".join(f"`{RUN_LABELS.get(p.key, p.key)}` τ {p.tau:.2f} vs break-even {p.break_even:.2f} "
                     f"({p.speedup:.2f}× `ar`)" for p in points)
    full = next((p for p in points if p.key == "full"), points[0])
    flat = full.tau / flat_cost(full)
    return (f"Break-even τ on this machine, from each run's own step times: {rows}. A dot above the 1× line "
            f"pays. {verdict(full)} Under a flat cost curve (verifying the tree as cheap as one plain forward; "
            f"hollow dots: **a model, not a measurement**) the same τ would give `full` about {flat:.2f}×.")


def when_pays_question(lesson: Lesson, run: LessonRun) -> q.Question:
    """Will EAGLE-2's tree (`full`) beat plain decoding on this machine? Answered from the recording."""
    p = pays(lesson, run.prompt_id, "full")
    wins = bool(p and p.wins)
    # the reveal is HTML, not Markdown: the verdict's emphasis and code marks go
    why = verdict(p).replace("**", "").replace("`", "") if p else "This recording has no full run."
    return q.Question("Will EAGLE-2's tree beat plain decoding on this machine?",
                      ["yes, it is faster than plain decoding", "no, it is slower than plain decoding"],
                      0 if wins else 1, why, 1 if run.last_step >= 1 else 0)
