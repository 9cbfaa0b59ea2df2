"""The Compare tab's chart: one bar panel per metric, one bar per method."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.layout import LAYOUT, empty_figure

COMPARE_METRICS = (("tokens_per_s", "tokens/s", "{:.1f}"), ("speedup", "speedup over ar", "{:.2f}×"),
                   ("tau", "τ", "{:.2f}"), ("draft_ms_per_step", "draft ms / step", "{:.1f}"))


def compare_figure(table: pd.DataFrame) -> go.Figure:
    """One bar panel per metric (`COMPARE_METRICS`), one bar per method; `ar` in grey, an outside engine's rows
    (`vllm:…`) in orange."""
    if table.empty:
        return empty_figure("Compare", "no runs yet")
    fig = make_subplots(rows=1, cols=len(COMPARE_METRICS), subplot_titles=[m[1] for m in COMPARE_METRICS],
                        horizontal_spacing=0.07)
    colors = ["#7f8c8d" if m == "ar" else "#e08e2b" if ":" in m else "#3b6fd8" for m in table["method"]]
    for col, (key, label, fmt) in enumerate(COMPARE_METRICS, start=1):
        values = [float(v) for v in table[key]]
        fig.add_trace(go.Bar(x=table["method"].tolist(), y=values, name=label, marker_color=colors,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate="%{x}: %{y:.3g}<extra>" + label + "</extra>"), row=1, col=col)
        fig.update_yaxes(range=[0, max([1e-9, *values]) * 1.25], row=1, col=col)
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), row=1, col=2)
    fig.update_layout(**LAYOUT, showlegend=False)
    fig.update_layout(margin=dict(l=40, r=20, t=40, b=40))
    return fig
