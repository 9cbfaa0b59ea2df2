"""The app's decode thread: steps arrive in order, Stop ends a run after its current step, and on Linux
the web server's threads run at a lower priority than decoding."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gradio as gr
import pytest

from app.callbacks import Explorer
from app.decoding import StepPump, decode_thread
from app.devtools import tiny_loader
from app.models import EngineProvider

ROOT = Path(__file__).resolve().parent.parent


def test_step_pump_delivers_every_item_in_order():
    pump = StepPump(iter(range(50)))
    got = [x for batch in pump.batches() for x in batch]
    assert got == list(range(50))
    assert pump.join(5)


def test_step_pump_stop_ends_the_run_and_the_next_run_still_runs():
    closed = threading.Event()

    def slow():
        try:
            for i in range(1000):
                time.sleep(0.01)
                yield i
        finally:
            closed.set()

    pump = StepPump(slow())
    batches = pump.batches()
    first = next(batches)
    pump.stop()
    rest = [x for batch in batches for x in batch]
    assert pump.join(5) and closed.is_set()
    assert len(first) + len(rest) < 1000
    # the shared decode thread is free again
    assert [x for b in StepPump(iter("abc")).batches() for x in b] == ["a", "b", "c"]


def test_step_pump_hands_errors_to_the_consumer():
    def broken():
        yield 1
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        for _ in StepPump(broken()).batches():
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature")
def test_server_threads_get_lower_priority_than_the_decode_thread():
    code = textwrap.dedent("""
        import os, threading
        from app.decoding import decode_thread, lower_server_priority
        prio = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        before = prio()
        assert lower_server_priority(5)
        got, done = {}, threading.Event()
        decode_thread().submit(lambda: (got.setdefault("decode", prio()), done.set()))
        t = threading.Thread(target=lambda: got.setdefault("server", prio()))
        t.start(); t.join(); done.wait(10)
        print(before, prio(), got["decode"], got["server"])
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    before, main, decode, server = map(int, out.stdout.split())
    assert decode == before                      # decoding keeps the normal priority
    assert main == server == min(19, before + 5)  # the caller and every thread it starts later yield to it


def test_decode_thread_call_returns_results_and_raises_errors():
    seen = []
    assert decode_thread().call(lambda: threading.current_thread().name, lambda: seen.append(1)) == "nanospec-decode"
    assert seen  # the waiting side ran its callback at least once (after the result)
    with pytest.raises(ValueError, match="bad"):
        decode_thread().call(lambda: (_ for _ in ()).throw(ValueError("bad")))


def test_the_model_loads_on_the_decode_thread_with_progress_shown_by_the_caller():
    """Loading computes; on CPU the first thread to compute owns an OpenMP team, so it must be the thread
    that decodes (see `Explorer._engine`). Progress messages still reach the caller's progress bar."""
    where, shown = {}, []
    tiny = tiny_loader()

    def loader(progress):
        where["thread"] = threading.current_thread().name
        return tiny(progress)

    explorer = Explorer(EngineProvider(loader))
    engine, _ = explorer._engine(lambda fraction, desc=None: shown.append((fraction, desc)))
    assert where["thread"] == "nanospec-decode"
    assert threading.current_thread().name != "nanospec-decode"
    assert (0.5, "building a tiny random model") in shown
    assert explorer._engine(lambda *a, **k: shown.append("again"))[0] is engine and "again" not in shown


def test_a_failed_load_becomes_a_page_error_and_the_next_call_retries():
    calls = []

    def loader(progress):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise OSError("disk full")
        return tiny_loader()(progress)

    explorer = Explorer(EngineProvider(loader))
    with pytest.raises(gr.Error, match="the model failed to load: disk full"):
        explorer._engine(lambda *a, **k: None)
    assert explorer._engine(lambda *a, **k: None)[0] is not None
    assert calls == ["nanospec-decode", "nanospec-decode"]
