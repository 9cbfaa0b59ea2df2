"""Many visitors on one app (issue 17, "Many visitors"): the launched app with a slowed tiny engine, driven
through `gradio_client` (one `Client` = one browser tab: its own session) and, for a closing tab, through
the raw queue endpoints a page uses.

- runs share the one model in turn, and a visitor who waits is told their place in the queue;
- each visitor gets exactly their own answer, charts, downloads and session state;
- Stop in one tab stops only that tab's run (running or still waiting);
- a tab closed mid-run frees the model within one decoding step, and a tab closed while waiting never runs.

Every decoding step is logged with the run it belongs to (`StepLog`), so the tests assert on the order
of steps, not on wall-clock timing (this must hold on a slow, loaded machine).
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.utils import Status  # noqa: E402

from tests.answer_text import answer_tokens  # noqa: E402
from app.decoding import StepPump  # noqa: E402
from app.dev.devtools import tiny_loader  # noqa: E402
from app.inputs import DEFAULTS  # noqa: E402
from app.dev.served import free_port  # noqa: E402
from app.ui import build_app  # noqa: E402
from nanospec.events import load_trace  # noqa: E402

STEP_DELAY_S = 0.03  # every decode step sleeps this long: runs last long enough to queue behind
WAIT_S = 180.0       # generous: the machine may be busy
# the draft budget off: it decides by measured step times and carries what it learnt from one request to the
# next, so the same run would not draw the same trees twice (the answer would still be the same text)
KNOBS = dict(depth=3, top_k=4, total_tokens=12, temperature=0.0, top_p=1.0, seed=0, capacity=3072,
             copy_branch=DEFAULTS["copy_branch"], budget=False)
WORDS = "the draft tree accepts a fast small vocabulary target model verifies every step".split()


def prompt(name: str) -> str:
    """A prompt whose first word names the run (the step log finds runs by it)."""
    return f"{name} " + " ".join(WORDS[(len(name) + i) % len(WORDS)] for i in range(8))


def run_args(name: str, max_new: int, method: str = "nanospec") -> dict:
    """/run's arguments by parameter name."""
    return dict(prompt_text=prompt(name), method=method, max_new_tokens=max_new, **KNOBS)


class StepLog:
    """A loader for the slowed tiny engine that logs, in order, every decode step ("step", run name) and
    every time the app tells a run's step pump to stop ("stop", run name)."""

    def __init__(self):
        self._loader = tiny_loader(step_delay_s=STEP_DELAY_S)
        self.entries: list[tuple[str, str | None, float]] = []
        self.current: str | None = None  # the run the decode thread is on (runs decode one after another)

    def __call__(self, progress=None):
        engine, info = self._loader(progress)
        stream, slow_step = engine.stream, engine.before_step

        def named_stream(prompt_value, *args, **kwargs):
            text = prompt_value if isinstance(prompt_value, str) else json.dumps(prompt_value)
            self.current = text.split()[0]
            return stream(prompt_value, *args, **kwargs)

        def logged_step(step: int, method: str) -> None:  # the engine's public hook, before every decode step
            if slow_step is not None:
                slow_step(step, method)
            self.entries.append(("step", self.current, time.monotonic()))

        engine.stream, engine.before_step = named_stream, logged_step
        return engine, info

    def mark(self) -> int:
        return len(self.entries)

    def steps(self, since: int = 0) -> list[str]:
        return [name for kind, name, _ in self.entries[since:] if kind == "step"]

    def runs(self, since: int = 0) -> list[str]:
        """Run names in the order they decoded, each once per contiguous stretch of steps."""
        order: list[str] = []
        for name in self.steps(since):
            if not order or order[-1] != name:
                order.append(name)
        return order

    def steps_after_stop(self, name: str, since: int = 0) -> int:
        """Steps of run `name` that began after the app first told its pump to stop (-1: never told)."""
        entries = self.entries[since:]
        stop = next((i for i, (kind, who, _) in enumerate(entries) if kind == "stop" and who == name), None)
        if stop is None:
            return -1
        return sum(1 for kind, who, _ in entries[stop:] if kind == "step" and who == name)


@pytest.fixture(scope="module")
def served():
    log = StepLog()
    demo = build_app(log, chart_interval_s=60.0)  # charts at a run's start and end: steps stay cheap
    run_fn = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    explorer = run_fn.fn.__self__

    class LoggedPump(StepPump):
        def stop(self):
            if not self._stop.is_set() and not self._finished.is_set():
                log.entries.append(("stop", log.current, time.monotonic()))
            super().stop()

    explorer._pump = LoggedPump
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=free_port())
    Client(url, verbose=False).predict(**run_args("warmup", 2), api_name="/run")  # loads the model
    yield demo, url, log
    demo.close()


def wait_until(predicate, what: str, timeout_s: float = WAIT_S, poll_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def waiting_place(job) -> tuple[int, int] | None:
    """(rank, queue size) while the job waits in the queue and the server has said where; else None."""
    status = job.status()
    if status.code == Status.IN_QUEUE and status.rank is not None:
        return status.rank, status.queue_size
    return None


def place_in_line(job, name: str, log: StepLog, since: int) -> tuple[int, int]:
    """The (rank, queue size) the server tells run `name` while it waits; fails if the run starts instead
    (decodes after log entry `since`, or ends)."""
    def told():
        if job.done() or name in log.steps(since):
            raise AssertionError(f"{name} started without waiting in the queue")
        return waiting_place(job)

    return wait_until(told, f"{name}'s place in the queue", timeout_s=60.0)


def text_of(answer) -> str:
    return "".join(answer_tokens(answer))


def path_of(value) -> str:
    return value["value"] if isinstance(value, dict) and "value" in value else value


def clients(url: str, n: int) -> list[Client]:
    return [Client(url, verbose=False) for _ in range(n)]


def alone(url: str, args: dict) -> tuple:
    """The run's result when nobody else is on the app (a fresh session)."""
    return tuple(Client(url, verbose=False).predict(**args, api_name="/run"))


# -- runs take turns, and a waiting visitor sees their place -------------------------------------

def test_runs_take_turns_and_waiting_visitors_are_shown_their_place(served):
    demo, url, log = served
    # the page shows the queue on the answer box (Gradio's status tracker: "queue: 2/2 | ETA")
    run_cfg = next(d for d in demo.config["dependencies"] if d.get("api_name") == "run")
    answer_id = next(c["id"] for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "answer")
    assert run_cfg["show_progress"] == "full" and run_cfg["queue"] is not False
    assert answer_id in run_cfg["show_progress_on"]

    a, b, c = clients(url, 3)
    since = log.mark()
    job_a = a.submit(**run_args("alpha", 200), api_name="/run")
    wait_until(lambda: "alpha" in log.steps(since), "alpha to decode")
    job_b = b.submit(**run_args("bravo", 60), api_name="/run")
    assert place_in_line(job_b, "bravo", log, since) == (0, 1)  # next in line
    job_c = c.submit(**run_args("charlie", 10), api_name="/run")
    assert place_in_line(job_c, "charlie", log, since) == (1, 2)  # second of two
    assert not job_b.done() and "bravo" not in log.steps(since)  # bravo waits for alpha to finish
    # when alpha finishes and bravo starts, charlie is told it is next
    moved = wait_until(lambda: "moved up" if waiting_place(job_c) == (0, 1) else
                       "started" if job_c.status().code not in (Status.IN_QUEUE, Status.JOINING_QUEUE,
                                                                Status.STARTING) else None, "charlie to move up")
    assert moved == "moved up"
    results = {name: job.result(timeout=WAIT_S) for name, job in (("alpha", job_a), ("bravo", job_b),
                                                                    ("charlie", job_c))}
    # one run at a time, first come first served: no step of one run between the steps of another
    assert log.runs(since) == ["alpha", "bravo", "charlie"]
    for name, max_new in (("alpha", 200), ("bravo", 60), ("charlie", 10)):
        assert len(answer_tokens(results[name][0])) == max_new


# -- each visitor gets their own run ---------------------------------------------------------------

def _deterministic_charts(result) -> list:
    """The vocabulary, coverage and tree charts' data (the phase chart holds timings)."""
    return [json.loads(fig["plot"])["data"] for fig in (result[2], result[3], result[4])]


def test_each_visitor_gets_exactly_their_own_answer_charts_downloads_and_state(served):
    demo, url, log = served
    mine = {"delta": run_args("delta", 30, "nanospec"), "echo": run_args("echo", 20, "full")}
    solo_clients = {name: Client(url, verbose=False) for name in mine}
    solo = {name: tuple(solo_clients[name].predict(**args, api_name="/run")) for name, args in mine.items()}
    solo_scrub = {name: solo_clients[name].predict(1, api_name="/scrub") for name in mine}
    assert text_of(solo["delta"][0]) != text_of(solo["echo"][0])  # else this test could not tell them apart
    assert solo_scrub["delta"] != solo_scrub["echo"]

    visitors = dict(zip(mine, clients(url, 2)))
    since = log.mark()
    jobs = {name: visitors[name].submit(**args, api_name="/run") for name, args in mine.items()}
    got = {name: tuple(job.result(timeout=WAIT_S)) for name, job in jobs.items()}
    assert sorted(log.runs(since)) == ["delta", "echo"]  # both ran, one after the other

    for name in mine:
        mine_now, mine_alone = got[name], solo[name]
        assert mine_now[0] == mine_alone[0]                          # the answer, token for token, with colours
        assert _deterministic_charts(mine_now) == _deterministic_charts(mine_alone)
        assert mine_now[6]["maximum"] == mine_alone[6]["maximum"]    # the step slider: same number of steps
        events, summary, meta = load_trace(path_of(mine_now[8]))     # the downloaded trace is this run's
        alone_events, alone_summary, _ = load_trace(path_of(mine_alone[8]))
        assert summary.output_ids == alone_summary.output_ids and summary.method == mine[name]["method"]
        assert [e.tokens for e in events] == [e.tokens for e in alone_events]
        assert meta["prompt"] == prompt(name)
        assert [e.step for e in load_trace(path_of(mine_now[7]))[0]] == [e.step for e in events]
    assert path_of(got["delta"][8]) != path_of(got["echo"][8])       # separate files, not one overwritten

    # the session state (the run shown, for the step slider and Stop) is each visitor's own
    for name in mine:
        assert visitors[name].predict(1, api_name="/scrub") == solo_scrub[name]
        redrawn = visitors[name].predict(api_name="/stop")  # Stop after the end redraws this visitor's run
        assert redrawn[0] == got[name][0]
    assert "plot" not in (Client(url, verbose=False).predict(1, api_name="/scrub") or {})  # a new visitor: no run


# -- Stop in one tab --------------------------------------------------------------------------------

def test_stop_in_one_tab_stops_only_that_run(served):
    demo, url, log = served
    reference = {"golf": alone(url, run_args("golf", 40)), "hotel": alone(url, run_args("hotel", 100))}

    # foxtrot decodes a long run, golf waits; foxtrot presses Stop (the page cancels its own session's run)
    foxtrot, golf = clients(url, 2)
    since = log.mark()
    job_f = foxtrot.submit(**run_args("foxtrot", 400), api_name="/run")
    wait_until(lambda: log.steps(since).count("foxtrot") >= 5, "foxtrot to decode")
    job_g = golf.submit(**run_args("golf", 40), api_name="/run")
    place_in_line(job_g, "golf", log, since)
    job_f.cancel()
    partial = foxtrot.predict(api_name="/stop")  # the Stop button's own callback: what arrived so far
    got_g = job_g.result(timeout=WAIT_S)
    assert got_g[0] == reference["golf"][0]            # golf's run is whole and right
    assert log.runs(since) == ["foxtrot", "golf"]
    assert 0 <= log.steps_after_stop("foxtrot", since) <= 1  # foxtrot's run ended within one step of Stop
    assert log.steps(since).count("foxtrot") < 400
    assert 0 < len(answer_tokens(partial[0])) < 400  # foxtrot sees its partial answer

    # hotel decodes, india waits and presses Stop before its turn: hotel runs to the end, india never runs
    hotel, india = clients(url, 2)
    since = log.mark()
    job_h = hotel.submit(**run_args("hotel", 100), api_name="/run")
    wait_until(lambda: "hotel" in log.steps(since), "hotel to decode")
    job_i = india.submit(**run_args("india", 40), api_name="/run")
    place_in_line(job_i, "india", log, since)
    job_i.cancel()
    assert job_h.result(timeout=WAIT_S)[0] == reference["hotel"][0]  # hotel's run is whole and right
    assert log.runs(since) == ["hotel"]
    time.sleep(1.0)  # a cancelled waiter left the queue: nothing decodes for it after hotel either
    assert log.runs(since) == ["hotel"]


# -- a closed tab ----------------------------------------------------------------------------------

class Page:
    """A browser tab's queue connection: joins `/run` and holds its event stream open until `close()`."""

    def __init__(self, demo, url: str, args: dict):
        session = uuid.uuid4().hex
        fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == "run")
        self._http = httpx.Client(base_url=url, timeout=WAIT_S)
        # a page sends every input, in /run's order (gradio_client fills in the defaults of those left out)
        params = demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
        data = [args.get(p["parameter_name"], p["parameter_default"]) for p in params]
        self._http.post("gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                                      "event_data": None, "trigger_id": None}).raise_for_status()
        self._stream = self._http.stream("GET", f"gradio_api/queue/data?session_hash={session}")
        self._lines = self._stream.__enter__().iter_lines()

    def read_until(self, msg: str, count: int = 1) -> None:
        """Read the event stream until `count` messages of kind `msg` have arrived."""
        seen = 0
        for line in self._lines:
            seen += f'"msg":"{msg}"' in line.replace(" ", "")
            if seen >= count:
                return
        raise AssertionError(f"the stream ended before {count} {msg!r} messages")

    def close(self) -> None:
        """Close the connection, as closing the tab does."""
        self._stream.__exit__(None, None, None)
        self._http.close()


def test_a_closed_tab_frees_the_model_within_a_step(served):
    demo, url, log = served
    reference = alone(url, run_args("lima", 30))
    since = log.mark()
    kilo = Page(demo, url, run_args("kilo", 500))
    kilo.read_until("process_generating", 3)                   # kilo's page shows steps
    juliet = Page(demo, url, run_args("juliet", 30))           # waits behind kilo...
    juliet.read_until("estimation")                            # (its page shows its place in the queue)
    juliet.close()                                             # ...and closes the tab before its turn
    lima = Client(url, verbose=False)
    job_l = lima.submit(**run_args("lima", 30), api_name="/run")  # waits behind kilo
    place_in_line(job_l, "lima", log, since)
    kilo.close()                                               # kilo closes the tab mid-run
    got = job_l.result(timeout=WAIT_S)
    assert got[0] == reference[0]                              # lima's run is whole and right
    assert log.runs(since) == ["kilo", "lima"]                 # juliet's run never took the model
    assert 0 <= log.steps_after_stop("kilo", since) <= 1       # kilo's run ended within a step of being told
    assert log.steps(since).count("kilo") < 500
