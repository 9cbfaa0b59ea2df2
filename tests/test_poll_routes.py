"""The student's web routes: the phone page, its state and answer endpoints, clear refusals, no secrets."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.poll.routes import MAX_BODY_BYTES, poll_app_kwargs
from app.poll.store import PollQuestion, PollStore

QUESTIONS = [PollQuestion("chapter-2", "How many tokens?", ("0", "1", "2"), 1, "The target agreed once."),
             PollQuestion("chapter-3", "Which <phase>?", ("draft", "head"), 0, "")]
DEV = "abcdefghijklmnop-1234"


@pytest.fixture
def served(tmp_path):
    store = PollStore(tmp_path / "poll.sqlite3")
    app = FastAPI(**poll_app_kwargs(store))
    code, token = store.create("test", QUESTIONS)
    return TestClient(app), store, code, token


def send(client, code, question, choice, device=DEV):
    return client.post(f"/poll/{code}/answer", json={"question": question, "choice": choice, "device": device})


def test_the_phone_page_loads_with_the_state_and_without_the_key(served):
    client, store, code, token = served
    store.show(code, token, 0)
    page = client.get(f"/poll/{code}")
    assert page.status_code == 200 and "How many tokens?" in page.text
    assert token not in page.text and "teacher_hash" not in page.text
    assert "width=device-width" in page.text and len(page.content) < 20_000
    assert client.get(f"/poll/{code.lower()}").status_code == 200      # typed in lower case


def test_the_join_page_and_a_typed_code(served):
    client, _, code, _ = served
    assert "Class code" in client.get("/poll").text
    r = client.get("/poll", params={"code": f" {code.lower()} "}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/poll/{code}"


def test_unknown_and_expired_codes_get_a_clear_page(served, tmp_path):
    client, _, _, _ = served
    r = client.get("/poll/ZZZZZZ")
    assert r.status_code == 404 and "No poll with this code" in r.text and "Traceback" not in r.text
    old = PollStore(tmp_path / "old.sqlite3", ttl_s=1)
    code, _ = old.create("t", QUESTIONS, now=0.0)
    c2 = TestClient(FastAPI(**poll_app_kwargs(old)))
    r = c2.get(f"/poll/{code}")
    assert r.status_code == 410 and "expired" in r.text
    assert send(c2, code, 0, 1).status_code == 410


def test_answer_state_flow(served):
    client, store, code, token = served
    assert client.get(f"/poll/{code}/state").json()["status"] == "waiting"
    store.show(code, token, 0)
    for _ in range(200):
        r = send(client, code, 0, 2)
    assert r.status_code == 200 and r.json()["state"]["mine"] == 2
    assert send(client, code, 0, 1).json()["state"]["mine"] == 1
    st = client.get(f"/poll/{code}/state", params={"device": DEV}).json()
    assert st["status"] == "open" and st["mine"] == 1 and st["answered"] == 1
    assert "counts" not in st and "answer" not in st and "why" not in st     # not before the reveal
    store.reveal(code, token, 0)
    st = client.get(f"/poll/{code}/state", params={"device": DEV}).json()
    assert st["status"] == "revealed" and st["counts"] == [0, 1, 0] and st["answer"] == 1
    assert st["why"] == "The target agreed once."
    assert "device" not in str(client.get(f"/poll/{code}/state").json())  # no one's identity
    store.end(code, token)
    assert client.get(f"/poll/{code}/state").json()["status"] == "ended"


@pytest.mark.parametrize("body,status", [
    ({"question": 9, "choice": 0, "device": DEV}, 400),       # unknown question
    ({"question": 1, "choice": 0, "device": DEV}, 409),       # not the open one
    ({"question": 0, "choice": 3, "device": DEV}, 400),       # no such choice
    ({"question": 0, "choice": "1", "device": DEV}, 400),
    ({"question": 0, "choice": 1}, 400),                      # no device
    ({"question": 0, "choice": 1, "device": "x"}, 400),
    ([0, 1], 400),
])
def test_bad_answers_are_refused_clearly_and_change_nothing(served, body, status):
    client, store, code, token = served
    store.show(code, token, 0)
    send(client, code, 0, 0, device="zyxwvutsrqponmlk-99")
    r = client.post(f"/poll/{code}/answer", json=body)
    assert r.status_code == status and r.json()["error"]
    assert [q.counts for q in store.questions(code)] == [(1, 0, 0), (0, 0)]


def test_oversized_or_malformed_bodies_are_refused(served):
    client, store, code, token = served
    store.show(code, token, 0)
    big = '{"question": 0, "choice": 1, "device": "' + DEV + '", "pad": "' + "x" * MAX_BODY_BYTES + '"}'
    r = client.post(f"/poll/{code}/answer", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most" in r.json()["error"]

    def chunks():   # no content-length: the stream is cut at the limit
        for _ in range(64):
            yield b"x" * 512

    assert client.post(f"/poll/{code}/answer", content=chunks()).status_code == 413
    assert client.post(f"/poll/{code}/answer", content=b"not json").status_code == 400
    assert client.post("/poll/NOSUCH/answer", json={"question": 0, "choice": 1, "device": DEV}).status_code == 404
    assert store.counts(code, 0) == [0, 0, 0]


def test_students_have_no_way_to_steer(served):
    client, store, code, token = served
    store.show(code, token, 0)
    for path in ("reveal", "close", "end", "reset", "next"):
        assert client.post(f"/poll/{code}/{path}", json={"question": 0}).status_code in (404, 405)
    assert store.questions(code)[0].state == "open" and not store.poll(code).ended
