"""Misses so far by kind (vocab or draft), against the running coverage."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from nanospec import metrics

from app.charts.layout import chart_layout, decode_rows, empty_spec, note, right_axis, step_axis

def _outside(frame: pd.DataFrame) -> list[int]:
    """Per step: accepted draft tokens that were outside the active set (`StepEvent.accepted_outside`)."""
    return [sum(not flags[i] for i in list(path)[1:] if i < len(flags))
            for path, flags in zip(frame["accepted_path"], frame["tree_in_active"])]


def running_coverage(frame: pd.DataFrame) -> list[float | None]:
    """Coverage % after each decode step (None until the first step with a drafter): `metrics.running_coverage`
    with the same inputs as the run's summary (`events.summarize`), so the last value is the KPI card's."""
    return [None if c is None else 100.0 * c
            for c in metrics.running_coverage(frame["n_accepted"], frame["coverage"], _outside(frame))]


MISS_TEXT = {"vocab": "vocab misses (the target's token was outside the active set)",
             "draft": "draft misses (in the set, but the drafter ranked it too low)"}


def coverage_spec(frame: pd.DataFrame) -> dict:
    """Misses so far by kind (vocab vs draft), against the running coverage %.

    Each step ends in at most one miss, so misses per step would be 0/1 bars; running counts show
    which kind dominates and when misses come (a steep stretch = many misses in a row)."""
    title = "Misses so far by kind, and running coverage"
    decode = decode_rows(frame)
    if decode.empty:
        return empty_spec(title, "no decode steps yet")
    steps = decode["step"].tolist()
    data = []
    for kind, name, color in (("vocab", "vocab misses", "#d64545"), ("draft", "draft misses", "#f2b134")):
        hit = (decode["miss_kind"] == kind).tolist()
        counts = (decode["miss_kind"] == kind).astype(int).cumsum().tolist()
        # a marker on each step that ended in a miss of this kind: a miss on the last step is a dot inside
        # the chart (the axis runs half a step past it), not a stub on its border
        data.append(dict(type="scatter", x=steps, y=counts, name=name, mode="lines+markers", legendgroup=kind,
                         line=dict(color=color, width=2, shape="hv"),
                         marker=dict(color=color, size=[8 if h else 0 for h in hit]),
                         hovertemplate="after step %{x}: %{y} " + MISS_TEXT[kind] + "<extra></extra>"))
    coverage = [c for c, step in zip(running_coverage(frame), frame["step"]) if step > 0]
    data.append(dict(type="scatter", x=steps, y=coverage, name="coverage %", mode="lines", yaxis="y2",
                     line=dict(color="#2e9d5b", width=2, dash="dot"),
                     hovertemplate="after step %{x}: coverage %{y:.1f}%<extra></extra>"))
    top = max(1, int((decode["miss_kind"] != "none").sum()))
    layout = chart_layout(title, xaxis=step_axis(steps, "decode step", domain=[0, 0.92],
                                            range=[min(steps) - 0.5, max(steps) + 0.5]),
                     yaxis=dict(title=dict(text="misses so far"), rangemode="tozero", range=[0, top * 1.1],
                                tickformat="d", dtick=max(1, math.ceil(top / 6))),
                     yaxis2=right_axis("coverage %", range=[0, 102]))
    if all(c is None for c in decode["coverage"]):
        layout["annotations"] = [note("autoregressive: nothing drafted, no misses")]
    return {"data": data, "layout": layout}



def coverage_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(coverage_spec(frame))
