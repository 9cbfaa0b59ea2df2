"""Live's break-even KPI: above which τ speculation pays on this machine, from the pair's cost curve and the
run's own drafting and bookkeeping, and the τ card coloured against it (no model, no browser)."""

from __future__ import annotations

import math

import pytest

from app import charts
from app.charts.kpis import CLOSE_TO_IT, LOSES, PAYS
from nanospec import metrics
from nanospec.events import StepEvent, summarize
from tests.test_app_charts import make_events

# a plain (one-token) forward 10 ms, 4 tokens 13 ms
CURVE = {"sizes": [1, 2, 4, 8], "ms": [10.0, 11.0, 13.0, 17.0], "key": {"device": "cpu:cpu"},
         "per_token_ms": 1.0, "text": "target forward ms by verified tokens"}


def test_break_even_prices_the_runs_mean_tree_on_the_curve_plus_its_drafting_and_bookkeeping():
    found = charts.break_even(make_events(), CURVE)
    # steps 1 and 2 verify 5 and 3 tokens (root included): 4 on average, 13 ms on the curve; drafting
    # (draft layers, LM head, top-k) 5.5 and 4 ms, bookkeeping (accept) 1 and 0 ms; a plain step 10 ms
    assert (found.verified, found.verify_ms, found.plain_ms) == (4.0, 13.0, 10.0)
    assert (found.draft_ms, found.other_ms) == (4.75, 0.5)
    assert found.tau == pytest.approx(metrics.break_even_tau(10.0, 13.0, 4.75, 0.5)) == pytest.approx(1.825)
    assert "1.82" in found.explain() and "13.0 ms" in found.explain()


def test_tau_card_is_green_above_break_even_amber_just_below_and_red_further_below():
    found = charts.break_even(make_events(), CURVE)
    assert found.colour(2.0) == PAYS
    assert found.colour(1.7) == CLOSE_TO_IT  # within 10% below: about a tie
    assert found.colour(1.2) == LOSES
    assert found.colour(math.nan) is None
    values = charts.kpi_from_summary(summarize(make_events(), "nanospec", 1.0, "eos"))  # τ 2.0
    shown = charts.kpi_html(values, found)
    assert "pays above τ = 1.82 here" in shown and "id='kpi-break-even'" in shown
    tau_card = shown[shown.index("id='kpi-tau'"):].split("</div></div>")[0]
    assert f"color:{PAYS}" in tau_card and "above the break-even τ 1.82" in tau_card
    slow = charts.kpi_html({**values, "tau": 1.2}, found)
    assert f"color:{LOSES}" in slow[slow.index("id='kpi-tau'"):].split("</div></div>")[0]


def test_without_a_cost_curve_the_kpi_says_why_instead_of_failing():
    events = make_events()
    for curve in (None, {}, {"sizes": [1], "ms": [3.0], "key": {}}, {"sizes": "x", "ms": [], "key": 1}, "junk"):
        found = charts.break_even(events, curve)
        assert found.tau is None and "no cost curve" in found.reason
        assert found.colour(2.0) is None
        shown = charts.kpi_html(charts.kpi_from_summary(summarize(events, "nanospec", 1.0, "eos")), found)
        assert "pays above τ = – here" in shown and "no cost curve" in shown and "color:" not in shown
    ar = [StepEvent(**{**e.to_dict(), "method": "ar"}) for e in events]
    assert "plain decoding" in charts.break_even(ar, CURVE).reason
    assert "no decode step" in charts.break_even(events[:1], CURVE).reason
    # without a break-even the row is what it was: no extra card, no colour
    assert "kpi-break-even" not in charts.kpi_html({"steps": 1, "tau": 1.0})


def test_live_prices_runs_without_the_budget_by_the_last_curve_the_pair_recorded():
    """Through the callbacks (tiny engine, a made-up curve): before any budgeted run there is no curve to price
    with ("–" and why); a budgeted run records one, and a later run of the same pair without the budget is
    priced by it."""
    from app.callbacks import LIVE_OUTPUTS
    from tests.test_app_budget import KNOBS, PROMPT, QUIET, budgeted_explorer

    explorer = budgeted_explorer()

    def kpis(budget: bool) -> str:
        return dict(zip(LIVE_OUTPUTS, list(explorer.run_live(PROMPT, **KNOBS, budget=budget, **QUIET))[-1]))["kpis"]

    assert "pays above τ = – here" in kpis(False) and "no cost curve" in kpis(False)
    for budget in (True, False):
        shown = kpis(budget)
        assert "id='kpi-break-even'" in shown and "pays above τ = –" not in shown, shown
        assert "color:#" in shown[shown.index("id='kpi-tau'"):].split("</div></div>")[0]
