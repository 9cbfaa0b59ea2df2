"""Many visitors on one app (tiny slowed-down engine, each visitor its own gradio_client session): runs take
turns with the queue position reported to those waiting, each visitor gets exactly their own answer and
state, and Stop in one session stops only that session's run."""

from __future__ import annotations

import json
import time

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.utils import Status  # noqa: E402

from app.devtools import tiny_loader  # noqa: E402
from app.served import free_port  # noqa: E402
from app.ui import build_app  # noqa: E402

KNOBS = [3, 4, 12, 0.0, 1.0, 0, 3072]  # depth, top_k, total, temperature, top_p, seed, capacity
P1, P2 = "the draft tree accepts", "a small vocabulary verifies every step"


class Capture:
    def __init__(self, loader):
        self.loader, self.engine = loader, None

    def __call__(self, progress=None):
        self.engine, info = self.loader(progress)
        return self.engine, info


@pytest.fixture(scope="module")
def served():
    capture = Capture(tiny_loader(step_delay_s=0.02))
    demo = build_app(capture, chart_interval_s=0.0)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=free_port())
    yield url, capture
    demo.close()


def _text(outputs) -> str:
    return "".join(s["token"] for s in outputs[0])


def _wait_for(job, predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not predicate(job) and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate(job)


def test_waiting_visitors_see_their_queue_position_and_stop_stops_only_their_run(served):
    url, capture = served
    a, b, c = (Client(url, verbose=False, download_files=False) for _ in range(3))
    alone = _text(a.predict(P2, "nanospec", 10, *KNOBS, api_name="/run"))
    long_a = a.submit(P1, "nanospec", 400, *KNOBS, api_name="/run")
    assert _wait_for(long_a, lambda j: len(j.outputs()) >= 2)  # A is decoding
    wait_b = b.submit(P2, "nanospec", 10, *KNOBS, api_name="/run")
    wait_c = c.submit(P2, "nanospec", 400, *KNOBS, api_name="/run")
    assert _wait_for(wait_c, lambda j: j.status().code == Status.IN_QUEUE and j.status().rank is not None)
    ranks = {name: job.status() for name, job in (("b", wait_b), ("c", wait_c))}
    assert ranks["b"].rank == 0 and ranks["c"].rank == 1 and ranks["c"].queue_size >= 2  # shown as "queue: n/m"
    wait_c.cancel()  # C leaves the queue: A keeps decoding, B still gets its turn
    steps = capture.engine.steps_run
    assert _wait_for(long_a, lambda j: capture.engine.steps_run > steps + 5)
    long_a.cancel()  # A stops its own run: B's run starts and completes with its own answer
    assert _text(wait_b.result(timeout=120)) == alone
    time.sleep(0.5)
    settled = capture.engine.steps_run
    time.sleep(0.5)
    assert capture.engine.steps_run == settled  # nothing decodes for the stopped or withdrawn runs
    assert not wait_c.outputs()  # C never ran


def test_each_visitor_gets_their_own_answer_state_and_downloads(served):
    url, _ = served
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    ja = a.submit(P1, "nanospec", 12, *KNOBS, api_name="/run")
    jb = b.submit(P2, "full", 12, *KNOBS, api_name="/run")
    out_a, out_b = ja.result(timeout=120), jb.result(timeout=120)
    assert _text(out_a) == _text(Client(url, verbose=False).predict(P1, "ar", 12, *KNOBS, api_name="/run"))
    assert _text(out_b) == _text(Client(url, verbose=False).predict(P2, "ar", 12, *KNOBS, api_name="/run"))
    for out, prompt, method in ((out_a, P1, "nanospec"), (out_b, P2, "full")):
        doc = json.loads(open(out[8]["value"] if isinstance(out[8], dict) else out[8]).read())
        assert doc["meta"]["prompt"] == prompt and doc["summary"]["method"] == method
    # the step slider redraws the tree from the visitor's own run (its gr.State), not the other's
    last_a, last_b = out_a[6]["value"], out_b[6]["value"]
    assert a.predict(last_a, api_name="/scrub") == out_a[4]
    assert b.predict(last_b, api_name="/scrub") == out_b[4]
    assert out_a[4] != out_b[4]
