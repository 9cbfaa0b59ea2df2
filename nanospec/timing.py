"""One phase timer: CUDA events on GPU (resolved once per step), perf_counter on CPU; and `metered`, which
says whether a timed block had the machine to itself."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

PHASES = (
    "draft_layers", "lm_head", "gather_wait", "topk", "copy_lookup", "retrieval_lookup", "tree_build",
    "verify_forward", "accept", "kv_compact", "vocab_update", "budget",
)
DRAFT_PHASES = ("draft_layers", "lm_head", "gather_wait", "topk", "copy_lookup", "retrieval_lookup")
MIN_CPU_SHARE = 0.75  # a timing during which the process computed less than this was sharing the machine


@dataclass
class Meter:
    """A block's wall time and the share of it this process computed: CPU time / (wall x torch threads);
    another job on the machine lowers it (on a CPU device; a GPU's work is not counted)."""

    wall_s: float = 0.0
    cpu_share: float = 1.0


@contextmanager
def metered():
    """Wall time and CPU share of the block: `with metered() as m: ...; m.cpu_share`."""
    m = Meter()
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        yield m
    finally:
        m.wall_s = time.perf_counter() - w0
        m.cpu_share = (time.process_time() - c0) / max(m.wall_s, 1e-9) / max(torch.get_num_threads(), 1)


class PhaseTimer:
    """Accumulates milliseconds per phase for one step.

    CPU: `perf_counter` around each phase. CUDA: a pair of events per phase entry, recorded on
    the current stream; `resolve()` synchronises once (at the end of the step) and reads them.
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.enabled = enabled
        self._cpu: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        self._cpu = {}
        self._events = []

    @contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._cpu[name] = self._cpu.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

    def resolve(self) -> dict[str, float]:
        """Milliseconds per phase for the step (every phase in PHASES present, 0 if unused)."""
        out = {p: 0.0 for p in PHASES}
        for name, ms in self._cpu.items():
            out[name] = out.get(name, 0.0) + ms
        if self._events:
            self._events[-1][2].synchronize()
            for name, start, end in self._events:
                out[name] = out.get(name, 0.0) + start.elapsed_time(end)
        self.reset()
        return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_overhead(device: torch.device | str = "cpu", n: int = 2000) -> float:
    """Cost of one empty `phase()` entry plus its share of `resolve()`, in microseconds."""
    timer = PhaseTimer(device)
    sync(timer.device)
    t0 = time.perf_counter()
    for i in range(n):
        with timer.phase(PHASES[i % len(PHASES)]):
            pass
        if i % len(PHASES) == len(PHASES) - 1:
            timer.resolve()
    timer.resolve()
    sync(timer.device)
    return (time.perf_counter() - t0) / n * 1e6
