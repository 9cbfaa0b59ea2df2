"""Shared fixtures: a tiny random Llama target with a 32k vocabulary and a random EAGLE head.

The engine tests run on `NANOSPEC_TEST_DEVICE` (default cpu; e.g. `NANOSPEC_TEST_DEVICE=cuda`),
in fp32 with TF32 off, where every method must equal `ar` token for token on any device.
"""

from __future__ import annotations

import os

import pytest
import torch

from nanospec.decoding.engine import SpecEngine
from nanospec.bench.random_pair import random_head, random_target, random_target_config

VOCAB = 32000
DEVICE = torch.device(os.environ.get("NANOSPEC_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
requires_cuda = pytest.mark.skipif(DEVICE.type != "cuda",
                                   reason="CUDA only: run with NANOSPEC_TEST_DEVICE=cuda on a machine with a GPU")


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """The random models here are a few kilobytes: a second torch thread only adds the threads' hand-off
    to every op (measured: 5x slower per request while another job held a core). Tests on the real
    default pair (marked `integration` or `browser`) keep torch's thread count, which their figures and
    cached cost curves are keyed by."""
    if DEVICE.type != "cpu" or any(request.node.get_closest_marker(m) is not None for m in ("integration", "browser")):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_pair():
    cfg = random_target_config(VOCAB, 64, 2, heads=2, kv_heads=1, intermediate=128, max_positions=512)
    target = random_target(cfg, seed=0).to(DEVICE)  # built on the CPU: the same weights on every device
    head = random_head(target.config, seed=1).to(DEVICE)
    return target, head


@pytest.fixture(scope="session")
def frequent_ids():
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))


@pytest.fixture()
def engine(tiny_pair, frequent_ids):
    target, head = tiny_pair
    return SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=[])


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(11)
    out = []
    for i in range(20):
        n = 4 + (i * 7) % 27
        # repeated spans make the in-context vocabulary matter
        base = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        out.append(base + base[: n // 2])
    return out
