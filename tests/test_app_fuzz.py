"""Hostile input through `gradio_client` against the launched app (tiny engine): every knob with wrong
types, NaN/inf, out-of-range and huge values; huge prompts, control characters, chat-format edge cases;
trace replay with empty, truncated, deeply nested, wrong-typed, huge and binary files; file paths
outside the upload folder. Each request gets an answer or a clear error (never Gradio's generic one,
never a traceback in the server log), and a valid request afterwards is answered correctly."""

from __future__ import annotations

import json
import math
import random
import time

import httpx
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from tests.answer_text import answer_tokens  # noqa: E402
from app.dev.devtools import tiny_loader  # noqa: E402
from app.dev.served import free_port  # noqa: E402
from app.trace import MAX_UPLOAD_BYTES as MAX_UPLOAD  # noqa: E402
from app.ui import build_app  # noqa: E402

SEED = 17
VALID = ["the draft tree accepts the draft tree", "nanospec", 4, 3, 4, 12, 0.0, 1.0, 0, 3072, 10, False]
KNOB_NAMES = ["prompt", "method", "max_new_tokens", "depth", "top_k", "total_tokens", "temperature", "top_p",
              "seed", "capacity", "copy_branch", "budget"]
HOSTILE_VALUES = [None, "", "abc", "1e9", "nan", [], [1, 2], {}, {"a": 1}, True, False, math.nan, math.inf,
                  -math.inf, -1, 0, 10**12, -(10**12), 1e308, 3.5, 2**63, "𝔘ñí\x00"]
PROMPTS = ["", " \n\t ", "\x00\x01\x02\x1b[31mred\x7f", "a" * (1 << 20), "word " * 200_000, "user:", "user: ",
           "assistant: hi", "user: a\nassistant: b", "system: be brief", "USER: hi\nAssistant: yo\nuser: again",
           "user: a\nuser:", "\ud800 lone surrogate", "user:\u2028assistant: x", 123, None, ["user: x"], {"x": 1}]
GENERIC = "has raised an exception but has not enabled verbose error reporting"


def with_made_up_cost(loader):
    """The loader's engine with a made-up cost curve for the draft budget (nothing measured or cached)."""
    from nanospec.decoding.cost_curve import CostCurve

    def load(progress=None):
        engine, info = loader(progress)
        sizes = [2**i for i in range(9)]
        engine.use_cost_curve(CostCurve(sizes, [10.0 + 3.0 * n for n in sizes], {"device": "test:made-up"}))
        return engine, info

    return load


@pytest.fixture(scope="module")
def served():
    # charts once per run: the cases stay cheap
    demo = build_app(with_made_up_cost(tiny_loader()), chart_interval_s=60.0)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=free_port(),
                            max_file_size=MAX_UPLOAD)  # as app.py launches it
    yield demo, url, Client(url, verbose=False)
    demo.close()


def _trace_files(tmp_path, client) -> list:
    """Hostile trace files: (name, bytes)."""
    json_path = client.predict(*VALID, api_name="/run")[8]
    good = open(json_path["value"] if isinstance(json_path, dict) else json_path, "rb").read()
    doc = json.loads(good)
    rng = random.Random(SEED)
    files = [("empty.json", b""), ("empty.csv", b""), ("truncated.json", good[: len(good) // 2]),
             ("nested.json", b"[" * 200_000 + b"]" * 200_000), ("nested-obj.json", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
             ("list.json", b"[1, 2, 3]"), ("number.json", b"42"), ("string.json", b'"trace"'), ("null.json", b"null"),
             ("binary.json", bytes(rng.randrange(256) for _ in range(4096))), ("binary.csv", bytes(range(256)) * 8),
             ("utf16.json", good.decode().encode("utf-16")), ("notes.csv", b"a,b\n1,2\n"),
             ("huge.json", b'{"pad": "' + b"x" * (MAX_UPLOAD + 1024) + b'"}')]
    for key in ("events", "steps", "summary", "meta", "version"):
        for bad in (None, "x", 5, [1], {"a": []}):
            if key in doc:
                files.append((f"{key}-{type(bad).__name__}.json", json.dumps({**doc, key: bad}).encode()))
    steps_key = next(k for k in ("events", "steps") if k in doc)
    first = doc[steps_key][0]
    for field in ("tokens", "tree_tokens", "step", "phases", "coverage", "wall_ms"):
        for bad in (None, "x", [[1]], {"a": 1}, -1, 10**30):
            files.append((f"step-{field}-{bad!s:.5}.json",
                          json.dumps({**doc, steps_key: [{**first, field: bad}]}).encode()))
    for i in range(6):  # random byte flips of a good file
        data = bytearray(good)
        for _ in range(rng.randrange(1, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        files.append((f"flipped-{i}.json", bytes(data)))
    return files


def _cases(rng: random.Random) -> list[tuple[str, list]]:
    cases = []
    for i, name in enumerate(KNOB_NAMES):  # every knob x every hostile value, on /run
        for value in HOSTILE_VALUES if name != "prompt" else PROMPTS:
            args = list(VALID)
            args[i] = value
            cases.append(("/run", args))
    for _ in range(30):  # several knobs at once, on /compare, at least one of them hostile
        args = [rng.choice([VALID[0], *PROMPTS[:6]]), rng.choice([["full"], "full", None, [], ["bogus"], [1], {"a": 1}])]
        args += [rng.choice([v, *HOSTILE_VALUES]) for v in VALID[2:]]
        args[2 + rng.randrange(len(VALID) - 2)] = rng.choice(HOSTILE_VALUES[:8])
        cases.append(("/compare", args))
    for value in HOSTILE_VALUES:
        cases.append(("/scrub", [value]))
    return cases


def _clear(exc: BaseException) -> bool:
    text = str(exc)
    return bool(text.strip()) and GENERIC not in text and "Traceback" not in text


def test_hostile_requests_get_clear_errors_and_the_app_keeps_serving(served, tmp_path, capfd):
    demo, url, client = served
    t0 = time.monotonic()
    rng = random.Random(SEED)
    cases = _cases(rng)
    rng.shuffle(cases)
    outcomes = {"answered": 0, "error": 0}
    unclear = []
    for api, args in cases:
        try:
            client.predict(*args, api_name=api)
            outcomes["answered"] += 1
        except Exception as exc:  # noqa: BLE001 — judged below
            outcomes["error"] += 1
            if not _clear(exc):
                unclear.append((api, repr(args)[:120], str(exc)[:200]))
    for name, data in _trace_files(tmp_path, client):
        path = tmp_path / name
        path.write_bytes(data)
        cases.append(("/replay", [name]))
        try:
            client.predict(handle_file(str(path)), api_name="/replay")
            outcomes["answered"] += 1
        except Exception as exc:  # noqa: BLE001
            outcomes["error"] += 1
            if not _clear(exc):
                unclear.append(("/replay", name, str(exc)[:200]))
    assert len(cases) >= 200
    assert not unclear, unclear
    assert outcomes["error"] >= 150  # most of these must be refused
    # then a valid request: the same answer as the engine alone gives
    answer = client.predict(*VALID, api_name="/run")[0]
    engine, _ = tiny_loader()(None)
    expected = engine.generate(VALID[0], method="ar", max_new_tokens=VALID[2])
    assert "".join(answer_tokens(answer)) == engine.tokenizer.decode(expected.token_ids)
    assert "Traceback" not in capfd.readouterr().err
    print(f"{len(cases)} hostile cases ({outcomes}) in {time.monotonic() - t0:.0f} s")


def test_a_path_outside_the_upload_folder_is_refused(served, tmp_path):
    """The API takes file references; one naming a file that was never uploaded must not be read."""
    demo, url, client = served
    secret = tmp_path / "secret-trace.json"
    secret.write_text("{}")
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == "replay")
    for path in (str(secret), "/etc/passwd", "../../../../etc/passwd"):
        payload = {"data": [{"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "x.json"}],
                   "fn_index": fn_index, "session_hash": f"fuzz{abs(hash(path))}"}
        with httpx.Client(base_url=url, timeout=30) as http:
            event = http.post("gradio_api/call/replay", json={"data": payload["data"]})
            event.raise_for_status()
            body = http.get(f"gradio_api/call/replay/{event.json()['event_id']}").text
        assert "event: error" in body, body[:300]
        assert "root:" not in body  # nothing of /etc/passwd comes back
