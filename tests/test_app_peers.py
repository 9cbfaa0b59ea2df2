"""The Compare tab's vLLM rows (app/peers.py), through the callbacks with the tiny random engine (no server):
rows beside this engine's with their identity check, one line (never an error) when vLLM is missing or the
run samples, and Stop ends the child.

vLLM itself is stood in for by a script that answers the peer's probe and requests as the worker
(`nanospec/bench/peers/vllm_worker.py`) does, so these run without vLLM; the real vLLM rows are checked
by tests/test_vllm_peer.py where `$NANOSPEC_VLLM_PYTHON` has vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time

import gradio as gr
import pytest

from app import peers as app_peers
from app.callbacks import Explorer
from app.dev.devtools import tiny_loader
from app.models import EngineProvider
from nanospec.bench.peers import vllm_peer

PROMPT = "the draft tree accepts the draft tree"
KNOBS = dict(max_new_tokens=6, depth=2, top_k=2, total_tokens=4)
QUIET = dict(progress=lambda *a, **k: None)
HAS_VLLM_HERE = importlib.util.find_spec("vllm") is not None

FAKE = '''#!{python}
"""A stand-in for vLLM's interpreter: the worker's probe and result formats, no model."""
import json, os, sys, time
if sys.argv[2] == "--probe":
    print(json.dumps({{"vllm": "0.32.0", "preload": []}}))
    sys.exit(0)
request = json.loads(open(sys.argv[2]).read())
log = {log!r}
with open(os.path.join(log, "pids"), "a") as f:
    f.write(f"{{os.getpid()}}\\n")
with open(os.path.join(log, "requests.jsonl"), "a") as f:
    f.write(json.dumps({{**request, "nanospec_env": os.environ.get("NANOSPEC_VLLM_ACTIVE_VOCAB")}}) + "\\n")
time.sleep({sleep_s})
output = json.loads(open({output!r}).read())
active = request.get("active_vocab")
json.dump({{"vllm": "0.32.0", "kind": request["kind"], "load_s": 1.0, "device": "cpu", "threads": 1,
           "cpu_share": 0.9, "settings": {{}}, "speculative_config": None, "notes": [],
           "vocab": {{"mean_active": 120.0, "coverage": 0.75}} if active else None,
           "prompts": [{{"output": output, "wall_s": 0.5, "drafts": 0 if request["kind"] == "plain" else 2,
                        "draft_tokens": 0 if request["kind"] == "plain" else 6,
                        "accepted": 0 if request["kind"] == "plain" else 3}} for _ in request["prompts"]]}},
          open(sys.argv[3], "w"))
'''


def fake_vllm(tmp_path, monkeypatch, output: list[int], sleep_s: float = 0.0):
    """Point `$NANOSPEC_VLLM_PYTHON` at a stand-in whose every output is `output`; its log folder."""
    log = tmp_path / "log"
    log.mkdir()
    out = tmp_path / "output.json"
    out.write_text(json.dumps(output))
    script = tmp_path / "python"
    script.write_text(FAKE.format(python=sys.executable, log=str(log), sleep_s=sleep_s, output=str(out)))
    script.chmod(0o755)
    monkeypatch.setenv(vllm_peer.PYTHON_ENV, str(script))
    return log


@pytest.fixture(scope="module")
def explorer():
    return Explorer(EngineProvider(tiny_loader()), chart_interval_s=0.0)


@pytest.fixture(scope="module")
def ar_output(explorer):
    outs = list(explorer.run_compare(PROMPT, [], **KNOBS, **QUIET))
    return outs[-1][3]["ar"][1].output_ids


def _rows(out) -> dict[str, dict]:
    table = out[0]
    return {row["method"]: row for row in table.to_dict("records")}


def test_vllm_rows_sit_beside_this_engines_with_their_identity_check(explorer, ar_output, tmp_path, monkeypatch):
    log = fake_vllm(tmp_path, monkeypatch, ar_output)
    outs = list(explorer.run_compare(PROMPT, ["full"], **KNOBS, peers=["vllm:nanospec", "vllm:plain"], **QUIET))
    final = outs[-1]
    rows = _rows(final)
    assert list(rows) == ["ar", "full", "vllm:plain", "vllm:nanospec"]  # the page's order, after this engine's
    assert all(r["identical to ar"] == "✓" for r in rows.values())
    assert rows["vllm:plain"]["τ"] == "1.00" and rows["vllm:nanospec"]["τ"] == "2.50"  # 5 after prefill in 2 forwards
    assert rows["vllm:nanospec"]["mean active"] == "120" and rows["vllm:nanospec"]["coverage"] == "75.0%"
    assert rows["vllm:plain"]["mean active"] == "–" and rows["vllm:plain"]["draft ms/step"] == "–"
    verdict = final[2]
    assert verdict.startswith("### ✓ Output identical to autoregressive") and "vllm:plain, vllm:nanospec" in verdict
    assert "vLLM rows: vLLM 0.32.0 on cpu" in verdict
    assert any("in vLLM's own process" in out[2] for out in outs)  # the status while the children ran
    figure = json.loads(final[1].plot)
    assert figure["data"][0]["marker"]["color"][2:] == ["#e08e2b", "#e08e2b"]
    # what each child was asked: this engine's prompt ids, greedy kinds, the plugin only for vllm:nanospec
    requests = [json.loads(line) for line in (log / "requests.jsonl").read_text().splitlines()]
    engine, _ = explorer.provider.get()
    assert [(r["kind"], r["active_vocab"], r["nanospec_env"]) for r in requests] == [
        ("plain", False, "0"), ("eagle", True, "1")]
    assert all(r["prompts"] == [engine.encode_prompt(PROMPT)] and r["max_new_tokens"] == 6 for r in requests)
    assert "vllm:plain" not in final[3]  # the race replays this engine's runs only


def test_a_vllm_row_that_differs_is_named(explorer, ar_output, tmp_path, monkeypatch):
    fake_vllm(tmp_path, monkeypatch, [t + 1 for t in ar_output])
    final = list(explorer.run_compare(PROMPT, [], **KNOBS, peers=["vllm:plain"], **QUIET))[-1]
    assert _rows(final)["vllm:plain"]["identical to ar"] == "✗"
    assert final[2].startswith("### ✗ Output differs from autoregressive at temperature 0: vllm:plain")
    assert "vLLM's output differs from this engine's `ar`" in final[2]


@pytest.mark.skipif(HAS_VLLM_HERE, reason="this interpreter has vLLM: the missing-vLLM path needs one without")
def test_without_vllm_the_control_is_off_and_a_request_is_one_line(explorer, monkeypatch):
    monkeypatch.setenv(vllm_peer.PYTHON_ENV, sys.executable)
    offered, about = app_peers.control_info()
    assert not offered and "vLLM is not installed" in about
    final = list(explorer.run_compare(PROMPT, ["full"], **KNOBS, peers=["vllm:eagle"], **QUIET))[-1]
    assert list(_rows(final)) == ["ar", "full"]
    assert "vllm peer skipped: vLLM is not installed for" in final[2]


def test_the_control_is_offered_where_vllm_runs(tmp_path, monkeypatch):
    fake_vllm(tmp_path, monkeypatch, [1])
    offered, about = app_peers.control_info()
    assert offered and about.startswith("vLLM 0.32.0")


def test_sampling_runs_no_vllm_rows_and_says_why(explorer, tmp_path, monkeypatch):
    log = fake_vllm(tmp_path, monkeypatch, [1])
    final = list(explorer.run_compare(PROMPT, [], **{**KNOBS, "temperature": 0.7}, peers=["vllm:plain"],
                                      **QUIET))[-1]
    assert list(_rows(final)) == ["ar"]
    assert "vLLM rows compare greedy outputs token for token: set temperature 0" in final[2]
    assert not (log / "requests.jsonl").exists()


def test_an_unknown_vllm_row_is_an_invalid_input(explorer):
    with pytest.raises(gr.Error, match=r"unknown vLLM rows \['vllm:medusa'\]; choose from vllm:plain"):
        list(explorer.run_compare(PROMPT, [], **KNOBS, peers=["vllm:medusa"], **QUIET))


def test_stop_ends_the_vllm_child(explorer, ar_output, tmp_path, monkeypatch):
    """Closing the Compare generator (what the page's Stop does) kills the running child."""
    log = fake_vllm(tmp_path, monkeypatch, ar_output, sleep_s=120)
    run = explorer.run_compare(PROMPT, [], **KNOBS, peers=["vllm:plain", "vllm:ngram"], **QUIET)
    for out in run:
        if "in vLLM's own process" in out[2]:
            break
    deadline = time.monotonic() + 10
    while not (log / "pids").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int((log / "pids").read_text().split()[0])
    run.close()
    while _alive(pid) and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    assert not _alive(pid), "the vLLM child outlived Stop"
    time.sleep(2 * vllm_peer.POLL_S)
    assert len((log / "pids").read_text().split()) == 1  # the next kind never started


def test_a_stopped_peer_says_so():
    """`app.peers.run` with its stop event set: no rows, a 'stopped' line per kind."""
    stop = threading.Event()
    stop.set()
    spec = vllm_peer.parse_peers("vllm:plain")
    peer = vllm_peer.VllmPeer(spec, sys.executable)
    peer.found, peer.error = vllm_peer.Probe(sys.executable, version="0.32.0"), None
    target = vllm_peer.PeerTarget("m", None, None, "float32", 2, [], 1)
    assert peer.run(target, [[1, 2]], stop=stop) == [] and peer.failure_lines() == ["vllm:plain failed: stopped"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by a parent that is not ours) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
