"""The shared Plotly layout of the live charts, as plain dicts (what the live run streams unvalidated), and
small helpers every chart uses: empty figures with a note, step axes, a second y axis, missing numbers."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

HEIGHT = 350
MODEBAR_PX = 30  # Plotly's toolbar (shown on hover) sits in the figure's top-right corner: titles start below it
LAYOUT = dict(template="plotly_white", height=HEIGHT, margin=dict(l=60, r=20, t=MODEBAR_PX + 48, b=44),
               legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, font=dict(size=11)),
               title=dict(font=dict(size=14), x=0, xanchor="left", y=1.0, yref="container", yanchor="top",
                          pad=dict(t=MODEBAR_PX)))


def decode_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["step"] > 0]


@functools.cache
def plotly_template() -> dict:
    """`plotly_white` expanded (plotly.js knows no template names), cut to the parts these charts use
    (2-D axes, bar and scatter): ~2 KB instead of ~7 KB in every streamed figure."""
    full = pio.templates["plotly_white"].to_plotly_json()
    keep = ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor", "plot_bgcolor",
            "xaxis", "yaxis", "shapedefaults", "annotationdefaults", "title")
    return {"layout": {k: full["layout"][k] for k in keep if k in full["layout"]},
            "data": {k: full["data"][k] for k in ("bar", "scatter") if k in full["data"]}}


def chart_layout(title: str, **extra) -> dict:
    """The shared layout of the live charts as a plain dict, with `extra` keys on top."""
    base = {k: v for k, v in LAYOUT.items() if k != "title"}
    return {**base, "template": plotly_template(), "title": {**LAYOUT["title"], "text": title}, **extra}


def right_axis(title: str, **extra) -> dict:
    return dict(title=dict(text=title), overlaying="y", side="right", anchor="x", showgrid=False, **extra)


def note(text: str, **font) -> dict:
    return dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(color="#777", **font))


def empty_spec(title: str, message: str) -> dict:
    return {"data": [], "layout": chart_layout(title, xaxis=dict(visible=False), yaxis=dict(visible=False),
                                          annotations=[note(message, size=13)])}


def empty_figure(title: str, message: str) -> go.Figure:
    return go.Figure(empty_spec(title, message))


def step_axis(steps: Sequence[int], title: str, **extra) -> dict:
    """An x axis of step numbers: integer ticks only (about ten at most), whatever the run's length."""
    span = (max(steps) - min(steps)) if len(steps) else 0
    dtick = max(1, math.ceil(span / 10))
    return dict(title=dict(text=title), tickmode="linear", tick0=0, dtick=dtick, tickformat="d", **extra)



def number(value) -> float | None:
    """A float, or None for a missing value (a frame holds NaN where an event held None)."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value

