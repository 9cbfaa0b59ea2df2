"""What a GPU would show, seen on a CPU: one host read per decoding step and no other sync.

Every decoding step runs under `sync_guard.SyncGuard`, which names every operation that would make
a CUDA device wait for the host (a value read, a data-dependent shape, host data copied in, a
Python scalar written into a tensor, a factory call without a device). The engine runs the GPU's
code path: fixed-shape trees (`fixed_shape=True`, what any non-CPU device always does) and no CPU
weight packing. Covered: every method, EAGLE-2 and EAGLE-3 heads, the copy chain on and off,
greedy and sampling, the phase timer off and on (on: its CUDA code with stand-in events, whose one
wait per step must come after the step's one read).

The guard itself is tested first: each kind of sync injected into a step, including a `.item()`
inside the target's own attention, must be seen.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from nanospec.decoding import engine as engine_module
from nanospec.bench.random_pair import random_eagle3_head, random_head, random_target, random_target_config
from nanospec.decoding.cost_curve import CostCurve
from nanospec.decoding.engine import SpecEngine
from nanospec.timing import PhaseTimer

from .conftest import VOCAB
from .sync_guard import SyncGuard


SMALL = dict(capacity=256, static_size=4096, core_size=128, depth=3, top_k=4, total_tokens=12)
METHODS = ("full", "static", "nanospec", "hybrid")


@pytest.fixture(scope="module")
def eagle3_pair():
    cfg = random_target_config(VOCAB, 64, 6, heads=2, kv_heads=1, intermediate=128, max_positions=512)
    target = random_target(cfg, seed=0)
    return target, random_eagle3_head(target.config, torch.randperm(VOCAB)[:3000], seed=1)


@pytest.fixture(scope="module")
def eagle2_pair():
    cfg = random_target_config(VOCAB, 64, 2, heads=2, kv_heads=1, intermediate=128, max_positions=512)
    target = random_target(cfg, seed=0)
    return target, random_head(target.config, seed=1)


@pytest.fixture(scope="module")
def engines(eagle2_pair, eagle3_pair, frequent_ids):
    """One engine per head family, on the CPU whatever NANOSPEC_TEST_DEVICE says (the guard stands in
    for a GPU; on one, test_device.py counts the real syncs), built as on a GPU: no weight packing."""
    engines = {family: SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=[], pack_linears=False)
               for family, (target, head) in (("eagle2", eagle2_pair), ("eagle3", eagle3_pair))}
    for eng in engines.values():
        eng.cost_curve(64)  # the draft budget's cost curve, measured (or read) here, not inside a guarded run
    return engines


@pytest.fixture(scope="module")
def prompt(prompts):
    return prompts[7]  # repeated spans: the copy chain finds matches


class _StandInEvent:
    """torch.cuda.Event for a CPU run of the CUDA timer: `synchronize` is the host wait it would be."""

    guard: SyncGuard | None = None

    def __init__(self, enable_timing: bool = False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        if self.guard is not None:
            self.guard.note("cuda event synchronize", kind="wait")

    def elapsed_time(self, other) -> float:
        return 0.0


@contextmanager
def cuda_timer(guard: SyncGuard):
    """The engine's phase timer in its CUDA mode (events, one resolve per step) on this CPU."""
    _StandInEvent.guard = guard
    with mock.patch.object(torch.cuda, "Event", _StandInEvent), \
            mock.patch.object(engine_module, "PhaseTimer", lambda device, enabled: PhaseTimer("cuda", enabled)):
        yield


def guarded_steps(eng: SpecEngine, prompt, timer: str = "off", **options) -> list[list]:
    """Run one request under the guard; the records of each decoding step (prefill excluded)."""
    guard = SyncGuard()
    eng.before_step = lambda step, method: guard.mark(f"step {step}")
    eng.timing = timer != "off"
    try:
        with (cuda_timer(guard) if timer == "cuda" else _nothing()), guard.watching():
            guard.mark("prefill")
            eng.generate(prompt, max_new_tokens=8, **options)
    finally:
        eng.before_step, eng.timing = None, True
    steps = [records for _, records in guard.per_mark()[1:]]
    assert len(steps) >= 3, "the run must take several decoding steps"
    return steps


@contextmanager
def _nothing():
    yield


def _describe(records) -> str:
    return "\n".join(f"  {r.kind}: {r.what} @ {r.where}" for r in records if r.kind != "read")


def assert_one_read_per_step(steps, waits: int = 0) -> None:
    for i, records in enumerate(steps, 1):
        kinds = [r.kind for r in records]
        assert kinds == ["read"] + ["wait"] * waits, f"step {i}: expected one read then {waits} timer " \
            f"wait(s), got {kinds}:\n{_describe(records)}"


# -- the engine ----------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("copy_branch", [0, 6])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["eagle2", "eagle3"])
def test_speculative_steps_read_the_host_once(engines, prompt, family, method, copy_branch, temperature):
    steps = guarded_steps(engines[family], prompt, method=method, temperature=temperature,
                          copy_branch=copy_branch, fixed_shape=True, **SMALL)
    assert_one_read_per_step(steps)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("method", ["full", "nanospec", "hybrid"])
@pytest.mark.parametrize("family", ["eagle2", "eagle3"])
def test_budgeted_steps_read_the_host_once(engines, prompt, family, method, temperature):
    """The draft budget decides on the device: selecting, disabling the pruned nodes and learning
    from the accepted path add no read (a made-up steep cost curve makes it prune)."""
    eng = engines[family]
    measured = eng.cost_curve()
    eng.use_cost_curve(CostCurve([1, 2, 4, 8, 16, 32], [10.0 + 3 * n for n in (1, 2, 4, 8, 16, 32)], {}))
    try:
        steps = guarded_steps(eng, prompt, method=method, temperature=temperature, copy_branch=6,
                              fixed_shape=True, budget=True, **SMALL)
    finally:
        eng.use_cost_curve(measured)
    assert_one_read_per_step(steps)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_autoregressive_steps_read_the_host_once(engines, prompt, temperature):
    assert_one_read_per_step(guarded_steps(engines["eagle2"], prompt, method="ar", temperature=temperature))


@pytest.mark.parametrize("method", ["ar", "nanospec", "hybrid"])
@pytest.mark.parametrize("family", ["eagle2", "eagle3"])
def test_cuda_timer_waits_once_per_step_after_the_read(engines, prompt, family, method):
    """Timer on: its CUDA events are resolved once per step, after the step's one transfer."""
    steps = guarded_steps(engines[family], prompt, timer="cuda", method=method, copy_branch=6,
                          fixed_shape=True, temperature=0.8, **SMALL)
    assert_one_read_per_step(steps, waits=1)


def test_cpu_timer_adds_no_sync(engines, prompt):
    steps = guarded_steps(engines["eagle2"], prompt, timer="cpu", method="nanospec", copy_branch=6,
                          fixed_shape=True, **SMALL)
    assert_one_read_per_step(steps)


def test_prefill_reads_twice_and_copies_only_the_prompt(engines, prompt):
    """Prefill (once per request, not a step) reads the first token and the Ctx count; the host data
    it sends are the prompt and first token (engine, drafter, copy chain), the draft budget's prices
    (the cost curve, one small copy) and the empty tensors transformers' cache starts each layer with."""
    guard = SyncGuard()
    with guard.watching():
        engines["eagle2"].generate(prompt, method="nanospec", max_new_tokens=1, copy_branch=6, fixed_shape=True,
                                   **SMALL)
    assert [r.kind for r in guard.records if r.kind != "sync"] == ["read", "read"]
    places = {r.where.split(" <- ")[0].split(" ")[-1] for r in guard.syncs}
    assert all("host data" in r.what for r in guard.syncs), _describe(guard.syncs)
    assert places <= {"_prefill", "begin", "lazy_initialization", "__init__"}, _describe(guard.syncs)
    inits = [r for r in guard.syncs if r.where.split(" <- ")[0].endswith(" __init__")]
    assert len(inits) == 1 and "budget.py" in inits[0].where.split(" <- ")[0], _describe(inits)


def test_the_cpu_shape_drops_pad_nodes_with_a_data_dependent_shape(engines, prompt):
    """Without `fixed_shape` a CPU drops the copy chain's PAD nodes: the guard names that path,
    which is why an accelerator never takes it."""
    steps = guarded_steps(engines["eagle2"], prompt, method="nanospec", copy_branch=6, budget=False, **SMALL)
    seen = [r for records in steps for r in records if r.kind == "sync"]
    assert seen and all("drop_pad_nodes" in r.where or "extend" in r.where for r in seen), _describe(seen)


def test_the_cpu_shape_budget_reads_only_where_it_prunes(engines, prompt):
    """On a CPU's shape the draft budget drops the nodes it prunes and stops drafting early: both
    read the host (keep_nodes, keep_drafting), and nothing else of the budget does."""
    eng = engines["eagle2"]
    measured = eng.cost_curve()
    eng.use_cost_curve(CostCurve([1, 2, 4, 8, 16, 32], [10.0 + 3 * n for n in (1, 2, 4, 8, 16, 32)], {}))
    try:
        steps = guarded_steps(eng, prompt, method="nanospec", copy_branch=6, budget=True, **SMALL)
    finally:
        eng.use_cost_curve(measured)
    seen = [r for records in steps for r in records if r.kind == "sync"]
    places = ("drop_pad_nodes", "extend", "keep_nodes", "keep_drafting")
    assert seen and all(any(p in r.where for p in places) for r in seen), _describe(seen)
    assert any("keep_nodes" in r.where or "keep_drafting" in r.where for r in seen), _describe(seen)


# -- the guard sees every kind of sync ------------------------------------------------------

def _inject(target_obj, name, extra):
    real = getattr(target_obj, name)

    def patched(*args, **kwargs):
        out = real(*args, **kwargs)
        extra(out)
        return out
    return mock.patch.object(target_obj, name, patched)


INJECTIONS = {
    "item() inside the target's attention": lambda: _inject(torch.nn.functional, "scaled_dot_product_attention",
                                                            lambda out: out.sum().item()),
    "tolist() in the acceptance": lambda: _inject(engine_module, "greedy_token", lambda out: out.tolist()),
    "bool() of a tensor": lambda: _inject(engine_module, "tree_attention_mask", lambda out: bool(out.any())),
    "boolean-mask indexing": lambda: _inject(engine_module, "tree_position_ids", lambda out: out[out > 0]),
    "nonzero": lambda: _inject(engine_module, "tree_position_ids", lambda out: out.nonzero()),
    "a Python scalar written into a tensor": lambda: _inject(engine_module, "tree_position_ids",
                                                              lambda out: out.clone().__setitem__(0, 3)),
    "torch.tensor(host data)": lambda: _inject(engine_module, "tree_position_ids",
                                               lambda out: torch.tensor([1, 2], device=out.device)),
    "a factory without device=": lambda: _inject(engine_module, "tree_position_ids", lambda out: torch.arange(3)),
}


@pytest.mark.parametrize("what", list(INJECTIONS))
def test_the_guard_sees_an_injected_sync(engines, prompt, what):
    with INJECTIONS[what]():
        steps = guarded_steps(engines["eagle2"], prompt, method="nanospec", copy_branch=6, fixed_shape=True,
                              **SMALL)
    with pytest.raises(AssertionError):
        assert_one_read_per_step(steps)


def test_the_guard_sees_an_injected_sync_in_an_autoregressive_step(engines, prompt):
    with INJECTIONS["item() inside the target's attention"]():
        steps = guarded_steps(engines["eagle2"], prompt, method="ar")
    assert all(any(r.kind == "sync" and "item()" in r.what and "attention" in r.where for r in s) for s in steps), \
        [_describe(s) for s in steps[:1]]


def test_the_guard_sees_a_second_transfer(engines, prompt):
    from nanospec import transfer
    with _inject(engine_module, "tree_position_ids", lambda out: transfer.to_host(out)):
        steps = guarded_steps(engines["eagle2"], prompt, method="full", fixed_shape=True, **SMALL)
    assert all([r.kind for r in s] == ["read", "read"] for s in steps)
