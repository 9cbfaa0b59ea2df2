"""Every method's greedy output equals greedy autoregressive output, token for token."""

from __future__ import annotations

import pytest

from nanospec.config import METHODS
from nanospec.decoding.engine import SpecEngine

from .oracle import OracleDrafter

SPEC_METHODS = [m for m in METHODS if m != "ar"]
SMALL = dict(capacity=256, static_size=4096, core_size=128)


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_equals_autoregressive_random_head(engine, prompts, method):
    assert len(prompts) >= 20
    for prompt in prompts:
        ref = engine.generate(prompt, method="ar", max_new_tokens=12)
        out = engine.generate(prompt, method=method, max_new_tokens=12, depth=3, top_k=4,
                              total_tokens=12, **SMALL)
        assert out.token_ids == ref.token_ids, f"{method} diverged on prompt {prompt[:5]}..."
        assert len(out.token_ids) == 12


# The oracle tests check the machinery on whole trees: they turn the draft budget (test_budget.py)
# off, which would otherwise prune the oracle's deep, low-scored true branch.
def _oracle_engine(tiny_pair, frequent_ids, truth, eos=(), **kw):
    target, head = tiny_pair
    return SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=list(eos),
                      drafter_factory=lambda: OracleDrafter(truth, target.config.vocab_size, **kw))


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_oracle_long_paths_tau_and_bonus(tiny_pair, frequent_ids, engine, prompts, method):
    depth = 5
    for prompt in prompts[:6]:
        ref = engine.generate(prompt, method="ar", max_new_tokens=60)
        eng = _oracle_engine(tiny_pair, frequent_ids, ref.token_ids)
        out = eng.generate(prompt, method=method, max_new_tokens=60, depth=depth, top_k=3,
                           total_tokens=1 + depth * 3, **SMALL, budget=False)
        assert out.token_ids == ref.token_ids
        full_steps = [e for e in out.events[1:-1]]
        # every step but the last accepts the whole true branch, then the target's bonus token
        for e in full_steps:
            assert len(e.accepted_tokens) == depth
            assert e.tokens == e.accepted_tokens + [e.bonus_token]
            assert e.miss_kind == "none"
        assert out.summary.tau >= depth  # close to depth + 1; the last step is cut by the budget
        assert out.summary.tau <= depth + 1


def test_oracle_partial_branch_stops_mid_path(tiny_pair, frequent_ids, engine, prompts):
    prompt = prompts[3]
    ref = engine.generate(prompt, method="ar", max_new_tokens=40)
    eng = _oracle_engine(tiny_pair, frequent_ids, ref.token_ids, correct=2)
    out = eng.generate(prompt, method="nanospec", max_new_tokens=40, depth=5, top_k=3, total_tokens=16, **SMALL, budget=False)
    assert out.token_ids == ref.token_ids
    for e in out.events[1:-1]:
        assert len(e.accepted_tokens) == 2
        assert e.miss_kind in ("vocab", "draft")
    assert abs(out.summary.tau - 3.0) < 0.5


def test_oracle_eos_inside_accepted_path(tiny_pair, frequent_ids, prompts):
    target, head = tiny_pair
    prompt = prompts[5]
    free = SpecEngine(target, None, head, eos_token_ids=[])
    truth = free.generate(prompt, method="ar", max_new_tokens=40).token_ids
    eos = truth[13]  # an EOS in the middle of a 5-token accepted path
    first = truth.index(eos)
    ar = SpecEngine(target, None, head, eos_token_ids=[eos]).generate(prompt, method="ar", max_new_tokens=40)
    assert ar.token_ids == truth[: first + 1] and ar.summary.stop_reason == "eos"
    eng = _oracle_engine(tiny_pair, frequent_ids, truth, eos=[eos])
    out = eng.generate(prompt, method="full", max_new_tokens=40, depth=5, top_k=3, total_tokens=16, budget=False)
    assert out.token_ids == ar.token_ids
    assert out.summary.stop_reason == "eos"
    last = out.events[-1]
    assert last.tokens[-1] == eos
    # the EOS arrived as an accepted draft in the middle of a longer step, which was cut there
    assert any(len(e.accepted_tokens) == 5 and len(e.tokens) < 6 for e in out.events[1:])


def test_oracle_max_new_tokens_mid_path(tiny_pair, frequent_ids, engine, prompts):
    prompt = prompts[7]
    for budget in (1, 2, 4, 9, 13):
        ref = engine.generate(prompt, method="ar", max_new_tokens=budget)
        eng = _oracle_engine(tiny_pair, frequent_ids, engine.generate(prompt, method="ar", max_new_tokens=40).token_ids)
        out = eng.generate(prompt, method="hybrid", max_new_tokens=budget, depth=5, top_k=3, total_tokens=16, **SMALL)
        assert out.token_ids == ref.token_ids
        assert len(out.token_ids) == budget
        assert out.summary.stop_reason == "max_new_tokens"


def test_oracle_long_run_kv_stays_consistent(tiny_pair, frequent_ids, engine, prompts):
    """200 tokens through many long accepted paths: any KV compaction error would diverge."""
    prompt = prompts[0]
    ref = engine.generate(prompt, method="ar", max_new_tokens=200)
    eng = _oracle_engine(tiny_pair, frequent_ids, ref.token_ids, decoys=3)
    out = eng.generate(prompt, method="nanospec", max_new_tokens=200, depth=7, top_k=4, total_tokens=32, **SMALL, budget=False)
    assert out.token_ids == ref.token_ids
    assert out.summary.tau > 7.0
