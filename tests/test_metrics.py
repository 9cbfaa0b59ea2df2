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


def test_frame_and_events_give_the_same_numbers():
    events = make_events()
    frame = events_to_frame(events)
    decode = frame[frame["step"] > 0]
    summary = summarize(events, "nanospec", 0.5, "max_new_tokens")
    assert metrics.coverage(decode["n_accepted"], decode["coverage"]) == pytest.approx(summary.coverage)
    assert metrics.tau(decode["n_emitted"].tolist()) == pytest.approx(summary.tau)
    origins = metrics.token_origins(frame["n_accepted"], frame["n_emitted"], frame["coverage"])
    assert len(origins) == summary.new_tokens
