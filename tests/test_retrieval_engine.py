"""The retrieved branch inside the engine: lossless for every policy and tree shape, accepted where the
store knows the continuation, priced by the budget, one host read per step, and off without a store."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from nanospec.bench.random_pair import random_head, random_target, random_target_config
from nanospec.config import METHODS, GenerationConfig
from nanospec.decoding.budget import DraftBudget
from nanospec.decoding.copy_branch import HEAD, PAD, RETRIEVED, ROOT, drop_pad_nodes
from nanospec.decoding.cost_curve import CostCurve
from nanospec.decoding.engine import SpecEngine
from nanospec.decoding.retrieved_branch import (RetrievedBranch, load_retrieval, merge_retrieved,
                                                merge_retrieved_on_host)
from nanospec.decoding.tree import DraftTree
from nanospec.retrieval import RetrievalIndex, SuffixStore, load_store, save_store
from nanospec.timing import PhaseTimer

from .conftest import DEVICE
from .test_sampling import CHI2_001, RUNS, chi_square, exact_marginals

SPEC_METHODS = [m for m in METHODS if m != "ar"]
SMALL = dict(capacity=256, static_size=4096, core_size=128, depth=3, top_k=4, total_tokens=12)
STEEP = CostCurve([1, 2, 4, 8, 16, 32, 64], [10.0 + 3 * n for n in (1, 2, 4, 8, 16, 32, 64)], {})


def store_index(tmp_path, docs: list[list[int]]) -> RetrievalIndex:
    """A store of `docs` written to tmp_path and loaded back, as a pair's would be."""
    path = tmp_path / "store.npz"
    save_store(path, SuffixStore.from_documents([np.asarray(d) for d in docs]), {"tokenizer": None})
    return RetrievalIndex(load_store(path, warn=pytest.fail))


@pytest.fixture()
def answers(engine, prompts):
    """(prompts, the target's greedy answers): the first half's answers go into the store."""
    every = prompts[:12]
    return every, [engine.generate(p, method="ar", max_new_tokens=16).token_ids for p in every]


@pytest.fixture()
def stored(engine, answers, tmp_path):
    """The engine with a store of the first six prompts' answers (prompt + answer) and some noise."""
    every, refs = answers
    g = torch.Generator().manual_seed(9)
    noise = [torch.randint(0, engine.vocab_size, (40,), generator=g).tolist() for _ in range(5)]
    # a document that starts like an answer and then goes elsewhere: a retrieved branch that is rejected
    wrong = [every[0] + refs[0][:3] + torch.randint(0, engine.vocab_size, (8,), generator=g).tolist()]
    engine.retrieval = store_index(tmp_path, [p + r for p, r in zip(every[:6], refs[:6])] + noise + wrong)
    return engine


@pytest.mark.parametrize("budget", [False, True], ids=["no-budget", "budget"])
@pytest.mark.parametrize("fixed_shape", [False, True], ids=["cpu-shape", "fixed-shape"])
@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_with_retrieved_branch_equals_autoregressive(stored, answers, method, fixed_shape, budget):
    every, refs = answers
    if budget:
        stored.use_cost_curve(STEEP)  # a made-up steep curve: the budget prunes
    retrieved = shown = 0
    for prompt, ref in zip(every, refs):
        out = stored.generate(prompt, method=method, max_new_tokens=16, retrieval_nodes=6, copy_branch=4,
                              fixed_shape=fixed_shape, budget=budget, **SMALL)
        assert out.token_ids == ref, f"{method} + retrieved branch diverged on prompt {prompt[:5]}..."
        for e in out.events[1:]:
            assert "pad" not in e.tree_sources and len(e.tree_sources) == len(e.tree_tokens)
            assert set(e.tree_sources[1:]) <= {"head", "copy", "both", "retrieved"}
            shown += e.tree_sources.count("retrieved")
            assert e.phases["retrieval_lookup"] >= 0.0
        retrieved += out.summary.accepted_by_source["retrieved"]
    assert shown > 0 and retrieved > 0, "the retrieved branch was never accepted: the test would not exercise it"


def test_the_branch_is_off_by_default_and_without_a_store(engine, answers, stored):
    every, refs = answers
    off = stored.generate(every[0], method="nanospec", max_new_tokens=16, **SMALL)
    assert off.token_ids == refs[0] and off.summary.accepted_by_source["retrieved"] == 0
    assert all("retrieved" not in e.tree_sources for e in off.events)
    stored.retrieval = None  # an engine without a store: the option is accepted and changes nothing
    out = stored.generate(every[0], method="nanospec", max_new_tokens=16, retrieval_nodes=8, **SMALL)
    assert out.token_ids == refs[0] and out.summary.accepted_by_source["retrieved"] == 0


def test_a_stored_answer_is_accepted_whole(stored, answers):
    """A prompt whose answer is in the store: retrieved tokens carry most of the answer."""
    every, refs = answers
    out = stored.generate(every[1], method="nanospec", max_new_tokens=16, retrieval_nodes=8, copy_branch=0,
                          budget=False, **SMALL)
    assert out.token_ids == refs[1]
    assert out.summary.accepted_by_source["retrieved"] >= 8
    assert len(out.events) <= 6  # prefill + a few steps of up to 7 tokens


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_missing_or_bad_store_leaves_the_branch_off_with_one_line(engine, answers, tmp_path, caplog, fixed_shape):
    every, refs = answers
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a store")
    for path in (tmp_path / "missing.npz", bad):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert load_retrieval(path, None) is None
        assert len(caplog.records) == 1 and str(path) in caplog.records[0].getMessage()
    engine.retrieval = None
    out = engine.generate(every[2], method="hybrid", max_new_tokens=16, retrieval_nodes=4, fixed_shape=fixed_shape,
                          **SMALL)
    assert out.token_ids == refs[2]


def test_a_foreign_store_is_refused(tmp_path, caplog):
    class Tok:
        eos_token, pad_token, chat_template = "</s>", None, None

        def get_vocab(self):
            return {"a": 0, "b": 1}

    path = tmp_path / "foreign.npz"
    save_store(path, SuffixStore.from_documents([np.arange(10)]), {"tokenizer": "0123456789abcdef"})
    with caplog.at_level(logging.WARNING):
        assert load_retrieval(path, Tok()) is None
    assert "foreign" in caplog.text


# -- the merge, by hand ------------------------------------------------------------------------------
def _tree(tokens, parents) -> DraftTree:
    t = torch.tensor(tokens)
    par = torch.tensor(parents)
    depths = torch.tensor([0] + [1] * (len(tokens) - 1))
    for i in range(1, len(tokens)):
        depths[i] = depths[par[i]] + 1
    return DraftTree(t, par, depths, -depths.float(), torch.ones(len(tokens), dtype=torch.bool))


class _AllIn:
    def contains(self, ids):
        return torch.ones_like(ids, dtype=torch.bool)


def _branch(docs, n_nodes=6, depth=3) -> RetrievedBranch:
    return RetrievedBranch(RetrievalIndex(SuffixStore.from_documents([np.asarray(d) for d in docs])),
                           n_nodes, depth, min_match=2)


def test_merge_shares_nodes_the_tree_has_and_remaps_parents():
    # the tree: root 7 -> 1 -> 2, root -> 5.  The store: after (6, 7) comes 1 2 3 twice and 1 4 once.
    tree = _tree([7, 1, 2, 5], [-1, 0, 1, 0])
    branch = _branch([[6, 7, 1, 2, 3], [6, 7, 1, 2, 3], [6, 7, 1, 4]])
    branch.begin([6], 7)
    merged = branch.extend(tree, _AllIn(), PhaseTimer("cpu"), fixed_shape=True)
    assert len(merged) == 4 + 6  # fixed shape: N slots, whatever was shared
    # the trie is 1 (d1), 2 and 4 (d2), 3 (d3): slot k holds trie node k; 1 and 2 are shared (PAD slots)
    assert merged.sources.tolist() == [ROOT, HEAD, HEAD, HEAD, PAD, PAD, RETRIEVED, RETRIEVED, PAD, PAD]
    assert merged.tokens[6:8].tolist() == [4, 3] and merged.parents[6:8].tolist() == [1, 2]
    assert merged.depths[6:8].tolist() == [2, 3]
    assert (merged.parents[[4, 5, 8, 9]] == 0).all()
    rp = merged.retrieved_prob.tolist()
    assert rp[1] == pytest.approx(1.0) and rp[2] == pytest.approx(2 / 3) and rp[3] == 0.0
    assert rp[6] == pytest.approx(1 / 3) and rp[7] == pytest.approx(1.0)
    assert int(merged.retrieved_match) == 2
    assert merged.ancestors[7].tolist() == [True, True, True, False, False, False, False, True, False, False]
    small = branch.extend(tree, _AllIn(), PhaseTimer("cpu"), fixed_shape=False)  # a CPU drops the PAD slots
    assert small.tokens.tolist() == [7, 1, 2, 5, 4, 3] and small.parents.tolist() == [-1, 0, 1, 0, 1, 2]
    assert small.retrieved_prob.shape[0] == 6


def _same_tree(a: DraftTree, b: DraftTree) -> None:
    for name in ("tokens", "parents", "depths", "scores", "in_active", "sources", "ancestors", "copy_match",
                 "retrieved_prob", "retrieved_match"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name


class _Some:
    """Even ids are in the active set."""

    def contains(self, ids):
        return ids % 2 == 0


@pytest.mark.parametrize("seed", range(40))
def test_the_host_merge_equals_the_tensor_merge_without_pad_slots(seed):
    # random drafted trees (a few tokens, so the store's continuations often meet the tree's nodes) and
    # random stores: a CPU's merge on host lists must give the tensor merge's tree, PAD slots dropped
    g = torch.Generator().manual_seed(seed)
    t = int(torch.randint(2, 12, (1,), generator=g))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]
    tree = _tree(torch.randint(0, 5, (t,), generator=g).tolist(), parents)
    tree.scores = -torch.rand(t, generator=g).cumsum(0) * (tree.depths > 0)
    if seed % 2:  # a tree that already went through the copy chain: its own sources and probabilities
        tree.sources = torch.where(tree.depths > 0, HEAD, ROOT)
        tree.retrieved_prob = torch.rand(t, generator=g) * (tree.depths > 0)
    docs = [torch.randint(0, 5, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(8)]
    branch = _branch(docs, n_nodes=int(torch.randint(1, 9, (1,), generator=g)), depth=4)
    branch.begin(docs[0][:2], int(tree.tokens[0]))
    found = branch.lookup()
    if len(found) == 0:
        assert branch.extend(tree, _Some(), PhaseTimer("cpu")) is tree
        return
    expected = drop_pad_nodes(merge_retrieved(tree, branch._upload(found), branch.depth, _Some()))
    _same_tree(merge_retrieved_on_host(tree, found, _Some()), expected)
    _same_tree(branch.extend(tree, _Some(), PhaseTimer("cpu")), expected)


def test_no_match_adds_only_pad_slots():
    tree = _tree([7, 1], [-1, 0])
    branch = _branch([[1, 2, 3, 4]])
    branch.begin([9], 7)
    assert branch.extend(tree, _AllIn(), PhaseTimer("cpu"), fixed_shape=False) is tree
    merged = branch.extend(tree, _AllIn(), PhaseTimer("cpu"), fixed_shape=True)
    assert len(merged) == 2 + 6 and (merged.sources[2:] == PAD).all()
    assert (merged.retrieved_prob == 0).all()


def test_the_branch_reads_only_the_last_host_ids():
    branch = _branch([[1, 2, 3]])
    branch.begin(list(range(100)), 100)
    branch.append([101, 102])
    assert branch.context.tolist() == list(range(87, 103))


# -- the budget prices retrieved nodes from their own statistics -------------------------------------
def test_budget_prices_retrieved_nodes_and_learns_from_tried_ones():
    curve = CostCurve([1, 2, 4, 8], [10.0, 11.0, 13.0, 17.0], {})
    budget = DraftBudget(curve, 6, torch.device("cpu"), max_nodes=8)
    tree = _tree([7, 1, 2, 5], [-1, 0, 1, 0])
    branch = _branch([[6, 7, 1, 2, 3], [6, 7, 1, 2, 3], [6, 7, 1, 4]])
    branch.begin([6], 7)
    merged = branch.extend(tree, _AllIn(), PhaseTimer("cpu"))
    p = budget.node_probs(merged)
    # merged: [7, 1, 2, 5, 4, 3]; node 5 (token 3, retrieved alone): its parent's chance times
    # min(1, r * 1.0), r = 1 before any statistics; node 4 (token 4): r * 1/3
    assert merged.tokens.tolist() == [7, 1, 2, 5, 4, 3]
    assert p[5] == pytest.approx(float(p[2]))
    assert p[4] == pytest.approx(float(p[1]) / 3)
    on_path = torch.tensor([True, True, True, False, False, False])
    budget.learn(merged, torch.ones(6, dtype=torch.bool), on_path)
    # nodes 1, 2, 4 and 5 were tried; 1 and 2 (accepted), which the head drafted too, teach the head's
    # statistics only: the retrieval statistics count the nodes retrieval proposed alone (4 and 5, rejected)
    assert float(budget.retr_pred.sum()) == pytest.approx(1 / 3 + 1.0)
    assert float(budget.retr_acc.sum()) == 0.0
    assert float(budget.head_acc.sum()) == pytest.approx(2.0)
    later = DraftBudget(curve, 6, torch.device("cpu"), earlier=budget, max_nodes=8)
    assert torch.equal(later.retr_pred, budget.retr_pred)  # carried (under the CARRY cap)
    q = budget.node_probs(merged)
    assert q[5] < p[5]  # node 5 was tried and rejected: retrieved nodes at its depth now cost their chance


def test_the_lesson_tap_shows_the_chances_the_budget_priced_with_the_branch(engine, answers, tmp_path):
    """The lesson's budget tap recomputes each step's chances from the statistics as the step began; with
    the retrieved branch on, the retrieval statistics are among them: the kept nodes' chances sum to the
    tokens the step expected (what `select` itself summed)."""
    from nanospec.lesson.budget_trace import BudgetTap
    every, refs = answers
    g = torch.Generator().manual_seed(3)
    # stored answers right for 2 tokens, then wrong and right by turns: retrieved nodes are rejected often,
    # so the retrieval statistics change from step to step
    docs = [p + [t if (i < 2 or i % 2) else int(torch.randint(0, engine.vocab_size, (1,), generator=g))
                 for i, t in enumerate(r)] for p, r in zip(every[:6], refs[:6])]
    engine.retrieval = store_index(tmp_path, docs)
    engine.use_cost_curve(STEEP)
    checked = 0
    for prompt, ref in zip(every[:6], refs[:6]):
        with BudgetTap(engine) as tap:
            out = engine.generate(prompt, method="nanospec", max_new_tokens=16, retrieval_nodes=6, copy_branch=0,
                                  budget=True, **SMALL)
        assert out.token_ids == ref
        for e, entry in zip(out.events, tap.steps(out.events)):
            if entry is None:
                continue
            kept = sum(p for p, k in zip(entry["p"], entry["kept"]) if k)
            assert kept == pytest.approx(e.expected_tokens, abs=1e-3), f"step {e.step}"
            checked += any(0 < p < 1 for p, src in zip(entry["p"], entry["sources"]) if src == "retrieved")
    assert checked > 0, "no retrieved node was uncertain: the test would not exercise the statistics"


# -- sampling keeps the target's distribution ------------------------------------------------------------
V = 16


def test_speculative_sampling_with_retrieved_branch_matches_target_distribution(tmp_path):
    """As test_sampling.py: exact marginals of the 2nd and 3rd tokens against 2,000 seeded runs, with a
    store of the target's own sampled answers to the prompt (so retrieved nodes are often accepted and
    often rejected), on the GPU's fixed shape with the budget pruning on a made-up curve."""
    cfg = random_target_config(V, 32, 2, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    model = random_target(cfg, seed=4).to(DEVICE)
    model.lm_head.weight.mul_(6.0)
    engine = SpecEngine(model, None, random_head(model.config, seed=5).to(DEVICE), eos_token_ids=[],
                        frequent_ids=torch.randperm(V, generator=torch.Generator().manual_seed(6)))
    prompt = [3, 9, 1, 14, 3]
    docs = [prompt + engine.generate(prompt, method="ar", max_new_tokens=6, temperature=1.0, seed=10_000 + s).token_ids
            for s in range(30)]
    engine.retrieval = store_index(tmp_path, docs)
    curve = CostCurve([1, 2, 4, 8, 16, 32], [10.0 + 0.5 * n for n in (1, 2, 4, 8, 16, 32)], {})
    p2, p3 = exact_marginals(model, prompt, 1.0, 1.0)
    c2, c3 = torch.zeros(V), torch.zeros(V)
    accepted = retrieved = 0
    for seed in range(RUNS):
        engine.use_cost_curve(curve)
        r = engine.generate(prompt, method="nanospec", max_new_tokens=3, temperature=1.0, seed=seed, depth=2,
                            top_k=3, total_tokens=6, capacity=4, copy_branch=2, retrieval_nodes=4,
                            retrieval_depth=3, retrieval_min_match=1, fixed_shape=True, budget=True)
        c2[r.token_ids[1]] += 1
        c3[r.token_ids[2]] += 1
        accepted += sum(len(e.accepted_tokens) for e in r.events)
        retrieved += r.summary.accepted_by_source["retrieved"]
    assert accepted > RUNS * 0.3, "drafts were rarely accepted: the test would not exercise rejection"
    assert retrieved > RUNS * 0.05, f"only {retrieved} retrieved tokens were accepted"
    for counts, probs in ((c2, p2), (c3, p3)):
        stat, df = chi_square(counts, probs)
        assert stat < CHI2_001[df - 1], f"chi2={stat:.1f} df={df}: empirical {counts/RUNS} vs exact {probs}"


def test_the_options_size_the_tree():
    cfg = GenerationConfig.build("nanospec", total_tokens=12, copy_branch=4, retrieval_nodes=6, retrieval_depth=5)
    assert cfg.tree.max_nodes == 22 and cfg.step_slots == 22
    assert cfg.tree.max_depth == max(cfg.tree.depth + 4, 5)
    with pytest.raises(ValueError, match="retrieval_nodes"):
        GenerationConfig.build("nanospec", retrieval_nodes=-1).validate()


# -- one host read per step, as on a GPU ------------------------------------------------------------------
from .test_host_syncs import assert_one_read_per_step, eagle2_pair, eagle3_pair, engines, guarded_steps, prompt  # noqa: E402,F401


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("budget", [False, True])
@pytest.mark.parametrize("family", ["eagle2", "eagle3"])
def test_retrieved_steps_read_the_host_once(engines, prompt, tmp_path, family, budget, temperature):
    """The lookup reads host ids the step already has; the merge is device code of a fixed shape."""
    eng = engines[family]
    answer = eng.generate(prompt, method="ar", max_new_tokens=8).token_ids
    eng.retrieval = store_index(tmp_path, [prompt + answer, prompt[3:] + answer[:2] + [5, 6, 7]])
    measured = eng.cost_curve()
    if budget:
        eng.use_cost_curve(CostCurve([1, 2, 4, 8, 16, 32], [10.0 + 3 * n for n in (1, 2, 4, 8, 16, 32)], {}))
    try:
        options = dict(method="nanospec", temperature=temperature, copy_branch=6, retrieval_nodes=6,
                       retrieval_depth=2, fixed_shape=True, budget=budget, **SMALL)
        steps = guarded_steps(eng, prompt, **options)
        if budget:
            eng.use_cost_curve(eng.cost_curve())  # the same fresh statistics as the guarded run had
        shown = eng.generate(prompt, max_new_tokens=8, **options).events
        # (the store holds the greedy answer: a sampled one may leave it at once)
        assert temperature > 0 or any("retrieved" in e.tree_sources for e in shown), "no retrieved node: the test would not exercise it"
    finally:
        eng.retrieval = None
        eng.use_cost_curve(measured)
    assert_one_read_per_step(steps)
