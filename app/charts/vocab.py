"""The active draft vocabulary per step against the full vocabulary, and the ids each step added."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from app.charts.layout import HEIGHT, chart_layout, decode_rows, empty_spec, note, step_axis

VOCAB_PANELS = ([0.42, 1.0], [0.0, 0.27])  # y domains: active set (log) on top, ids added below


def vocab_spec(frame: pd.DataFrame) -> dict:
    """Two panels on one step axis: the active vocabulary per step on a log axis against the full vocabulary
    V (top), and the ids added per decode step on their own linear axis (bottom), so neither is read on the
    other's scale. The prefill's count (the whole prompt's) is in the legend: as a bar it would dwarf the rest."""
    title = "Active draft vocabulary per step"
    if frame.empty:
        return empty_spec(title, "no steps yet")
    vocab = int(frame["vocab_size"].iloc[0])
    steps = frame["step"].tolist()
    active = [int(a) if a > 0 else None for a in frame["active_size"]]
    decode = decode_rows(frame)
    prefill_added = int(frame.loc[frame["step"] == 0, "added_ids"].sum())
    added_name = "ids added per step" + (f" (prefill: {prefill_added:,}, not drawn)" if prefill_added else "")
    data = [
        dict(type="scatter", x=steps, y=active, name="active set", mode="lines+markers",
             line=dict(color="#e8743b", width=2), marker=dict(size=5),
             hovertemplate="step %{x}<br>%{y:,} active rows<extra></extra>"),
        dict(type="scatter", x=steps, y=[vocab] * len(steps), name=f"full vocabulary V = {vocab:,}", mode="lines",
             line=dict(color="#555", dash="dash"), hoverinfo="skip"),
        dict(type="bar", x=decode["step"].tolist(), y=decode["added_ids"].tolist(), name=added_name, yaxis="y2",
             marker=dict(color="#9b7fc7"), hovertemplate="step %{x}<br>%{y:,} ids added<extra></extra>"),
    ]
    added_max = max([1, *decode["added_ids"].tolist()])
    known = [a for a in active if a] + [vocab]
    # the log axis spans the data with room above V's line, so the line never sits on the top tick
    log_range = [math.log10(max(1, min(known))) - 0.3, math.log10(vocab) + 0.35]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    layout = chart_layout(title, bargap=0.2, height=HEIGHT + 40,
                     xaxis=step_axis(steps, "step (0 = prefill)", anchor="y2", range=[lo - 0.5, hi + 0.5]),
                     yaxis=dict(type="log", dtick=1, domain=VOCAB_PANELS[0], range=log_range,
                                title=dict(text="rows scored (log)")),
                     yaxis2=dict(domain=VOCAB_PANELS[1], anchor="x", rangemode="tozero", range=[0, added_max * 1.15],
                                 tickformat="d", nticks=3, title=dict(text="ids added")))
    if all(a is None for a in active):
        layout["annotations"] = [note("autoregressive: no drafter, no active set")]
    return {"data": data, "layout": layout}



def vocab_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(vocab_spec(frame))
