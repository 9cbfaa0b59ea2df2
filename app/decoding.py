"""Where the app decodes: one long-lived decode thread for the process, and a step pump per run.

The callbacks (app/callbacks/) never decode on their own threads: they hand a step generator to a
`StepPump`, which runs it on the shared `DecodeThread` and passes each step back as it arrives.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import ClassVar

logger = logging.getLogger("nanospec.app")


class DecodeThread:
    """The one long-lived thread that runs every decode, one after another (the model serves one run at
    a time anyway: its Gradio queue has concurrency 1). `DecodeThread.shared()` is the process's one.

    Being long-lived matters for priority: `app.py` starts it first and then lowers the priority of the
    threads it creates afterwards (the web server, the queue, the callbacks: `lower_server_priority`).
    Linux threads inherit their priority from the thread that creates them, and torch's CPU worker
    threads are created by the thread that first computes, so decoding keeps the normal priority while
    the page's rendering yields to it when both want the CPU."""

    _shared: ClassVar[DecodeThread | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="nanospec-decode", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> DecodeThread:
        """The process's decode thread, started on first use."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 — a job's fault must not end the thread that serves all runs
                logger.warning("a decode job failed", exc_info=True)

    def submit(self, job: Callable[[], object]) -> None:
        self._jobs.put(job)

    def call(self, fn: Callable[[], object], while_waiting: Callable[[], object] | None = None,
             poll_s: float = 0.1):
        """Run `fn()` on this thread and return its result (or raise its exception) to the caller, which
        calls `while_waiting()` every `poll_s` seconds meanwhile (e.g. to show progress)."""
        done: Future = Future()

        def job() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 — re-raised in the caller
                done.set_exception(exc)

        self.submit(job)
        while True:
            finished = bool(futures_wait([done], timeout=poll_s).done)
            if while_waiting is not None:
                while_waiting()  # also once after the end, so nothing reported late is lost
            if finished:
                return done.result()


def decode_thread() -> DecodeThread:
    """The process's decode thread, started on first use."""
    return DecodeThread.shared()


def lower_server_priority(nice: int) -> bool:
    """Start the decode thread, then raise the calling thread's nice value by `nice` (Linux: per thread,
    inherited by the threads it creates later, i.e. the whole web server if called before launch).

    Returns False where this is not possible (other OSes, `nice` <= 0); nothing changes then."""
    decode_thread()
    if nice <= 0 or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        return False
    return True


class StepPump:
    """Runs a step generator on the decode thread so decoding never waits for the page to redraw.

    `batches()` yields lists of the items that arrived since the last call (one item per step when
    the page keeps up). `stop()` asks the decode thread to close the generator after its current step.
    """

    _DONE = object()

    def __init__(self, steps: Iterator, thread: DecodeThread | None = None):
        self._steps = steps
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._finished = threading.Event()
        (thread or decode_thread()).submit(self._run)

    def _run(self) -> None:
        try:
            if not self._stop.is_set():
                for item in self._steps:
                    self._queue.put(item)
                    if self._stop.is_set():
                        break
        except BaseException as exc:  # noqa: BLE001 — handed to the consumer, which reports it
            self._queue.put(exc)
        finally:
            try:
                close = getattr(self._steps, "close", None)
                if close is not None:
                    close()
            finally:
                self._queue.put(self._DONE)
                self._finished.set()

    def batches(self) -> Iterator[list]:
        done = False
        while not done:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = batch[-1] is self._DONE
            items = [b for b in batch if b is not self._DONE]
            for item in items:
                if isinstance(item, BaseException):
                    raise item
            if items:
                yield items

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)
