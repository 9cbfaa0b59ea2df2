"""The app's decode thread: steps arrive in order, Stop ends a run after its current step, and on Linux
the web server's threads run at a lower priority than decoding."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app.callbacks import StepPump

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
        from app.callbacks import decode_thread, lower_server_priority
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
