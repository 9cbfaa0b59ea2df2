"""One model pair per process: a lazy, thread-safe loader shared by all sessions.

Nothing here loads at import time. `EngineProvider.get()` loads on first use (reporting progress)
and hands every later caller the same `(SpecEngine, PairInfo)`; `with_random_head` gives a target
without a trained head a random one (`python app.py --random-head`). Engines for tests and
development (a tiny random model, a slowed-down one) are in `app.dev.devtools`, which builds on this
module (never the other way round).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from nanospec import SpecEngine
from nanospec.pair import PairInfo
from nanospec.paths import ASSETS

ProgressFn = Callable[[str, "float | None"], None]
Loader = Callable[[ProgressFn | None], tuple[SpecEngine, PairInfo]]


class EngineProvider:
    """Loads the pair once (under a lock) and shares it; a failed load is retried on the next call."""

    def __init__(self, loader: Loader, device_hint: str | None = None):
        self._loader = loader
        self._lock = threading.Lock()
        self._pair: tuple[SpecEngine, PairInfo] | None = None
        self.device_hint = device_hint or ("cuda" if torch.cuda.is_available() else "cpu")

    def get(self, progress: ProgressFn | None = None) -> tuple[SpecEngine, PairInfo]:
        with self._lock:
            if self._pair is None:
                self._pair = self._loader(progress)
            return self._pair

    @property
    def loaded(self) -> tuple[SpecEngine, PairInfo] | None:
        return self._pair

    def describe(self) -> str:
        """One line of Markdown: the pair and the device, or that loading waits for the first run."""
        if self._pair is None:
            return (f"**Model:** not loaded yet — it loads on the first run (shown with progress) · "
                    f"**device:** {self.device_hint}")
        engine, info = self._pair
        head = _short_path(info.head) if info.head else "none (only `ar` runs)"
        if info.head and getattr(info, "head_family", None):
            head += f" ({'EAGLE-3' if info.head_family == 'eagle3' else 'EAGLE-1/2'})"
        notes = "".join(f" · {note}" for note in getattr(info, "notes", []))
        return (f"**Target:** {info.target} · **draft head:** {head} · **device:** {info.device} · "
                f"**dtype:** {info.dtype} · **V** = {info.vocab_size:,} · hidden {info.hidden_size}{notes}")


def _short_path(name: str) -> str:
    """A head folder as the page shows it: relative to the project when inside it (no machine paths)."""
    path = Path(name)
    if not path.is_absolute():
        return name
    root = ASSETS.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


def pair_loader(model: str | None = None, head: str | None = None, device: str | None = None,
                dtype: str | None = None, random_head_if_missing: bool = False) -> Loader:
    """A loader for `load_pair` (default: the offline SmolLM2-135M-Instruct and its shipped head).

    `random_head_if_missing` gives a target without a trained head an untrained random one, so
    every method runs (τ stays near 1): for development and demos of the UI only.
    """
    def load(progress: ProgressFn | None = None) -> tuple[SpecEngine, PairInfo]:
        from nanospec.pair import load_pair

        engine, info = load_pair(model, head, device=device, dtype=dtype, progress=progress)
        if engine.head is None and random_head_if_missing:
            engine, info = with_random_head(engine, info)
        return engine, info

    return load


def with_random_head(engine: SpecEngine, info: PairInfo) -> tuple[SpecEngine, PairInfo]:
    """The same target with an untrained random head, so every method runs (τ stays near 1)."""
    from nanospec.bench.random_pair import random_head

    head = random_head(engine.model.config, dtype=engine.lm_head_weight.dtype).to(engine.device)
    spec = SpecEngine(engine.model, engine.tokenizer, head, frequent_ids=engine.frequent_ids)
    return spec, replace(info, head="random untrained head (UI development only: τ ≈ 1)")

