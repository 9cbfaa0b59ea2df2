"""Chapter 9's figure: what the draft budget decided at one step, beside the measured cost curve."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts import ACCEPTED, ORIGIN_COLORS
from app.lesson.data import COMMAND, Lesson, LessonRun, budget_curve, budget_step
from app.lesson.figure_kit import SIZE, unique_labels, token_text, base_layout

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
        labels = unique_labels([f"{token_text(run, n.token, 12)} · d{n.depth}" for n in bs.nodes])
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
