"""CUDA-only checks (skipped on CPU): the side-stream row gather, the CUDA-event timer, one sync per step."""

from __future__ import annotations

import pytest
import torch

from nanospec.bench.gpu_bench import count_per_step
from nanospec.config import GenerationConfig
from nanospec.timing import PhaseTimer
from nanospec.vocab import ActiveVocab, FullVocab

from .conftest import DEVICE, requires_cuda

pytestmark = requires_cuda


def test_side_stream_gather_is_awaited_before_the_lm_head():
    weight = torch.randn(1000, 64, device=DEVICE)
    vocab = ActiveVocab(weight, None, capacity=64)
    assert vocab.stream is not None
    prop = vocab.propose(torch.tensor([5, 900, 5, 17], device=DEVICE))
    assert vocab.commit(prop, 3) == 3 and vocab.ready is not None  # gather queued on the side stream
    vocab.wait_ready()                                              # compute stream waits on its event
    h = torch.randn(2, 64, device=DEVICE)
    ids = vocab.slot_ids(torch.arange(vocab.size, device=DEVICE))
    assert torch.allclose(vocab.logits(h), FullVocab(weight).logits(h)[:, ids])


def test_cuda_event_timer_resolves_once_per_step():
    timer = PhaseTimer(DEVICE)
    a = torch.randn(512, 512, device=DEVICE)
    with timer.phase("lm_head"):
        for _ in range(10):
            a = a @ a.T / 512
    phases = timer.resolve()
    assert timer.cuda and phases["lm_head"] > 0 and not timer._events


@pytest.mark.parametrize("copy_branch", [0, 6])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("method", ["ar", "full", "static", "nanospec", "hybrid"])
def test_cuda_syncs_one_per_step(engine, prompts, method, temperature, copy_branch):
    """Timer off: the step's one transfer is its only sync (torch's sync debug mode sees every other)."""
    cfg = GenerationConfig.build(method, max_new_tokens=8, temperature=temperature, capacity=256, core_size=128,
                                 static_size=4096, copy_branch=copy_branch)
    engine.timing = False
    try:
        counts = count_per_step(engine, prompts[3], cfg, cuda_syncs=True)
    finally:
        engine.timing = True
    assert counts and all(c == 1 for c in counts), counts


@pytest.mark.parametrize("method", ["ar", "nanospec"])
def test_cuda_timer_adds_one_event_wait_per_step(engine, prompts, method):
    cfg = GenerationConfig.build(method, max_new_tokens=8, capacity=256, copy_branch=6)
    kinds: dict = {}
    counts = count_per_step(engine, prompts[3], cfg, cuda_syncs=True, kinds=kinds)
    assert counts and all(c == 2 for c in counts), (counts, kinds)
    assert all(w == 1 for w in kinds["event_wait"]), kinds
