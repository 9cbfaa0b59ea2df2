"""The cost-aware draft budget (budget.py): what it keeps, what it learns, its cost curve's cache,
and that a budgeted tree stays lossless (greedy) on both tree shapes."""

from __future__ import annotations

import itertools
import json
import logging
import time

import pytest
import torch

from nanospec.decoding import cost_curve as budget_mod
from nanospec.decoding.budget import DraftBudget
from nanospec.decoding.cost_curve import CostCurve, load_or_measure
from nanospec.config import METHODS
from nanospec.decoding.copy_branch import BOTH, COPY, HEAD, PAD, ROOT
from nanospec.decoding.engine import SpecEngine
from nanospec.decoding.tree import DraftTree, keep_nodes, select_tree

from .conftest import DEVICE
from .oracle import OracleDrafter

SPEC_METHODS = [m for m in METHODS if m != "ar"]
SMALL = dict(capacity=256, static_size=4096, core_size=128)


def steep_curve(per_token: float = 3.0, base: float = 10.0) -> CostCurve:
    """A made-up device where every verified token costs `per_token` ms more: the budget prunes."""
    sizes = [1, 2, 4, 8, 16, 32]
    return CostCurve(sizes, [base + per_token * n for n in sizes], {"device": "test"})


def random_tree(seed: int, n: int = 7, sources: bool = False) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) - 1 for i in range(1, n + 1)]
    # candidate i's parent is a candidate before it (or the root, -1); scores fall along paths
    logq = -torch.rand(n, generator=g) * 3
    scores = torch.zeros(n)
    for i in range(n):
        p = parents[i + 1]
        scores[i] = logq[i] + (scores[p] if p >= 0 else 0.0)
    tree = select_tree(torch.arange(10, 10 + n), torch.tensor(parents[1:]), scores, torch.ones(n, dtype=torch.bool),
                       torch.tensor([1]), True, n)
    if sources:
        tree.sources = torch.tensor([ROOT] + [[HEAD, COPY, BOTH][i % 3] for i in range(n)])
    return tree


def with_threshold(b: DraftBudget, threshold: float) -> DraftBudget:
    """Set the request's throughput so that λ·Δc equals `threshold`."""
    b.tokens, b.ms = threshold / b.per_token_ms * 1e6 - b.PRIOR_STEPS, 1e6 - b.PRIOR_STEPS * b.curve.one_token_ms
    assert b.threshold == pytest.approx(threshold, rel=1e-6)
    return b


def closed_subsets(parents: list[int]):
    """Every node set that holds the root and each member's parent."""
    t = len(parents)
    for bits in itertools.product([False, True], repeat=t - 1):
        keep = [True, *bits]
        if all(not keep[i] or keep[parents[i]] for i in range(1, t)):
            yield keep


def test_monotone_fit_is_the_closest_non_decreasing_sequence():
    assert budget_mod.monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert budget_mod.monotone([5.0, 1.0, 1.0, 9.0]) == [7 / 3] * 3 + [9.0]
    g = torch.Generator().manual_seed(0)
    for _ in range(50):   # against every non-decreasing candidate built from the input's own pools
        xs = (torch.rand(6, generator=g) * 10).tolist()
        fit = budget_mod.monotone(xs)
        assert all(a <= b + 1e-9 for a, b in zip(fit, fit[1:])) and sum(fit) == pytest.approx(sum(xs))
        for _ in range(20):
            other = sorted((torch.rand(6, generator=g) * 10).tolist())
            assert sum((a - b) ** 2 for a, b in zip(fit, xs)) <= sum((a - b) ** 2 for a, b in zip(other, xs)) + 1e-9


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2, 0.6, 2.0])
def test_select_keeps_the_best_ancestor_closed_set(seed, threshold):
    tree = random_tree(seed, sources=seed % 2 == 1)
    b = with_threshold(DraftBudget(steep_curve(), 8, torch.device("cpu")), threshold)
    keep, expected = b.select(tree)
    p = b.node_probs(tree)
    parents = tree.parents.tolist()
    kept = keep.tolist()
    assert kept[0], "the root is always verified"
    assert all(not kept[i] or kept[parents[i]] for i in range(1, len(kept))), "a kept node's parent was pruned"
    # brute force: no ancestor-closed set earns more expected tokens net of their cost
    value = lambda ks: sum(float(p[i]) - threshold for i in range(1, len(ks)) if ks[i])  # noqa: E731
    best = max(value(ks) for ks in closed_subsets(parents))
    assert value(kept) == pytest.approx(best, abs=1e-5)
    assert float(expected) == pytest.approx(1 + sum(float(p[i]) for i in range(1, len(kept)) if kept[i]), abs=1e-5)
    if threshold >= 1.0:
        assert kept == [True] + [False] * (len(kept) - 1), "nothing can pay: a plain step"


def step_curve() -> CostCurve:
    """A made-up device whose kernels take rows in blocks: 1-2 tokens cost the same, 3-8 more, 9+ more again
    (with a dip at 6, measurement noise, that the budget smooths away)."""
    ms = {1: 10.0, 2: 10.1, 3: 16.0, 4: 16.2, 5: 16.3, 6: 15.9, 7: 16.4, 8: 16.5, 9: 23.0, 10: 23.1}
    return CostCurve(list(ms), list(ms.values()), {"device": "test"})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rate", [0.0, 0.01, 0.05, 0.2, 1.0])
def test_select_prices_each_tree_size_by_the_measured_curve(seed, rate):
    """Not a line: the kept set is the ancestor-closed set whose summed p most exceeds λ·(c(1 + |S|) - c(1))."""
    tree = random_tree(seed, n=9, sources=seed % 2 == 1)
    curve = step_curve()
    b = DraftBudget(curve, 8, torch.device("cpu"), max_nodes=10)
    b.tokens, b.ms = rate * 1e6 - b.PRIOR_STEPS, 1e6 - b.PRIOR_STEPS * curve.one_token_ms
    assert b.rate == pytest.approx(rate, rel=1e-6)
    extra = curve.extra_ms(10)
    assert extra[3] == extra[4] == extra[5] == pytest.approx(6.1333, abs=1e-3), "4-6 tokens: the dip pooled"
    keep, _ = b.select(tree)
    p = b.node_probs(tree)
    kept, parents = keep.tolist(), tree.parents.tolist()
    assert kept[0] and all(not kept[i] or kept[parents[i]] for i in range(1, len(kept)))
    value = lambda ks: sum(float(p[i]) for i in range(1, len(ks)) if ks[i]) - rate * extra[sum(ks) - 1]  # noqa: E731
    assert value(kept) == pytest.approx(max(value(ks) for ks in closed_subsets(parents)), abs=1e-5)


def test_a_block_the_next_node_fills_for_free_is_filled():
    """Between 3 and 8 tokens the made-up curve is flat: once a step pays for a third token, nodes up to
    the eighth cost (nearly) nothing more, so even unlikely ones are verified; the ninth starts a block."""
    parents = torch.tensor([-1, 0, 1, 2, 3, 4, 5, 6, 7, 8])       # a chain of 9 drafted nodes
    from nanospec.decoding.tree import ancestor_mask
    anc = ancestor_mask(parents)
    scores = torch.tensor([0.0, -0.05, -0.1, -2.8, -2.9, -3.0, -3.1, -3.2, -3.3, -3.4])
    tree = DraftTree(torch.arange(10), parents, anc.sum(1) - 1, scores, torch.ones(10, dtype=torch.bool), ancestors=anc)
    b = DraftBudget(step_curve(), 9, torch.device("cpu"), max_nodes=10)
    b.tokens, b.ms = 0.05 * 1e6 - b.PRIOR_STEPS, 1e6 - b.PRIOR_STEPS * b.curve.one_token_ms   # λ = 0.05 tokens/ms
    p = b.node_probs(tree)
    keep, _ = b.select(tree)
    assert keep.tolist() == [True] * 8 + [False] * 2, p.tolist()
    assert float(p[7]) < b.threshold, "the 7th drafted node alone would not pay at the curve's mean slope"


def test_probabilities_follow_the_paths_and_pad_nodes_are_never_kept():
    tree = random_tree(3, n=8)
    tree.sources = torch.tensor([ROOT, HEAD, HEAD, COPY, BOTH, HEAD, PAD, HEAD, COPY])
    b = DraftBudget(steep_curve(), 8, torch.device("cpu"))
    p = b.node_probs(tree)
    assert float(p[0]) == 1.0 and float(p[6]) < 1e-5
    for i, parent in enumerate(tree.parents.tolist()):
        if parent >= 0:
            assert float(p[i]) <= float(p[parent]) + 1e-6, "a child is never likelier than its parent"
    keep, _ = with_threshold(b, 0.0).select(tree)
    assert not keep[6] and keep[[0, 1, 2, 3, 4, 5, 7, 8]].all()


def test_learn_counts_only_tried_nodes_by_source_and_depth():
    # root -> 1 (head) -> 3 (copy); root -> 2 (both); 1 -> 4 (head)
    parents = torch.tensor([-1, 0, 0, 1, 1])
    scores = torch.tensor([0.0, -0.1, -1.0, 0.0, -2.0])
    from nanospec.decoding.tree import ancestor_mask
    anc = ancestor_mask(parents)
    tree = DraftTree(torch.tensor([5, 6, 7, 8, 9]), parents, anc.sum(1) - 1, scores,
                     torch.ones(5, dtype=torch.bool), sources=torch.tensor([ROOT, HEAD, BOTH, COPY, HEAD]),
                     ancestors=anc)
    b = DraftBudget(steep_curve(), 4, torch.device("cpu"))
    on_path = torch.tensor([True, True, False, True, False])
    enabled = torch.tensor([True, True, True, True, False])    # node 4 was pruned: never tried
    b.learn(tree, enabled, on_path)
    q1, q2 = torch.exp(torch.tensor(-0.1)), torch.exp(torch.tensor(-1.0))
    assert b.head_pred.tolist() == pytest.approx([0, float(q1 + q2), 0, 0, 0])
    assert b.head_acc.tolist() == [0, 1, 0, 0, 0]
    # a tree without a copy-chain match length counts its copies in the first row (match <= 1)
    assert b.copy_tried.tolist()[:5] == [0, 1, 1, 0, 0] and b.copy_acc.tolist()[:5] == [0, 0, 1, 0, 0]
    assert b.copy_tried[5:].sum() == 0
    tree.copy_match = torch.tensor(6)   # a copy after a 6-token match: the row of 5+ tokens
    b.learn(tree, enabled, on_path)
    assert b.copy_tried.tolist()[15:] == [0, 1, 1, 0, 0] and b.copy_acc.tolist()[15:] == [0, 0, 1, 0, 0]
    assert b.copy_tried[5:15].sum() == 0 and b.copy_tried[:5].tolist() == [0, 1, 1, 0, 0]


def test_copy_nodes_are_priced_by_the_match_length():
    """The same copied node is likelier after a match where copies were accepted than after one where they were not."""
    parents = torch.tensor([-1, 0])
    from nanospec.decoding.tree import ancestor_mask
    anc = ancestor_mask(parents)
    tree = DraftTree(torch.tensor([5, 6]), parents, anc.sum(1) - 1, torch.zeros(2), torch.ones(2, dtype=torch.bool),
                     sources=torch.tensor([ROOT, COPY]), ancestors=anc)
    b = DraftBudget(steep_curve(), 4, torch.device("cpu"))
    for match, accepted in ((1, False), (2, True)):
        tree.copy_match = torch.tensor(match)
        for _ in range(10):
            b.learn(tree, torch.ones(2, dtype=torch.bool), torch.tensor([True, accepted]))
    probs = {}
    for match in (0, 1, 2, 7):
        tree.copy_match = torch.tensor(match)
        probs[match] = float(b.node_probs(tree)[1])
    assert probs[0] == probs[1] == pytest.approx(1 / 12) and probs[2] == pytest.approx(11 / 12)
    assert probs[7] == pytest.approx(0.5), "no copy after a long match was tried yet: the prior"


def test_keep_nodes_reindexes_parents():
    tree = random_tree(1, n=7)
    keep = torch.zeros(8, dtype=torch.bool)
    keep[0] = True
    for i in range(1, 8):  # a closed set: every other node whose parent is kept
        keep[i] = bool(keep[int(tree.parents[i])]) and i % 2 == 1
    small = keep_nodes(tree, keep)
    old = keep.nonzero().flatten().tolist()
    for new_i, old_i in enumerate(old):
        par = int(small.parents[new_i])
        assert (par < 0 and old_i == 0) or old[par] == int(tree.parents[old_i])
        assert int(small.depths[new_i]) == int(tree.depths[old_i])


# -- the cost curve's cache -------------------------------------------------------------

def test_cost_curve_cache_missing_stale_malformed(tiny_pair, tmp_path, monkeypatch, caplog):
    target, _ = tiny_pair
    calls = []

    def fake_measure(model, device, sizes, key, **kw):
        calls.append(sizes)
        return CostCurve(list(sizes), [5.0 + n for n in sizes], key)

    monkeypatch.setattr(budget_mod, "measure_cost_curve", fake_measure)
    caplog.set_level(logging.WARNING, logger="nanospec.decoding.cost_curve")
    first = load_or_measure(target, DEVICE, False, 22, root=tmp_path)
    assert len(calls) == 1 and "none cached" in caplog.text
    assert max(first.sizes) >= 22 and first.per_token_ms == pytest.approx(1.0)
    again = load_or_measure(target, DEVICE, False, 22, root=tmp_path)
    assert len(calls) == 1 and again == first, "a matching cached curve is reused"
    path = budget_mod.curve_path(first.key, tmp_path)
    doc = json.loads(path.read_text())
    doc["key"]["threads"] += 1
    path.write_text(json.dumps(doc))
    caplog.clear()
    load_or_measure(target, DEVICE, False, 22, root=tmp_path)
    assert len(calls) == 2 and "stale (threads changed)" in caplog.text
    for junk in ("{not json", json.dumps({"sizes": [1, 2], "ms": [3.0], "key": {}}),
                 json.dumps({"sizes": [1, 2], "ms": [-1.0, 2.0], "key": doc["key"]})):
        path.write_text(junk)
        caplog.clear()
        load_or_measure(target, DEVICE, False, 22, root=tmp_path)
        assert "unreadable" in caplog.text
    assert len(calls) == 5
    caplog.clear()
    load_or_measure(target, DEVICE, False, 64, root=tmp_path)   # a larger tree than it was measured for
    assert len(calls) == 6 and "stops at" in caplog.text


def test_a_cost_curve_measured_on_a_busy_machine_is_not_cached(tiny_pair, tmp_path, monkeypatch, caplog):
    """While another job holds the cores the measurement sleeps more than it computes: the curve serves
    this run, is not cached, and the next load measures again."""
    target, _ = tiny_pair
    calls = []

    def starved_measure(model, device, sizes, key, **kw):
        calls.append(sizes)
        time.sleep(budget_mod.BUSY_CHECK_S + 0.05)   # wall time without CPU time: what a busy machine gives
        return CostCurve(list(sizes), [5.0 + n for n in sizes], key)

    monkeypatch.setattr(budget_mod, "measure_cost_curve", starved_measure)
    caplog.set_level(logging.WARNING, logger="nanospec.decoding.cost_curve")
    curve = load_or_measure(target, DEVICE, False, 22, root=tmp_path)
    assert curve.per_token_ms == pytest.approx(1.0) and "busy" in caplog.text
    assert not budget_mod.curve_path(curve.key, tmp_path).exists()
    load_or_measure(target, DEVICE, False, 22, root=tmp_path)
    assert len(calls) == 2


def test_measure_cost_curve_times_every_size(tiny_pair):
    target, _ = tiny_pair
    curve = budget_mod.measure_cost_curve(target, DEVICE, [1, 2, 4], {"device": "test"}, context=8, repeats=2)
    assert curve.sizes == [1, 2, 4] and all(m > 0 for m in curve.ms)


# -- the engine: lossless with a budget that prunes ---------------------------------------

@pytest.mark.parametrize("fixed_shape", [False, True], ids=["cpu-shape", "fixed-shape"])
@pytest.mark.parametrize("method", SPEC_METHODS)
def test_budgeted_greedy_equals_autoregressive(tiny_pair, frequent_ids, engine, prompts, method, fixed_shape):
    """An oracle that drafts the truth for 2 tokens, then garbage, on a steep made-up cost curve:
    the budget prunes nodes (fewer verified than drafted), sometimes to a plain step, and the
    output is still the target's."""
    target, head = tiny_pair
    pruned = plain = 0
    for prompt in prompts[:8]:
        ref = engine.generate(prompt, method="ar", max_new_tokens=16)
        eng = SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=[],
                         drafter_factory=lambda: OracleDrafter(ref.token_ids, target.config.vocab_size, correct=2))
        eng.use_cost_curve(steep_curve())
        out = eng.generate(prompt, method=method, max_new_tokens=16, depth=4, top_k=3, total_tokens=12,
                           copy_branch=4, fixed_shape=fixed_shape, budget=True, **SMALL)
        assert out.token_ids == ref.token_ids, f"{method} with the budget diverged on {prompt[:5]}..."
        for e in out.events[1:]:
            assert e.drafted_nodes >= len(e.tree_tokens) and e.expected_tokens >= 1.0
            assert e.budget_threshold > 0 and "pad" not in e.tree_sources
            pruned += e.drafted_nodes > len(e.tree_tokens)
            plain += len(e.tree_tokens) == 1
    assert pruned > 0, "the budget never pruned: the test would not exercise it"


def test_budget_zero_cost_keeps_every_node(tiny_pair, frequent_ids, engine, prompts):
    target, head = tiny_pair
    ref = engine.generate(prompts[0], method="ar", max_new_tokens=12)
    eng = SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=[],
                     drafter_factory=lambda: OracleDrafter(ref.token_ids, target.config.vocab_size))
    eng.use_cost_curve(CostCurve([1, 2, 4, 8, 16, 32], [10.0] * 6, {"device": "test"}))
    out = eng.generate(prompts[0], method="nanospec", max_new_tokens=12, depth=4, top_k=3, total_tokens=12,
                       copy_branch=0, budget=True, **SMALL)
    assert out.token_ids == ref.token_ids
    assert all(e.drafted_nodes == len(e.tree_tokens) for e in out.events[1:])


def test_a_hopeless_head_gives_plain_steps(tiny_pair, frequent_ids, engine, prompts):
    """The random head's drafts are never right: with the statistics learnt, the budget stops
    verifying them and most steps verify the root alone (one token, as `ar`)."""
    eng = SpecEngine(tiny_pair[0], None, tiny_pair[1], frequent_ids=frequent_ids, eos_token_ids=[])
    eng.use_cost_curve(steep_curve())
    out = eng.generate(prompts[1], method="nanospec", max_new_tokens=24, budget=True, copy_branch=0, **SMALL)
    ref = engine.generate(prompts[1], method="ar", max_new_tokens=24)
    assert out.token_ids == ref.token_ids
    sizes = [len(e.tree_tokens) for e in out.events[1:]]
    assert sum(s == 1 for s in sizes[len(sizes) // 2:]) >= len(sizes[len(sizes) // 2:]) // 2, sizes
    # never more than EXPLORE_AFTER plain steps in a row: then the likeliest node is verified anyway
    run = longest = 0
    for size in sizes:
        run = run + 1 if size == 1 else 0
        longest = max(longest, run)
    assert longest <= DraftBudget.EXPLORE_AFTER, sizes
    assert any(s == 2 for s in sizes), "an exploring step verifies the root and one node"


def test_sampled_bonus_tokens_join_the_active_set(tiny_pair, prompts):
    """At temperature > 0 every token the target emitted (the sampled bonus too) is in NanoSpec's
    active set when the next tree is drafted: the root of every step is a member."""
    eng = SpecEngine(tiny_pair[0], None, tiny_pair[1], eos_token_ids=[])
    seen = 0
    for seed in range(4):
        out = eng.generate(prompts[2], method="nanospec", max_new_tokens=24, temperature=1.5, seed=seed,
                           capacity=4096, copy_branch=0)
        for e in out.events[1:]:
            assert e.tree_in_active[0], f"step {e.step}: root {e.root_token} is not in the active set"
            seen += 1
    assert seen > 20


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_budget_fields_survive_a_trace_round_trip(tiny_pair, frequent_ids, prompts, tmp_path, suffix):
    from nanospec.events import load_trace, save_trace
    eng = SpecEngine(tiny_pair[0], None, tiny_pair[1], frequent_ids=frequent_ids, eos_token_ids=[])
    eng.use_cost_curve(steep_curve())
    out = eng.generate(prompts[0], method="nanospec", max_new_tokens=8, budget=True, **SMALL)
    events, _, _ = load_trace(save_trace(tmp_path / f"t{suffix}", out.events, out.summary))
    assert [(e.drafted_nodes, e.expected_tokens, e.budget_threshold) for e in events] == \
        [(e.drafted_nodes, e.expected_tokens, e.budget_threshold) for e in out.events]
    assert events[0].expected_tokens is None and events[1].expected_tokens >= 1.0


def test_statistics_carry_over_to_the_next_request_scaled_down():
    cpu = torch.device("cpu")
    first = DraftBudget(steep_curve(), 4, cpu)
    first.head_pred += torch.tensor([0.0, 100, 40, 10, 0])
    first.head_acc += torch.tensor([0.0, 50, 10, 5, 0])
    first.copy_tried[:5] += torch.tensor([0.0, 8, 30, 0, 0])
    first.copy_acc[:5] += torch.tensor([0.0, 4, 15, 0, 0])
    nxt = DraftBudget(steep_curve(), 4, cpu, earlier=first)
    c = DraftBudget.CARRY
    assert nxt.head_pred.tolist() == pytest.approx([0, c, c, 10, 0])
    assert nxt.head_acc.tolist() == pytest.approx([0, c / 2, c / 4, 5, 0]), "the acceptance ratio is kept"
    assert nxt.copy_tried.tolist()[:5] == pytest.approx([0, 8, c, 0, 0])
    assert nxt.copy_acc.tolist()[:5] == pytest.approx([0, 4, c / 2, 0, 0])
    assert nxt.tokens == 0 and nxt.ms == 0.0, "throughput is the request's own"
    other = DraftBudget(steep_curve(), 6, cpu, earlier=first)   # another tree: nothing carried
    assert other.head_pred.sum() == 0 and other.copy_tried.sum() == 0


def test_the_engine_carries_statistics_per_method(tiny_pair, frequent_ids, prompts):
    eng = SpecEngine(tiny_pair[0], None, tiny_pair[1], frequent_ids=frequent_ids, eos_token_ids=[])
    eng.use_cost_curve(steep_curve())
    eng.generate(prompts[0], method="nanospec", max_new_tokens=16, budget=True, copy_branch=0, **SMALL)
    first = eng._budgets["nanospec"]
    assert first.head_pred.sum() > 0
    eng.generate(prompts[1], method="nanospec", max_new_tokens=16, budget=True, copy_branch=0, **SMALL)
    assert eng._budgets["nanospec"] is not first and "full" not in eng._budgets
    eng.use_cost_curve(steep_curve())
    assert not eng._budgets, "a new cost curve starts the statistics afresh"
