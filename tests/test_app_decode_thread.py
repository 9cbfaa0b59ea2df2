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
from app.dev.devtools import tiny_loader
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


def test_the_first_run_says_at_once_that_the_model_is_loading():
    """While the model loads (tens of seconds on a slow machine) the Live tab shows a status line where the
    KPIs go, next to the Run button, updated about every half second; then the run streams as usual."""
    from app.callbacks import LIVE_OUTPUTS

    tiny = tiny_loader()

    def slow(progress):
        time.sleep(1.6)
        progress("converting the weights", 0.5)
        return tiny(progress)

    explorer = Explorer(EngineProvider(slow))
    knobs = dict(method="nanospec", max_new_tokens=4, depth=2, top_k=2, total_tokens=4, copy_branch=0)
    run = explorer.run_live("the draft tree", **knobs, progress=lambda *a, **k: None)
    kpis = [dict(zip(LIVE_OUTPUTS, out))["kpis"] for out in run]
    notes = [k for k in kpis if 'id="loading-note"' in k]
    assert len(notes) >= 2 and "Loading the model" in notes[0]
    assert notes == kpis[:len(notes)]  # before any step
    assert "tokens/s" in kpis[-1]  # then the run itself
    again = explorer.run_live("the draft tree", **knobs, progress=lambda *a, **k: None)
    assert not any('id="loading-note"' in dict(zip(LIVE_OUTPUTS, out))["kpis"] for out in again)


def test_stop_withdraws_a_run_that_waits_in_the_queue_and_ends_a_running_one_after_its_step():
    """Stop reaches the run of its own page only: before the run starts (Run clicked, waiting its turn)
    it withdraws it; while it runs, the run ends after its current step and sends its last values."""
    from types import SimpleNamespace

    from app.callbacks import LIVE_OUTPUTS

    explorer = Explorer(EngineProvider(tiny_loader()))
    mine, other = SimpleNamespace(session_hash="mine"), SimpleNamespace(session_hash="other")
    knobs = dict(method="nanospec", max_new_tokens=400, depth=2, top_k=2, total_tokens=4, copy_branch=0)
    quiet = dict(progress=lambda *a, **k: None)
    explorer.run_requested(mine)
    explorer.run_requested(other)
    assert all(isinstance(v, type(gr.skip())) for v in explorer.after_stop(None, mine))  # nothing to show yet
    withdrawn = list(explorer.run_live("the draft tree", **knobs, **quiet, request=mine))
    assert len(withdrawn) == 1 and explorer.provider.loaded is None  # it never ran: the model did not even load
    running = explorer.run_live("the draft tree", **knobs, **quiet, request=other)  # the other page's: not withdrawn
    rest: list = []
    consumer = threading.Thread(target=lambda: rest.extend(running))  # as Gradio consumes it, on its own thread
    consumer.start()
    deadline = time.monotonic() + 60
    while len(rest) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    stopped = explorer.after_stop(None, other)
    assert time.monotonic() - t0 < 10  # Stop waited for one step, not for its time-out
    consumer.join(30)
    final = dict(zip(LIVE_OUTPUTS, rest[-1]))
    assert final["view"].stopped and final["view"].summary.stop_reason == "stopped"
    assert final["view"].last_step < 50 and 'id="stop-note"' in final["kpis"]
    assert dict(zip(LIVE_OUTPUTS, stopped))["answer"] == final["answer"]
