"""The draft budget in the Live tab, through the callbacks with the tiny random engine (no server, no
browser): the checkbox's value reaches the engine, each step's tree says what the budget kept, the KPIs
show the cost curve once, the acceptance-by-position chart is drawn, and a saved trace replays the same."""

from __future__ import annotations

import json

from app.callbacks import LIVE_OUTPUTS, Explorer
from app.dev.devtools import tiny_loader
from app.models import EngineProvider
from app.trace import load_view
from nanospec.decoding.cost_curve import CostCurve

PROMPT = "the draft tree accepts the draft tree the draft tree"
KNOBS = dict(method="nanospec", max_new_tokens=16, depth=3, top_k=4, total_tokens=12)  # the rest: the page's
QUIET = dict(progress=lambda *a, **k: None)


def budgeted_explorer() -> Explorer:
    """The tiny engine with a steep made-up cost curve (3 ms per verified token): the budget prunes, and
    nothing is measured or written to the cost cache."""
    loader = tiny_loader()

    def load(progress=None):
        engine, info = loader(progress)
        sizes = [2**i for i in range(9)]
        engine.use_cost_curve(CostCurve(sizes, [10.0 + 3.0 * n for n in sizes], {"device": "test:made-up"}))
        return engine, info

    return Explorer(EngineProvider(load), chart_interval_s=0.0)


def _final(outs) -> dict:
    return dict(zip(LIVE_OUTPUTS, outs[-1]))


def test_a_budgeted_live_run_shows_what_the_budget_kept(tmp_path):
    explorer = budgeted_explorer()
    plain = _final(list(explorer.run_live(PROMPT, **KNOBS, budget=False, **QUIET)))
    outs = list(explorer.run_live(PROMPT, **KNOBS, budget=True, **QUIET))
    final = _final(outs)
    view = final["view"]
    assert view.meta["options"]["budget"] is True
    decode = view.events[1:]
    assert decode and all(e.drafted_nodes >= max(1, len(e.tree_tokens)) and e.budget_threshold > 0 for e in decode)
    assert any(e.drafted_nodes > len(e.tree_tokens) for e in decode), "the steep curve should prune something"
    assert [t for e in view.events for t in e.tokens] == [t for e in plain["view"].events for t in e.tokens]
    assert all(e.drafted_nodes == 0 and e.budget_threshold is None for e in plain["view"].events)
    # the KPIs: the cost curve once, and what the budget kept over the run
    assert final["kpis"].count('id="budget-note"') == 1 and "3.00 ms" in final["kpis"]
    assert "measured on this device: made-up" in final["kpis"]
    assert 'id="budget-note"' not in plain["kpis"]
    # the tree of the last step says what its budget did
    title = json.loads(final["tree_plot"].plot)["layout"]["title"]["text"]
    assert "more would have cost more time" in title or "a plain step" in title
    # every redraw sends the acceptance-by-position chart too
    steps = [dict(zip(LIVE_OUTPUTS, out)) for out in outs]
    steps = [out for out in steps if 'id="loading-note"' not in out["kpis"]]
    assert len(steps) >= 3 and all(hasattr(out["depth_plot"], "plot") for out in steps)
    depth = json.loads(final["depth_plot"].plot)
    assert depth["data"] or "plain step" in depth["layout"]["annotations"][0]["text"]
    # the downloaded trace replays with the curve and the per-step budget (as `Explorer.replay` shows it)
    replay = load_view(final["json"]["value"])
    replay.meta["replayed_from"] = "trace.json"
    replayed = dict(zip(LIVE_OUTPUTS, explorer.live_outputs(replay, charts_too=True)))
    assert "the device that recorded this trace" in replayed["kpis"] and "3.00 ms" in replayed["kpis"]
    assert json.loads(replayed["tree_plot"].plot)["layout"]["title"]["text"] == title
