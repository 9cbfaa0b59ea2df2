"""Wall time per decode step, stacked by phase (drafting, verification, bookkeeping)."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from nanospec.timing import PHASES

from app.charts.layout import HEIGHT, MODEBAR_PX, chart_layout, decode_rows, empty_spec, step_axis
from app.charts.words import PHASE_COLORS, PHASE_GROUPS, PHASE_NAMES, phase_name

def phase_spec(frame: pd.DataFrame) -> dict:
    """Wall time per decode step, stacked by phase (prefill excluded; its time is in the title)."""
    decode = decode_rows(frame)
    prefill_ms = float(frame.loc[frame["step"] == 0, "wall_ms"].sum())
    title = f"Time per decode step by phase (prefill {prefill_ms:.0f} ms not shown)"
    if decode.empty:
        return empty_spec(title, "no decode steps yet")
    steps = decode["step"].tolist()
    data = []
    # grouped (drafting, verification, bookkeeping: one hue family each), stacked in that order from the
    # bottom; a phase that took no time in this run (copy lookup without the copy chain, ...) is left out
    for group in PHASE_GROUPS:
        phases = [p for p in PHASES if (PHASE_NAMES[p].group if p in PHASE_NAMES else "bookkeeping") == group]
        shown = [p for p in phases if f"phase_{p}" in decode and float(decode[f"phase_{p}"].abs().sum()) > 0]
        for i, phase in enumerate(shown):
            about = PHASE_NAMES[phase].about if phase in PHASE_NAMES else phase
            data.append(dict(type="bar", x=steps, y=[float(v) for v in decode[f"phase_{phase}"]],
                             name=phase_name(phase), legendgroup=group, meta=phase,
                             legendgrouptitle=dict(text=f"<b>{group}</b>") if i == 0 else None,
                             marker=dict(color=PHASE_COLORS.get(phase, "#999")),
                             hovertemplate=f"<b>{html.escape(phase_name(phase))}</b> ({group})<br>"
                                           f"{html.escape(about)}<br>step %{{x}}: %{{y:.2f}} ms<extra></extra>"))
    for trace in data:
        if trace["legendgrouptitle"] is None:
            del trace["legendgrouptitle"]
    layout = chart_layout(title, barmode="stack", bargap=0.15, height=HEIGHT + 30, hovermode="closest",
                     margin=dict(l=60, r=20, t=MODEBAR_PX + 36, b=44),
                     legend=dict(orientation="v", x=0.78, xanchor="left", y=1.0, yanchor="top", font=dict(size=11),
                                 groupclick="toggleitem", tracegroupgap=6),
                     xaxis=step_axis(steps, "decode step", domain=[0, 0.74]), yaxis=dict(title=dict(text="ms")))
    return {"data": data, "layout": layout}



def phase_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(phase_spec(frame))
