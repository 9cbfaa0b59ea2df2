"""The app's callbacks: live run (streamed), stop, step scrubbing, replay and compare.

`Explorer` holds only process-wide things (the shared model provider, the warm-up record, the last
cost curve seen per pair, and each session's run in progress or waiting, which its Stop button ends or
withdraws); everything about a user's run travels in the returned values and in `gr.State`.
Every failure becomes a `gr.Error` in the page plus one `logging.warning` line on the server.

    shared    errors for the page, figure payloads, sessions, the loading line
    live      the Live tab: run, stop, scrub, replay (`LiveTab`)
    compare   the Compare tab: runs, table, verdict, trust, race (`CompareTab`)
Here: loading the pair and decoding, which both tabs use.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from app.callbacks.compare import (COMPARE_COLUMNS, CompareTab, compare_table, compare_trust, compare_verdict,
                                   display_table)
from app.callbacks.live import (LIVE_OUTPUTS, LONG_PROMPT_TOKENS, PLOTS, STOP_WAIT_S, LiveRun, LiveTab,
                                long_prompt_note, prompt_note_html, stopped_note)
from app.callbacks.shared import fail, loading_note, plot_data, session_of
from app.decoding import StepPump, decode_thread
from app.inputs import generation_options, parse_prompt
from app.models import EngineProvider
from app.zerogpu import InlinePump, gpu_decoder
from app.zerogpu import active as zerogpu_active

__all__ = [
    "Explorer", "COMPARE_COLUMNS", "compare_table", "compare_trust",
    "compare_verdict", "display_table", "LIVE_OUTPUTS", "LONG_PROMPT_TOKENS", "PLOTS", "STOP_WAIT_S", "LiveRun",
    "long_prompt_note", "prompt_note_html", "stopped_note", "fail", "loading_note", "plot_data", "session_of",
]


class Explorer(LiveTab, CompareTab):
    def __init__(self, provider: EngineProvider, chart_interval_s: float = 1.0):
        self.provider = provider
        self.chart_interval_s = chart_interval_s
        self._warm: set[tuple] = set()          # (method, options) already run once in this process
        self._decode = gpu_decoder(self._decode_steps)  # the only part that needs the accelerator
        self._pump = InlinePump if zerogpu_active() else StepPump  # ZeroGPU: no CUDA on other threads
        self._live: dict[str, LiveRun] = {}  # session -> its live run in progress (what its Stop button ends)
        self._waiting: dict[str, threading.Event] = {}  # session -> its Run click, set when Stop withdraws it
        self._live_lock = threading.Lock()
        # engine -> the last cost curve a run of it recorded (the draft budget's): what prices the break-even τ
        # of its later runs without the budget (a weak key: a pair switched away from is not kept alive)
        self._curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # -- model and decoding -------------------------------------------------------------
    def _engine(self, progress):
        """The shared pair, loaded on first use *on the decode thread*, with its progress shown here.

        Loading computes (weight conversion, packing), and on CPU the first thread to compute with torch
        starts a team of OpenMP worker threads that lives as long as that thread. Had a callback thread
        loaded the model, the decode thread would start a second team: more OpenMP threads than cores,
        which makes libgomp's workers sleep instead of spin between operations and slows every matmul
        (`python -m app.dev.bench_app` measures the app against the engine; docs/benchmarks.md has a run)."""
        loading = self._loading(progress)
        while True:
            try:
                next(loading)
            except StopIteration as done:
                return done.value

    def _loading(self, progress, every_s: float = 0.5):
        """`_engine` as a generator: yields a status line (HTML) about every `every_s` while the pair loads,
        then returns it (`yield from`). The Live tab shows the line at once, next to the Run button."""
        loaded = self.provider.loaded
        if loaded is not None:
            return loaded
        messages: queue.Queue = queue.Queue()
        done: Future = Future()

        def load() -> None:
            try:
                done.set_result(self.provider.get(lambda m, f: messages.put((m, f))))
            except BaseException as exc:  # noqa: BLE001 — re-raised below, in the caller
                done.set_exception(exc)

        decode_thread().submit(load)
        t0, latest = time.perf_counter(), ""
        while True:
            finished = bool(futures_wait([done], timeout=every_s).done)
            while True:  # also once after the end, so nothing reported late is lost
                try:
                    message, fraction = messages.get_nowait()
                except queue.Empty:
                    break
                progress(fraction, desc=message)
                latest = message + (f" ({fraction:.0%})" if fraction is not None else "")
            if finished:
                break
            yield loading_note(time.perf_counter() - t0, latest)
        try:
            return done.result()
        except Exception as exc:  # noqa: BLE001 — any load failure is shown, and the app keeps serving
            raise fail("the model failed to load", exc) from None

    def _decode_steps(self, prompt, options: dict):
        """Yields each `StepEvent`, then the `RunSummary`. Closing this generator stops the run. A run with
        the draft budget first yields `{"cost_curve": ...}`: the target's cost curve the budget used
        (`stream` measured it, or read the cache, before the run's first step)."""
        engine, _ = self.provider.get()
        run = engine.stream(prompt, **options)
        steps = iter(run)
        try:
            if options.get("budget") and options.get("method") != "ar":
                yield {"cost_curve": cost_curve_meta(engine)}  # the one `stream` just made sure of
            yield from steps
        finally:
            steps.close()  # closes the engine's Run: decoding stops at this step
        yield run.summary

    def _inputs(self, prompt_text, knobs: dict):
        try:
            return parse_prompt(prompt_text), generation_options(knobs)
        except ValueError as exc:
            raise fail("invalid input", exc) from None


def cost_curve_meta(engine) -> dict:
    """The engine's cost curve as a trace's meta holds it (`meta["cost_curve"]`, which the Live KPIs and the
    budget note read): measured or read from the cache already, so nothing is measured here."""
    curve = engine.cost_curve()
    return {**curve.to_dict(), "per_token_ms": curve.per_token_ms, "text": curve.describe()}
