"""Engines for tests and development of the app itself (not for real use): a tiny random-weight model
with a toy word tokenizer (`python app.py --tiny`, `python -m app.dev.soak --tiny`, the app's tests) and a
slowed-down engine that counts its steps (tests of Stop and of closed tabs). (The random draft head
for a target without a trained one, `python app.py --random-head`, is `app.models.with_random_head`.)
"""

from __future__ import annotations

import time
import zlib

import torch

from nanospec.bench.random_pair import random_head, random_target, random_target_config
from nanospec import SpecEngine
from nanospec.pair import PairInfo

from app.models import Loader, ProgressFn


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


def tiny_loader(vocab: int = 32000, hidden: int = 64, layers: int = 2, step_delay_s: float = 0.0,
                max_positions: int = 2048) -> Loader:
    """A random-weight Llama + random head + `WordTokenizer` (loads in well under a second).

    `step_delay_s` slows every decode step down (tests of Stop / disconnect need a run that lasts).
    """
    def load(progress: ProgressFn | None = None) -> tuple[SpecEngine, PairInfo]:
        if progress:
            progress("building a tiny random model", 0.5)
        cfg = random_target_config(vocab, hidden, layers, heads=2, kv_heads=1, intermediate=2 * hidden,
                                   max_positions=max_positions)
        target = random_target(cfg, seed=0)
        frequent = torch.randperm(vocab, generator=torch.Generator().manual_seed(3))
        args = (target, WordTokenizer(vocab), random_head(target.config, seed=1))
        if step_delay_s > 0:
            engine = _SlowEngine(*args, step_delay_s=step_delay_s, frequent_ids=frequent, eos_token_ids=[])
        else:
            engine = SpecEngine(*args, frequent_ids=frequent, eos_token_ids=[])
        info = PairInfo(target=f"tiny random Llama (V={vocab}, hidden {hidden}, {layers} layers)",
                        head="random", device="cpu", dtype="float32", vocab_size=vocab, hidden_size=hidden)
        return engine, info

    return load


class _SlowEngine(SpecEngine):
    """Counts decode steps and sleeps before each one, through the engine's public `before_step` hook
    (so a test can see when a run stops)."""

    def __init__(self, *args, step_delay_s: float, **kwargs):
        super().__init__(*args, before_step=self._slow_step, **kwargs)
        self.step_delay_s = step_delay_s
        self.steps_run = 0

    def _slow_step(self, step: int, method: str) -> None:
        time.sleep(self.step_delay_s)
        self.steps_run += 1
