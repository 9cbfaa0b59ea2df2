"""One model pair per process: a lazy, thread-safe loader shared by all sessions, plus dev engines.

Nothing here loads at import time. `EngineProvider.get()` loads on first use (reporting progress)
and hands every later caller the same `(SpecEngine, PairInfo)`.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from nanospec.engine import SpecEngine
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
        return (f"**Target:** {info.target} · **draft head:** {head} · **device:** {info.device} · "
                f"**dtype:** {info.dtype} · **V** = {info.vocab_size:,} · hidden {info.hidden_size}")


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
            engine, info = _with_random_head(engine, info)
        return engine, info

    return load


def _with_random_head(engine: SpecEngine, info: PairInfo) -> tuple[SpecEngine, PairInfo]:
    from dataclasses import replace

    from nanospec.bench.random_pair import random_head

    head = random_head(engine.model.config, dtype=engine.lm_head_weight.dtype).to(engine.device)
    spec = SpecEngine(engine.model, engine.tokenizer, head, frequent_ids=engine.frequent_ids)
    return spec, replace(info, head="random untrained head (UI development only: τ ≈ 1)")


# -- a tiny engine for tests and benchmarks of the UI itself -----------------------------------
_WORDS = ("the", "draft", "tree", "token", "accepts", "a", "fast", "small", "vocabulary", "target",
          "model", "verifies", "every", "step", "and", "speculates", "on", "context", "words", "bonus")


class WordTokenizer:
    """A toy tokenizer: words hash to ids, ids decode to words (enough for the engine and the UI)."""

    chat_template = "toy"
    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def _encode(self, text: str) -> list[int]:
        return [zlib.crc32(w.encode()) % self.vocab_size for w in text.split()] or [0]

    def __call__(self, text: str) -> dict:
        return {"input_ids": self._encode(text)}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **_):
        ids = [1]
        for m in messages:
            ids += self._encode(f"{m['role']} {m['content']}") + [2]
        return ids + (self._encode("assistant") if add_generation_prompt else [])

    def decode(self, ids, skip_special_tokens=False, **_) -> str:
        return "".join(f"{_WORDS[int(i) % len(_WORDS)]} " for i in ids)


def tiny_loader(vocab: int = 32000, hidden: int = 64, layers: int = 2, step_delay_s: float = 0.0) -> Loader:
    """A random-weight Llama + random head + `WordTokenizer` (loads in well under a second).

    `step_delay_s` slows every decode step down (tests of Stop / disconnect need a run that lasts).
    """
    def load(progress: ProgressFn | None = None) -> tuple[SpecEngine, PairInfo]:
        from nanospec.bench.random_pair import random_head, random_target, random_target_config

        if progress:
            progress("building a tiny random model", 0.5)
        cfg = random_target_config(vocab, hidden, layers, heads=2, kv_heads=1, intermediate=2 * hidden,
                                   max_positions=2048)
        target = random_target(cfg, seed=0)
        frequent = torch.randperm(vocab, generator=torch.Generator().manual_seed(3))
        cls = _SlowEngine if step_delay_s > 0 else SpecEngine
        engine = cls(target, WordTokenizer(vocab), random_head(target.config, seed=1), frequent_ids=frequent,
                     eos_token_ids=[])
        engine.step_delay_s = step_delay_s
        info = PairInfo(target=f"tiny random Llama (V={vocab}, hidden {hidden}, {layers} layers)",
                        head="random", device="cpu", dtype="float32", vocab_size=vocab, hidden_size=hidden)
        return engine, info

    return load


class _SlowEngine(SpecEngine):
    """Counts decode steps and sleeps in each one (so a test can see when a run stops)."""

    step_delay_s = 0.0
    steps_run = 0

    def _spec_step(self, *args, **kwargs):
        import time

        time.sleep(self.step_delay_s)
        self.steps_run += 1
        return super()._spec_step(*args, **kwargs)

    def _ar_step(self, *args, **kwargs):
        import time

        time.sleep(self.step_delay_s)
        self.steps_run += 1
        return super()._ar_step(*args, **kwargs)


def on_gpu(fn):
    """`spaces.GPU(fn)` on a Hugging Face ZeroGPU Space (when `spaces` imports), else `fn` unchanged."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(fn)
