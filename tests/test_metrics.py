"""`nanospec.metrics`: each metric on hand-made steps, and the frame and event paths agree."""

from __future__ import annotations

import math

import pytest

from nanospec import metrics
from nanospec.events import events_to_frame, summarize
from tests.test_app_charts import make_events


def test_tau_is_mean_tokens_per_step():
    assert metrics.tau([3, 1, 2]) == 2.0
    assert math.isnan(metrics.tau([]))


def test_coverage_counts_accepted_tokens_and_the_bonus_flag():
    # step 1: 2 accepted + bonus in the set (3/3); step 2: bonus outside (0/1); step 3 drafted nothing
    assert metrics.step_coverage(2, True) == (3, 3)
    assert metrics.step_coverage(0, False) == (0, 1)
    assert metrics.step_coverage(5, None) == (0, 0)
    assert metrics.step_coverage(5, float("nan")) == (0, 0)  # None after a frame round trip
    assert metrics.coverage([2, 0, 4], [True, False, None]) == pytest.approx(0.75)
    assert metrics.running_coverage([4, 2, 0], [None, True, False]) == [None, 1.0, pytest.approx(0.75)]
    assert metrics.coverage([1], [None]) is None
    assert metrics.coverage([], []) is None


def test_speedup_and_identical_to_ar():
    assert metrics.speedup(30.0, 20.0) == 1.5
    for ar in (None, 0.0):
        assert math.isnan(metrics.speedup(30.0, ar))
    assert metrics.identical_to_ar([1, 2, 3], [1, 2, 3]) is True
    assert metrics.identical_to_ar([1, 2], [1, 2, 3]) is False
    assert metrics.identical_to_ar([[1, 2], [3]], [[1, 2]]) is False  # one output per prompt, same number
    assert metrics.identical_to_ar([1, 2], [1, 2], greedy=False) is None


def test_token_origins_per_step_and_extensible():
    h, b, v = metrics.ORIGIN_HEAD, metrics.ORIGIN_BONUS, metrics.ORIGIN_VOCAB_MISS
    assert metrics.step_origins(2, 3, True) == [h, h, b]
    assert metrics.step_origins(0, 1, False) == [v]
    assert metrics.step_origins(0, 1, None) == [b]  # plain decoding: every token is the target's own
    assert metrics.step_origins(2, 2, True) == [h, h]  # cut at EOS before the bonus
    assert metrics.step_origins(2, 3, True, accepted_origins=["copy", "copy"]) == ["copy", "copy", b]
    with pytest.raises(ValueError, match="accepted 2"):
        metrics.step_origins(2, 3, True, accepted_origins=["copy"])


def test_event_origins_follow_node_sources_and_the_bonus_flag():
    prefill, step1, step2 = make_events()
    assert metrics.event_origins(prefill) == [metrics.ORIGIN_BONUS]  # prefill / ar: the target's own token
    assert metrics.event_origins(step1) == ["head", "head", "bonus"]  # no tree_sources (older trace): head
    assert metrics.event_origins(step2) == ["vocab_miss"]              # coverage False, miss_kind vocab
    # tree 0 -> 1 (copy) -> 3 (both); node 2 head; path 0-1-3, bonus in the set
    step1.tree_sources = ["root", "copy", "head", "both", "head"]
    assert metrics.event_origins(step1) == ["copy", "both", "bonus"]
    step1.tokens = [11, 13]  # cut at EOS / budget before the bonus
    assert metrics.event_origins(step1) == ["copy", "both"]
    step1.tokens, step1.coverage = [11, 13, 15], False  # path ended at a leaf on a token outside the set
    assert metrics.event_origins(step1) == ["copy", "both", "vocab_miss"]
    assert set(metrics.ORIGINS) == {"head", "copy", "both", "retrieved", "bonus", "vocab_miss"}
    assert all(o in metrics.ORIGINS for e in make_events() for o in metrics.event_origins(e))


def test_event_origins_agree_with_the_run_on_a_random_pair(engine, prompts):
    """A real run with the copy chain: accepted tokens carry their node's source, then the bonus."""
    from tests.test_copy_branch_engine import self_repeating_prompts

    seen = set()
    for prompt in self_repeating_prompts(engine.vocab_size)[:4] + prompts[:2]:
        out = engine.generate(prompt, method="nanospec", max_new_tokens=16, depth=3, top_k=4, total_tokens=12,
                              copy_branch=4, capacity=64)
        for e in out.events[:-1]:  # the last step may be cut by the budget
            bonus = metrics.ORIGIN_VOCAB_MISS if e.coverage is False else metrics.ORIGIN_BONUS
            assert metrics.event_origins(e) == e.accepted_sources() + [bonus]
        origins = [o for e in out.events for o in metrics.event_origins(e)]
        assert len(origins) == out.summary.new_tokens
        misses = origins.count(metrics.ORIGIN_VOCAB_MISS)  # the last step's bonus may be cut
        assert sum(e.coverage is False for e in out.events[1:-1]) <= misses <= sum(e.coverage is False for e in out.events[1:])
        seen |= set(origins)
    assert {metrics.ORIGIN_COPY, metrics.ORIGIN_BONUS} <= seen, "the run should exercise copied tokens"


def test_frame_and_events_give_the_same_numbers():
    events = make_events()
    frame = events_to_frame(events)
    decode = frame[frame["step"] > 0]
    summary = summarize(events, "nanospec", 0.5, "max_new_tokens")
    assert metrics.coverage(decode["n_accepted"], decode["coverage"]) == pytest.approx(summary.coverage)
    assert metrics.tau(decode["n_emitted"].tolist()) == pytest.approx(summary.tau)
    origins = metrics.token_origins(frame["n_accepted"], frame["n_emitted"], frame["coverage"])
    assert len(origins) == summary.new_tokens


def test_run_summary_and_compare_table_agree_on_one_run(engine, prompts, monkeypatch):
    """The KPIs (`events.summarize`) and `compare`'s table give the same τ, tokens/s, mean active size
    and coverage for the same run: both take them from `nanospec.metrics`."""
    from nanospec.bench.compare import compare

    runs = []
    generate = engine.generate

    def recording(*args, **kwargs):
        result = generate(*args, **kwargs)
        runs.append(result)
        return result

    monkeypatch.setattr(engine, "generate", recording)
    table = compare(engine, [prompts[3]], ["nanospec", "static"], {"max_new_tokens": 14, "copy_branch": 3})
    timed = runs[len(table): 2 * len(table)]  # after one warm-up generation per method (then ar once more)
    assert len(timed) == len(table) == 3
    for row, run in zip(table, timed):
        s = run.summary
        assert row["method"] == s.method and row["new_tokens"] == s.new_tokens and s.steps > 0
        assert row["tau"] == s.tau == metrics.tau(e.n_emitted for e in run.events[1:])
        assert row["tokens_per_s"] == s.tokens_per_s
        assert row["coverage"] == s.coverage
        if row["method"] != "ar":
            assert row["mean_active"] == s.mean_active > 0 and row["active_frac"] == s.active_frac
            assert s.coverage is not None
    assert table[0]["tau"] == 1.0 and table[0]["coverage"] is None


def test_empty_runs_follow_one_convention():
    prefill_only = make_events()[:1]
    s = summarize(prefill_only, "nanospec", 0.0, "max_new_tokens")
    assert s.steps == 0 and s.new_tokens == 1 and s.coverage is None
    for value in (s.tau, s.mean_active, s.tokens_per_s, s.draft_ms_per_step):
        assert math.isnan(value)
    for value in (metrics.tau([]), metrics.mean_tau([]), metrics.mean_tau([math.nan]), metrics.mean_active([]),
                  metrics.tokens_per_s(5, 0.0), metrics.mean([])):
        assert math.isnan(value)
    assert metrics.mean_tau([2.0, math.nan, 3.0]) == 2.5  # a prompt without a decode step has no τ
    assert metrics.tokens_per_s(6, 2.0) == 3.0 and metrics.mean_active([4, 6]) == 5.0


def test_accepted_depth_counts():
    from nanospec.metrics import accepted_depth_counts
    assert accepted_depth_counts([0, 2, 1, 3, 0]) == [5, 3, 2, 1]
    assert accepted_depth_counts([0, 1], max_depth=3) == [2, 1, 0, 0]
    assert accepted_depth_counts([]) == [0]


def test_break_even_tau_and_modelled_speedup_agree():
    from nanospec.metrics import break_even_tau, modelled_speedup

    # a plain step of 30 ms; a speculative step of 40 (verify) + 6 (draft) + 2 (bookkeeping) = 48 ms
    assert break_even_tau(30.0, 40.0, 6.0, 2.0) == pytest.approx(1.6)
    assert modelled_speedup(1.6, 30.0, 40.0, 6.0, 2.0) == pytest.approx(1.0)   # at break-even: a tie
    assert modelled_speedup(2.4, 30.0, 40.0, 6.0, 2.0) == pytest.approx(1.5)
    assert modelled_speedup(1.2, 30.0, 40.0, 6.0, 2.0) < 1.0                    # below it: slower than plain
    assert math.isnan(break_even_tau(0.0, 40.0, 6.0)) and math.isnan(modelled_speedup(2.0, 30.0, 0.0, 0.0))
