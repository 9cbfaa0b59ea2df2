"""What every lesson figure is built with: text sizes (desk and presenter), the layout (title top left,
legend along the bottom), the current-step marker and token labels."""

from __future__ import annotations

import plotly.graph_objects as go

from app.charts import token_label
from app.lesson.data import LessonRun

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
    """A figure made by app/charts/, laid out for the lesson: title top left, legend along the bottom."""
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


def step_opacity(xs, current) -> list[float]:
    return [1.0 if x == current else 0.35 for x in xs]


def token_text(run: LessonRun, token_id: int, width: int = 12) -> str:
    return token_label(token_id, run.token_text)[:width]


def unique_labels(names: list[str]) -> list[str]:
    """Category names made unique (two tokens can print alike), keeping the first as it is."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else name + "\u200b" * (seen[name] - 1))
    return out
