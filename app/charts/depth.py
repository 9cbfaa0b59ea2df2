"""Acceptance by draft position: the share of decode steps that accepted at least d drafted tokens."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from nanospec import metrics

from app.charts.layout import MODEBAR_PX, chart_layout, decode_rows, empty_spec
from app.charts.words import ACCEPTED, ORIGIN_COLORS

def depth_spec(frame: pd.DataFrame) -> dict:
    """The run's acceptance rate by draft position: for each depth d, the share of decode steps that
    accepted at least d drafted tokens (`metrics.accepted_depth_counts`, entry d / entry 0; counts in
    the hover), with the share of steps whose verified tree reached depth d (a budget may stop short)."""
    title = ("Acceptance by draft position<br><span style='font-size:12px'>bar d: decode steps that accepted "
             "at least d drafted tokens</span>")
    decode = decode_rows(frame)
    if decode.empty:
        return empty_spec(title, "no decode steps yet")
    if (decode["method"] == "ar").all():
        return empty_spec(title, "no drafts in plain decoding (ar): every step emits the target's own token")
    accepted = [int(n) for n in decode["n_accepted"]]
    deepest = [max(depths) for depths in decode["tree_depths"]]
    counts = metrics.accepted_depth_counts(accepted, max_depth=max([*deepest, *accepted]))
    steps = counts[0]
    positions = list(range(1, len(counts)))
    if not positions:
        return empty_spec(title, "nothing drafted was verified yet: every step was a plain step")
    reached = [sum(d >= pos for d in deepest) for pos in positions]
    data = [
        dict(type="bar", x=positions, y=[100.0 * c / steps for c in counts[1:]], name="accepted at this position",
             marker=dict(color=ORIGIN_COLORS[ACCEPTED]), customdata=[[c, steps] for c in counts[1:]],
             text=[f"{100.0 * c / steps:.0f}%" for c in counts[1:]], textposition="outside", cliponaxis=False,
             hovertemplate="draft position %{x}: accepted in %{customdata[0]} of %{customdata[1]} decode steps "
                           "(%{y:.1f}%)<extra></extra>"),
        dict(type="scatter", x=positions, y=[100.0 * r / steps for r in reached], name="verified tree reached it",
             mode="lines+markers", line=dict(color="#3b6fd8", width=2, dash="dot"), marker=dict(size=7),
             customdata=[[r, steps] for r in reached],
             hovertemplate="draft position %{x}: verified in %{customdata[0]} of %{customdata[1]} decode steps "
                           "(%{y:.1f}%)<extra></extra>"),
    ]
    layout = chart_layout(title, bargap=0.3, margin=dict(l=60, r=20, t=MODEBAR_PX + 78, b=44),
                     xaxis=dict(title=dict(text="draft position (depth in the tree)"), tickmode="linear", tick0=1,
                                dtick=1, tickformat="d"),
                     yaxis=dict(title=dict(text="% of decode steps"), range=[0, 112], ticksuffix="%"))
    return {"data": data, "layout": layout}



def depth_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(depth_spec(frame))
