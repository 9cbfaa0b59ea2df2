"""Hugging Face ZeroGPU, done by its documented rules (used only when the `spaces` package is present).

- The pairs a Space serves load in the main process, from `app.py`'s top level, straight onto `cuda`
  (ZeroGPU emulates the device there); the picker then only switches among those loaded pairs.
- Decoding runs only inside a function decorated with `spaces.GPU(duration=...)`; the duration comes
  from the run's max new tokens and tree size, so short runs ask for less GPU time and queue first.
- That function yields plain CPU data (`StepEvent` / `RunSummary`: ints, floats, lists) and runs in the
  request's own thread: no decode thread, no CUDA work on any other thread.

Elsewhere the app keeps its single decode thread (app/decoding.py), which measured faster on CPU.

What ZeroGPU supports, and so what the Space pins (docs/space.md, "ZeroGPU pins"; checked by
tests/test_zerogpu.py): Python `SUPPORTED_PYTHON` (README front matter `python_version`) and torch in
`SUPPORTED_TORCH` (requirements.txt, under a marker for the Space's Python), no `torch.compile`. Device
queries (`torch.cuda.current_device`, `is_bf16_supported`, device properties/name, streams, events,
`synchronize`) belong inside the decorated function only; the main process never initialises CUDA
(loading a pair on `cuda` asks `current_device()` / `is_bf16_supported()`, which ZeroGPU's `spaces`
answers in the main process without a GPU: tolerated, see docs/space.md).
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Callable, Iterator

SUPPORTED_PYTHON = ("3.10", "3.12")   # ZeroGPU's Python versions (at the time of writing)
SUPPORTED_TORCH = ">=2.8,<2.12"       # ZeroGPU's torch versions: 2.8 to 2.11 (at the time of writing)

MIN_DURATION_S = 15
MAX_DURATION_S = 120
SECONDS_PER_STEP = 0.05       # one draft + verify step of an 8B pair on a ZeroGPU slice, generous
SECONDS_PER_TREE_NODE = 0.0005
LOAD_MARGIN_S = 10            # first CUDA use in a fresh GPU worker


def active() -> bool:
    """True on a ZeroGPU Space (the `spaces` package can be imported)."""
    return importlib.util.find_spec("spaces") is not None


def decode_duration(max_new_tokens: int, total_tokens: int) -> int:
    """GPU seconds to ask for: every new token may cost a full step (worst case, nothing accepted)."""
    per_step = SECONDS_PER_STEP + SECONDS_PER_TREE_NODE * total_tokens
    return int(min(MAX_DURATION_S, max(MIN_DURATION_S, math.ceil(LOAD_MARGIN_S + max_new_tokens * per_step))))


def gpu_decoder(decode: Callable[[object, dict], Iterator]) -> Callable[[object, dict], Iterator]:
    """`decode(prompt, options)` decorated with `spaces.GPU(duration=...)`; unchanged without `spaces`."""
    if not active():
        return decode
    import spaces  # type: ignore[import-not-found]

    def duration(prompt, options: dict) -> int:
        return decode_duration(int(options.get("max_new_tokens", 64)), int(options.get("total_tokens", 12)))

    return spaces.GPU(duration=duration)(decode)


class InlinePump:
    """`StepPump`'s interface, iterating the steps in the calling thread (ZeroGPU: the request's thread)."""

    def __init__(self, steps: Iterator):
        self._steps = steps
        self._stop = threading.Event()

    def batches(self) -> Iterator[list]:
        try:
            for item in self._steps:
                yield [item]
                if self._stop.is_set():
                    break
        finally:
            close = getattr(self._steps, "close", None)
            if close is not None:
                close()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        return True


def preload(provider, names: list[str]) -> None:
    """Load each named pair now, in the main thread (call from `app.py`'s top level), and make the
    provider switch among these loaded pairs only."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("ZeroGPU: pairs must load in the main thread at startup, not on another thread")
    unknown = [name for name in names if name not in provider.loaders]
    if unknown:
        raise ValueError(f"unknown pair(s) {unknown}; choose among: {', '.join(provider.loaders)}")
    loaded = {name: provider.loaders[name](None) for name in names}
    provider.loaders = {name: (lambda pair: (lambda progress=None: pair))(pair) for name, pair in loaded.items()}
    provider.labels = {name: provider.labels[name] for name in names}
    current = provider.current if provider.current in loaded else names[0]
    provider.current, provider._loader, provider._pair = current, provider.loaders[current], loaded[current]
