"""What `SpecEngine.stream()` returns: a `Run`, decoding lazily as it is iterated, and its `RunResult`."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Protocol

from nanospec.config import GenerationConfig
from nanospec.events import RunSummary, StepEvent, summarize


class Decoder(Protocol):
    """What a `Run` needs of its engine (`SpecEngine`): the decoding loop and the tokenizer."""

    tokenizer: object

    def decode(self, prompt_ids: list[int], cfg: GenerationConfig) -> Generator[StepEvent, None, str]: ...


@dataclass
class RunResult:
    text: str
    token_ids: list[int]
    events: list[StepEvent]
    summary: RunSummary


class Run:
    """Iterate to get `StepEvent`s; after exhaustion `summary` holds the `RunSummary`.

    Stopping iteration early (break / close) stops decoding; `summary` then says `stopped`.
    """

    def __init__(self, engine: Decoder, prompt_ids: list[int], config: GenerationConfig):
        self.engine, self.prompt_ids, self.config = engine, prompt_ids, config
        self.events: list[StepEvent] = []
        self.summary: RunSummary | None = None
        self.stop_reason = "stopped"
        self._t0 = 0.0

    def __iter__(self) -> Iterator[StepEvent]:
        self._t0 = time.perf_counter()
        steps = self.engine.decode(self.prompt_ids, self.config)
        try:
            while True:
                try:
                    event = next(steps)
                except StopIteration as done:  # the loop's return value: why it stopped
                    self.stop_reason = done.value or "stopped"
                    break
                self.events.append(event)
                yield event
        finally:
            steps.close()
            self._finish()

    def _finish(self) -> None:
        if self.summary is None and self.events:
            wall = time.perf_counter() - self._t0
            ids = [t for e in self.events for t in e.tokens]
            text = self.engine.tokenizer.decode(ids, skip_special_tokens=True) if self.engine.tokenizer else ""
            self.summary = summarize(self.events, self.config.method, wall, self.stop_reason, text)

    def result(self) -> RunResult:
        for _ in self:
            pass
        return RunResult(self.summary.text, self.summary.output_ids, self.events, self.summary)
