"""Judging a round's head against the shipped one (`training/judge.py`) on the tiny random pair: the shape of
the run and the verdict's rule; no figure is timed here."""

from __future__ import annotations

import pytest

from nanospec.bench.random_pair import random_head
from nanospec.decoding.engine import SpecEngine
from nanospec.training.judge import HeadRun, judge_set, load_sets, paired, report, verdict


def _candidate(engine, tiny_pair, frequent_ids) -> SpecEngine:
    """A second engine on the tiny target, with another random head: the round's candidate."""
    target, _ = tiny_pair
    return SpecEngine(target, None, random_head(target.config, seed=2).to(engine.device),
                      frequent_ids=frequent_ids, eos_token_ids=[])


def test_both_heads_run_every_prompt_against_the_same_ar(engine, tiny_pair, frequent_ids, prompts):
    other = _candidate(engine, tiny_pair, frequent_ids)
    ar_tps, runs = judge_set({"shipped": engine, "candidate": other}, prompts[:3], 8, categories=["a", "b", "a"])
    assert set(runs) == {"shipped", "candidate"} and ar_tps > 0
    for run in runs.values():
        assert len(run.speedups) == 3 and run.identical == 3   # every output equals ar's
        assert all(s > 0 for s in run.speedups) and 1.0 <= run.tau <= 9.0
        # one verified count and one wall time per decode step; a step verifies at least the root
        assert len(run.verified) == len(run.step_ms) == len(run.emitted)
        assert min(run.verified) >= 1 and run.verified_per_step >= 1.0 and run.ms_per_step > 0
        assert all(v >= e for v, e in zip(run.verified, run.emitted))  # never more emitted than verified
        assert [len(t) for t in run.tps] == [1, 1, 1] and all(t[0] > 0 for t in run.tps)
        assert len(run.accepted) == len(run.emitted) and all(0 <= a < v for a, v in zip(run.accepted, run.verified))
        # each category keeps one τ per prompt run: two for "a", one for "b", each a run's own
        assert set(run.by_category) == {"a", "b"} and len(run.by_category["a"]) == 2
        (b_tau,) = run.by_category["b"]
        assert 1.0 <= b_tau <= 8.0 and run.category_tau("b") == b_tau
        assert run.category_tau("a") == pytest.approx(sum(run.by_category["a"]) / 2)
    assert len(paired(runs["shipped"], runs["candidate"])) == 3


def _run(speedups, identical=None):
    return HeadRun(speedups=list(speedups), emitted=[2, 3], verified=[9, 7], step_ms=[50.0, 46.0],
                   identical=len(speedups) if identical is None else identical)


def test_a_round_ships_only_when_faster_on_every_set():
    both = {"heldout": (20.0, {"shipped": _run([1.5, 1.7]), "candidate": _run([1.6, 1.8])}),
            "outside": (21.0, {"shipped": _run([1.8]), "candidate": _run([1.9])})}
    assert verdict(both)[0] is True
    one = {**both, "outside": (21.0, {"shipped": _run([1.9]), "candidate": _run([1.8])})}
    ships, why = verdict(one)
    assert ships is False and "outside" in why and "heldout" not in why
    tie = {"heldout": (20.0, {"shipped": _run([1.6]), "candidate": _run([1.6])})}
    assert verdict(tie)[0] is False  # not faster: the shipped head stays
    wrong = {"heldout": (20.0, {"shipped": _run([1.5]), "candidate": _run([2.0], identical=0)})}
    ships, why = verdict(wrong)
    assert ships is False and "differs" in why


def test_the_report_names_each_head_and_the_verdict():
    results = {"heldout": (20.0, {"shipped": _run([1.5, 1.7]), "candidate": _run([1.6, 1.8])})}
    text = report(results, {"shipped": "S", "candidate": "C"}, "python -m nanospec.training.judge --candidate C",
                  "a CPU", 128)
    assert "| heldout (2) | candidate (`C`) | 20.00 | 1.70× | 2.50 | 8.0 | 48.0 | 2/2 |" in text
    assert "| heldout (2) | shipped (`S`) | 20.00 | 1.60× | 2.50 | 8.0 | 48.0 | 2/2 |" in text
    assert "Verdict: **ships" in text and "--candidate C" in text
    assert "τ by category" not in text   # no categories given: no table


def test_the_report_gives_each_category_tau_for_both_heads():
    shipped, candidate = _run([1.5]), _run([1.6])
    shipped.by_category = {"code": [3.0, 3.0], "math": [1.0, 2.0]}    # per-prompt τ
    candidate.by_category = {"code": [4.0, 4.0], "math": [2.0, 2.0]}
    text = report({"heldout": (20.0, {"shipped": shipped, "candidate": candidate})},
                  {"shipped": "S", "candidate": "C"}, "cmd", "a CPU", 8)
    assert "| heldout | code | 3.00 | 4.00 |" in text and "| heldout | math | 1.50 | 2.00 |" in text


def test_the_project_sets_come_with_their_categories():
    sets = load_sets("heldout")
    assert len(sets["heldout"]) == 14 and all(item["category"] for item in sets["heldout"])


def test_a_bad_or_empty_prompt_set_is_an_error_that_says_what_is_allowed():
    with pytest.raises(ValueError, match="split must be one of"):
        load_sets("no-such-split")
    with pytest.raises(ValueError, match="'outside' holds no prompts"):
        load_sets("heldout,outside")   # a split the project's prompt file has no prompts in


def test_budget_off_judges_both_heads_on_the_fixed_tree(engine, tiny_pair, frequent_ids, prompts, monkeypatch):
    other = _candidate(engine, tiny_pair, frequent_ids)
    seen = []
    for e in (engine, other):
        original = e.generate

        def recording(prompt, config=None, _original=original, **options):
            result = _original(prompt, config, **options)
            if options.get("method") == "nanospec":
                seen.append((options.get("budget"), [ev.expected_tokens for ev in result.events if not ev.is_prefill]))
            return result
        monkeypatch.setattr(e, "generate", recording)
    _, runs = judge_set({"shipped": engine, "candidate": other}, prompts[:2], 8, budget=False)
    assert all(r.identical == 2 for r in runs.values())
    assert len(seen) == 2 + 4 and all(budget is False for budget, _ in seen)   # warm-ups + 2 prompts x 2 heads
    assert all(x is None for _, expected in seen for x in expected)  # no step was priced by the budget
    text = report({"heldout": (20.0, runs)}, {"shipped": "S", "candidate": "C"}, "cmd", "a CPU", 8, budget=False)
    assert "fixed tree (draft budget off)" in text


def test_repeated_runs_give_one_speedup_per_prompt(engine, tiny_pair, frequent_ids, prompts):
    other = _candidate(engine, tiny_pair, frequent_ids)
    seen = []
    _, runs = judge_set({"shipped": engine, "candidate": other}, prompts[:2], 6, repeat=3,
                        progress=lambda i, n: seen.append((i, n)))
    assert seen[-1] == (6, 6) and len(seen) == 6       # every prompt three times
    for run in runs.values():
        assert len(run.speedups) == 2 and run.identical == 2   # one median per prompt, identical every time
        assert sum(run.emitted) == 3 * 2 * (6 - 1)            # every run's decode steps pooled for τ
    text = report({"heldout": (20.0, runs)}, {"shipped": "S", "candidate": "C"}, "cmd", "a CPU", 6, repeat=3)
    assert "3 runs per prompt" in text and "| heldout (2) |" in text


def test_heads_are_also_compared_prompt_by_prompt():
    shipped = HeadRun(speedups=[1.0, 1.0, 1.0], tps=[[20.0, 22.0], [30.0, 30.0], [40.0, 40.0]])
    candidate = HeadRun(speedups=[1.0, 1.0, 1.0], tps=[[22.0, 22.0], [27.0, 33.0], [36.0, 36.0]])
    # per prompt, the median of each run's candidate / shipped ratio (runs paired, not medians compared)
    assert paired(shipped, candidate) == pytest.approx([1.05, 1.0, 0.9])
    text = report({"outside": (20.0, {"shipped": shipped, "candidate": candidate})},
                  {"shipped": "S", "candidate": "C"}, "cmd", "a CPU", 8, repeat=2)
    assert "outside, prompt by prompt" in text and "median 1.000×, candidate faster on 1 of 3 prompts" in text


def test_the_report_says_how_deep_each_head_is_accepted():
    shipped = HeadRun(speedups=[1.5], emitted=[1] * 6, accepted=[0, 1, 2, 3, 4, 1], identical=1)
    candidate = HeadRun(speedups=[1.6], emitted=[1] * 6, accepted=[1, 1, 2, 2, 0, 0], identical=1)
    assert shipped.reach(4) == pytest.approx([5 / 6, 3 / 6, 2 / 6, 1 / 6])
    text = report({"heldout": (20.0, {"shipped": shipped, "candidate": candidate})},
                  {"shipped": "S", "candidate": "C"}, "cmd", "a CPU", 8)
    # share of steps reaching depth d, and (in brackets) of those reaching d - 1 the share that went on
    assert "| heldout | shipped | 0.83 (0.83) | 0.50 (0.60) | 0.33 (0.67) | 0.17 (0.50) |" in text
    assert "| heldout | candidate | 0.67 (0.67) | 0.33 (0.50) | 0.00 (0.00) | 0.00 (–) |" in text
