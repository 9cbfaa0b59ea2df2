"""Every bad input raises ValueError naming the parameter and the allowed range, before model work."""

from __future__ import annotations

import pytest
import torch

from nanospec.decoding.engine import SpecEngine
from nanospec.heads.head import EagleHead, head_config_from_target
from nanospec.bench.random_pair import random_target_config

CASES = [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(depth=0), "depth"),
    (dict(top_k=0), "top_k"),
    (dict(total_tokens=1), "total_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(capacity=0), "capacity"),
    (dict(bogus=3), "bogus"),
]


@pytest.mark.parametrize("options,name", CASES)
def test_bad_options(engine, options, name):
    with pytest.raises(ValueError, match=name):
        engine.stream([1, 2, 3], method="nanospec", **options)


def test_unknown_method(engine):
    with pytest.raises(ValueError, match="method must be one of"):
        engine.stream([1, 2, 3], method="medusa")


def test_empty_prompts(engine):
    for bad in ("", "   ", [], [{"role": "user", "content": ""}]):
        with pytest.raises(ValueError, match="prompt"):
            engine.stream(bad, method="ar")


def test_prompt_longer_than_context(engine):
    with pytest.raises(ValueError, match="context"):
        engine.stream([5] * 600, method="full")


def test_token_ids_out_of_range(engine):
    with pytest.raises(ValueError, match=r"\[0, 32000\)"):
        engine.stream([1, 32000], method="ar")


def test_head_mismatch(tiny_pair):
    target, _ = tiny_pair
    wrong_h = head_config_from_target(random_target_config(32000, 96, 1, heads=3))
    with pytest.raises(ValueError, match="hidden size"):
        SpecEngine(target, None, EagleHead(wrong_h))
    wrong_v = head_config_from_target(random_target_config(1000, 64, 1, heads=2))
    with pytest.raises(ValueError, match="vocabulary"):
        SpecEngine(target, None, EagleHead(wrong_v))


def test_methods_needing_a_head_or_table(tiny_pair):
    target, head = tiny_pair
    with pytest.raises(ValueError, match="needs a draft head"):
        SpecEngine(target, None, None).stream([1, 2], method="nanospec")
    with pytest.raises(ValueError, match="frequency table"):
        SpecEngine(target, None, head).stream([1, 2], method="static")


def test_validation_happens_before_model_work(tiny_pair, monkeypatch):
    target, head = tiny_pair
    calls = []
    monkeypatch.setattr(target.model, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError):
        SpecEngine(target, None, head).stream([1, 2], method="full", depth=0)
    assert calls == [] and torch.is_grad_enabled()
