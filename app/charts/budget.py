"""What the cost-aware draft budget did: per step (the tree's title) and over the run (the line under the KPIs)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from app.charts.layout import number
from app.charts.words import plural
from app.templating import render


def is_budgeted(row: Mapping) -> bool:
    """The step ran under the cost-aware draft budget (`StepEvent.budget_threshold` is set; prefill,
    `ar` and runs without the budget leave it None)."""
    return number(row.get("budget_threshold")) is not None and (number(row.get("drafted_nodes")) or 0) > 0


def budget_line(row: Mapping) -> str | None:
    """What the draft budget did in one step (a frame row or `StepEvent.to_dict()`), or None for a step
    without it. Node counts leave out the root (the last emitted token, verified every step)."""
    if not is_budgeted(row):
        return None
    verified, drafted = len(row["tree_tokens"]) - 1, int(row["drafted_nodes"]) - 1
    if verified == 0:
        return "nothing drafted paid for its verification time: a plain step"
    expected = number(row.get("expected_tokens"))
    exp = f"; expected {expected:.2f} tokens" if expected is not None else ""
    return (f"verified the {verified} likeliest of {drafted} drafted nodes{exp}; more would have cost more time "
            "than they were likely to bring")


def budget_html(events: Sequence, curve: Mapping | None = None, replayed: bool = False) -> str:
    """The line under the KPIs of a run with the draft budget ("" for a run without it): the cost of one
    more verified token from the target's cost curve (`curve`: what the live run recorded from
    `SpecEngine.cost_curve()`, absent from CSV traces), and what the budget kept over the run."""
    steps = [e for e in events if e.step > 0 and e.budget_threshold is not None and e.drafted_nodes > 0]
    # a replayed trace's meta is whatever the file held: a curve without a number is left out
    curve = curve if isinstance(curve, Mapping) and number(curve.get("per_token_ms")) is not None else None
    if not steps and not curve:
        return ""
    parts = []
    if curve:
        key = curve.get("key") if isinstance(curve.get("key"), Mapping) else {}
        device = str(key.get("device", "")).split(":", 1)[-1] or "?"
        where = "the device that recorded this trace" if replayed else "this device"
        ms = number(curve["per_token_ms"])
        parts.append(render("budget_curve.html", about=html.escape(str(curve.get("text", "")), quote=True),
                            ms=f"{ms:.2f}", where=where, device=html.escape(device)))
    if steps:
        verified = sum(len(e.tree_tokens) - 1 for e in steps)
        drafted = sum(e.drafted_nodes - 1 for e in steps)
        plain = sum(len(e.tree_tokens) == 1 for e in steps)
        parts.append(f"verified {verified:,} of {plural(drafted, 'drafted node')} over {plural(len(steps), 'step')}, "
                     f"{plain} of them plain steps (nothing drafted paid for its verification time)")
    return render("budget_note.html", parts=" · ".join(parts))

