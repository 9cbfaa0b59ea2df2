"""The launched app through gradio_client, with an injected tiny random-weight engine (fast, no files)."""

from __future__ import annotations

import json
import re
import time
import uuid

import httpx
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from tests.answer_text import answer_tokens  # noqa: E402
from app.dev.devtools import tiny_loader  # noqa: E402
from app.ui import build_app  # noqa: E402
from nanospec.decoding.cost_curve import CostCurve  # noqa: E402
from nanospec.config import TreeConfig  # noqa: E402
from nanospec.events import load_trace  # noqa: E402

#           prompt, method, max_new, depth, top_k, total, temperature, top_p, seed, capacity
RUN_ARGS = ["the draft tree accepts the draft tree", "nanospec", 12, 3, 4, 12, 0.0, 1.0, 0, 3072]


def _launch(loader):
    demo = build_app(loader, chart_interval_s=0.0)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    return demo, url


def made_up_curve() -> CostCurve:
    """A steep made-up cost curve (3 ms per verified token) for the draft budget: nothing is measured
    or cached, and the budget prunes."""
    sizes = [2**i for i in range(9)]  # up to 256: larger than any tree the app allows
    return CostCurve(sizes, [10.0 + 3.0 * n for n in sizes], {"device": "test:made-up"})


class Capture:
    """Keeps the engine the app loads, so tests can watch it."""

    def __init__(self, loader):
        self.loader, self.engine = loader, None

    def __call__(self, progress=None):
        self.engine, info = self.loader(progress)
        self.engine.use_cost_curve(made_up_curve())
        return self.engine, info


@pytest.fixture(scope="module")
def served():
    capture = Capture(tiny_loader(step_delay_s=0.02))
    demo, url = _launch(capture)
    client = Client(url, verbose=False)
    yield demo, url, client, capture
    demo.close()


def _path(value):
    return value["value"] if isinstance(value, dict) and "value" in value else value


def test_streamed_run_updates_then_summary(served):
    _, _, client, capture = served
    job = client.submit(*RUN_ARGS, api_name="/run")
    updates = list(job)
    answer, kpis, vocab, coverage, tree, phases, step, csv_file, json_file, depth, pair = job.result()
    assert len(updates) >= 4  # one per step (prefill + several decode steps), then the final one
    assert len(answer_tokens(answer)) == 12  # the tiny tokenizer has no special tokens: all 12 are text
    assert "drafted by the head" in answer and "bonus" in answer  # the legend names the origins
    assert "tokens/s" in kpis and "τ" in kpis
    for fig in (vocab, coverage, tree, phases, depth):
        assert fig["type"] == "plotly" and json.loads(fig["plot"])["data"]
    assert step["value"] == step["maximum"] >= 1
    assert "tiny random Llama" in pair
    events, summary, meta = load_trace(_path(json_file))
    assert summary.new_tokens == 12 and summary.method == "nanospec" and meta["options"]["depth"] == 3
    assert [e.step for e in load_trace(_path(csv_file))[0]] == [e.step for e in events]
    # replay the downloaded trace: same text, no model run
    replayed = client.predict(handle_file(_path(json_file)), api_name="/replay")
    assert replayed[0] == answer


def test_the_draft_budget_checkbox_reaches_the_engine(served):
    """/run takes `budget` after `copy_branch` (default: the engine's); on, each decode step reports what
    the budget kept, the tree and the KPIs say it, and the answer is the same as without it."""
    _, _, client, capture = served
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/run"]["parameters"]
    assert [p["parameter_name"] for p in params][-2:] == ["copy_branch", "budget"]
    assert params[-1]["parameter_default"] is TreeConfig().budget
    plain = client.predict(*RUN_ARGS, budget=False, api_name="/run")
    out = client.predict(*RUN_ARGS, budget=True, api_name="/run")
    answer, kpis, tree, json_file, depth = out[0], out[1], out[4], out[8], out[9]
    assert answer_tokens(answer) == answer_tokens(plain[0])  # lossless either way (the origins may differ)
    events, _, meta = load_trace(_path(json_file))
    assert meta["options"]["budget"] is True and meta["cost_curve"]["key"]["device"] == "test:made-up"
    decode = events[1:]
    assert decode and all(e.drafted_nodes > 0 and e.drafted_nodes >= len(e.tree_tokens) for e in decode)
    assert all(e.budget_threshold is not None and e.expected_tokens >= 1.0 for e in decode)
    assert all(e.drafted_nodes == 0 for e in load_trace(_path(plain[8]))[0])  # off: nothing reported
    assert 'id="budget-note"' in kpis and "cost per extra verified token: <b>3.00 ms</b>" in kpis
    assert 'id="budget-note"' not in plain[1]
    title = json.loads(tree["plot"])["layout"]["title"]["text"]
    assert "more would have cost more time" in title or "a plain step" in title
    depth_fig = json.loads(depth["plot"])
    assert depth_fig["data"] or "plain step" in depth_fig["layout"]["annotations"][0]["text"]


def test_bad_input_is_a_message_and_the_app_keeps_serving(served, capfd):
    _, _, client, _ = served
    cases = [
        (["   ", *RUN_ARGS[1:]], "prompt is empty"),
        ([RUN_ARGS[0], "nanospec", 12, 99, 4, 12, 0.0, 1.0, 0, 3072], "depth must be in"),
        ([RUN_ARGS[0], "bogus", 12, 3, 4, 12, 0.0, 1.0, 0, 3072], "method must be one of"),
        ([RUN_ARGS[0], "nanospec", 12, 3, 4, 12, -1.0, 1.0, 0, 3072], "temperature"),
        ([RUN_ARGS[0], "nanospec", 12, 3, 4, 12, 0.0, 1.0, "x", 3072], "seed"),
    ]
    for args, message in cases:
        with pytest.raises(Exception, match=message):
            client.predict(*args, api_name="/run")
    with pytest.raises(Exception, match="unknown methods"):
        client.predict(RUN_ARGS[0], ["full", "bogus"], *RUN_ARGS[2:], api_name="/compare")
    assert len(answer_tokens(client.predict(RUN_ARGS[0], "ar", 3, *RUN_ARGS[3:], api_name="/run")[0])) == 3
    err = capfd.readouterr().err
    assert "Traceback" not in err


def test_a_file_that_is_not_a_trace(served, tmp_path):
    _, _, client, _ = served
    bad = tmp_path / "notes.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(Exception, match="not a NanoSpec trace"):
        client.predict(handle_file(str(bad)), api_name="/replay")


def test_compare_is_identical_to_autoregressive_at_temperature_zero(served):
    _, _, client, _ = served
    table, plot, verdict = client.predict(RUN_ARGS[0], ["full", "nanospec", "hybrid"], *RUN_ARGS[2:],
                                          api_name="/compare")
    assert "✓ Output identical to autoregressive" in verdict
    rows = {row[0]: dict(zip(table["headers"], row)) for row in table["data"]}
    assert list(rows) == ["ar", "full", "nanospec", "hybrid"]
    assert all(r["identical to ar"] == "✓" for r in rows.values())
    assert rows["ar"]["speedup"] == "1.00×"
    assert len(json.loads(plot["plot"])["data"]) == 4


def test_cancel_stops_decoding_within_a_step(served):
    _, _, client, capture = served
    job = client.submit(RUN_ARGS[0], "nanospec", 500, *RUN_ARGS[3:], api_name="/run")
    deadline = time.time() + 60
    while len(job.outputs()) < 4 and time.time() < deadline:
        time.sleep(0.02)
    job.cancel()
    time.sleep(0.3)
    stopped_at = capture.engine.steps_run
    time.sleep(0.5)
    assert capture.engine.steps_run == stopped_at  # nothing decodes for a cancelled run
    assert stopped_at < 100


def _tree_step(plot) -> int:
    title = json.loads(plot["plot"])["layout"]["title"]["text"]
    return int(re.match(r"Draft tree of step (\d+)\b", title).group(1))


def test_stop_ends_the_run_and_tree_slider_and_note_agree(served):
    """Stop: the run ends within a step and itself sends its last values; Stop's own answer is the same
    run. In both, the tree's step is the slider's value and its end, and a note says the run was stopped."""
    _, _, client, capture = served
    job = client.submit(RUN_ARGS[0], "nanospec", 500, *RUN_ARGS[3:], api_name="/run")
    deadline = time.time() + 60
    while len(job.outputs()) < 4 and time.time() < deadline:
        time.sleep(0.02)
    stopped = client.predict(api_name="/stop")  # the same session as the run: its Stop button
    final = job.result(timeout=60)             # the run was not cancelled: it ended and answered
    steps_then = capture.engine.steps_run
    time.sleep(0.3)
    assert capture.engine.steps_run == steps_then  # nothing decodes after Stop
    for answer, kpis, _, _, tree, _, step, *_ in (stopped, final):
        assert step["value"] == step["maximum"] == _tree_step(tree) >= 1
        assert 'id="stop-note"' in kpis and f"Stopped at step {step['value']}" in kpis
        assert 0 < len(answer_tokens(answer)) < 500
    assert stopped[0] == final[0] and stopped[6]["value"] == final[6]["value"]
    events, summary, _ = load_trace(_path(final[8]))
    assert summary.stop_reason == "stopped" and events[-1].step == final[6]["value"]


def test_closing_the_page_mid_run_frees_the_work(served):
    """A browser tab that goes away: its event stream closes, and the run stops."""
    demo, url, client, capture = served
    if capture.engine is None:  # run on its own: load the model first
        client.predict(RUN_ARGS[0], "ar", 2, *RUN_ARGS[3:], api_name="/run")
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == "run")
    session = uuid.uuid4().hex
    before = capture.engine.steps_run
    # a page sends every input, in /run's order (gradio_client fills in the defaults of those left out)
    params = demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
    data = [RUN_ARGS[0], "nanospec", 500, *RUN_ARGS[3:]]
    data += [p["parameter_default"] for p in params[len(data):]]
    with httpx.Client(base_url=url, timeout=30) as http:
        http.post("gradio_api/queue/join", json={"data": data,
                                                 "fn_index": fn_index, "session_hash": session,
                                                 "event_data": None, "trigger_id": None}).raise_for_status()
        with http.stream("GET", f"gradio_api/queue/data?session_hash={session}") as stream:
            seen = 0
            for line in stream.iter_lines():
                seen += "process_generating" in line
                if seen >= 3:
                    break  # leaving the block closes the connection, like closing the tab
    assert seen >= 3  # the run streamed steps to the page before it closed
    time.sleep(2.0)
    stopped_at = capture.engine.steps_run
    time.sleep(0.5)
    assert capture.engine.steps_run == stopped_at
    assert stopped_at - before < 150


def test_model_that_fails_to_load_is_reported(capfd):
    def broken(progress=None):
        raise OSError("weights not found in /nowhere")

    demo, url = _launch(broken)
    try:
        client = Client(url, verbose=False)
        for _ in range(2):  # the app keeps serving (and retries the load)
            with pytest.raises(Exception, match="the model failed to load: weights not found"):
                client.predict(*RUN_ARGS, api_name="/run")
        with pytest.raises(Exception, match="failed to load"):
            client.predict(RUN_ARGS[0], ["full"], *RUN_ARGS[2:], api_name="/compare")
    finally:
        demo.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("weights not found") <= 3


def test_head_missing_means_only_ar(tmp_path):
    """An engine without a draft head (the default pair before its head ships): ar runs, others explain."""
    from nanospec.decoding.engine import SpecEngine

    base = tiny_loader()

    def headless(progress=None):
        engine, info = base(progress)
        return SpecEngine(engine.model, engine.tokenizer, None, eos_token_ids=[]), info

    demo, url = _launch(headless)
    try:
        client = Client(url, verbose=False)
        assert len(answer_tokens(client.predict(RUN_ARGS[0], "ar", 4, *RUN_ARGS[3:], api_name="/run")[0])) == 4
        with pytest.raises(Exception, match="needs a draft head"):
            client.predict(*RUN_ARGS, api_name="/run")
    finally:
        demo.close()


def _header_after_compare(demo):
    """The function that rewrites the header line (#pair-info) once Compare has finished."""
    pair_id = next(c["id"] for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "pair-info")
    compare = next(i for i, fn in demo.fns.items() if fn.api_name == "compare")
    after = [fn for fn in demo.fns.values()
             if fn.trigger_after == compare and [o._id for o in fn.outputs] == [pair_id]]
    assert len(after) == 1, "nothing updates the header after Compare"
    return after[0].fn


def test_the_header_names_the_pair_after_compare_loaded_it():
    """Compare may be the first run: the header line then names the pair, as after a Live run."""
    demo, url = _launch(tiny_loader())
    try:
        header = _header_after_compare(demo)
        assert "not loaded yet" in header()
        Client(url, verbose=False).predict("the draft tree accepts", ["nanospec"], max_new_tokens=6,
                                           api_name="/compare")
        assert header().startswith("**Target:**"), header()
    finally:
        demo.close()
