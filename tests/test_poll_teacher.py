"""The teacher's panel without a browser: the questions come from the lesson, the poll follows the chapters,
reveal / close / next / end, and where students are told to go."""

from __future__ import annotations

import pytest

from app.poll.store import PollForbidden, PollStore
from app.lesson.poll_panel import Teacher, chapter_of, local_only, poll_questions, public_base


@pytest.fixture(scope="module")
def lesson():
    from app.lesson.callbacks import lesson_data

    try:
        return lesson_data()
    except FileNotFoundError as exc:
        pytest.skip(f"no recorded lesson traces: {exc}")


class Req:
    def __init__(self, **headers):
        self.headers = headers


def test_the_poll_asks_the_lessons_own_questions(lesson):
    from app.lesson import CHAPTERS
    from app.lesson.callbacks import question

    prompt = lesson.prompt_ids[0]
    qs = poll_questions(prompt)
    asked = [c.number for c in CHAPTERS if question(c.number, prompt) is not None]
    assert [chapter_of(q.key) for q in qs] == asked and len(qs) >= 5
    for q in qs:
        source = question(chapter_of(q.key), prompt)
        assert (q.text, list(q.options), q.answer) == (source.text, source.options, source.answer)
        assert "&quot;" not in q.why and "&#x27;" not in q.why    # plain text for the phones


def test_start_follow_reveal_next_end(lesson, tmp_path):
    store = PollStore(tmp_path / "p.sqlite3")
    t = Teacher(store)
    prompt = lesson.prompt_ids[0]
    st, *_, live, _, _, summary = t.start(2, prompt, Req(host="10.0.0.5:7860"))
    code = st["code"]
    assert st["base"] == "http://10.0.0.5:7860" and f"http://10.0.0.5:7860/poll/{code}" in live
    assert store.poll(code).current == 0 and store.questions(code)[0].state == "open"   # chapter 2's question
    store.answer(code, "student-device-000001", 0, 1)
    assert "1 answer" in t.refresh(st)
    t.close(st)
    assert store.questions(code)[0].state == "closed"
    out = t.reveal(st, prompt, True, 0)
    assert store.questions(code)[0].state == "revealed" and "the right answer" in out[-1]
    assert out[6] is False                         # the lesson's question is no longer pending
    nxt = t.next(st, prompt, True, 0)
    assert nxt[0] == 3                             # the next chapter with a question
    t.follow(st, 3, prompt)                        # the chapter change puts its question on the phones
    assert store.poll(code).current == 1 and store.questions(code)[1].state == "open"
    note = t.follow(st, 4, "some-other-prompt")    # another prompt: the poll does not follow
    assert store.poll(code).current == 1 and "switch back" in note and "switch back" in t.refresh(st)
    t.follow(st, 1, prompt)                        # a chapter without a question: nothing changes
    assert store.poll(code).current == 1
    ended = t.end(st)
    assert ended[0] is None and store.poll(code).ended and "Chapter 2" in ended[-1] and "Chapter 3" in ended[-1]


def test_a_forged_session_cannot_steer(lesson, tmp_path):
    store = PollStore(tmp_path / "p.sqlite3")
    t = Teacher(store)
    st = t.start(2, lesson.prompt_ids[0], Req(host="10.0.0.5:7860"))[0]
    with pytest.raises(PollForbidden):
        t.close({**st, "token": "guessed"})
    assert store.questions(st["code"])[0].state == "open"


def test_public_address(monkeypatch):
    monkeypatch.delenv("NANOSPEC_POLL_URL", raising=False)
    assert public_base(Req(host="x.hf.space")) == "https://x.hf.space"
    assert public_base(Req(host="a:1", **{"x-forwarded-host": "class.example.org",
                                           "x-forwarded-proto": "https"})) == "https://class.example.org"
    assert public_base(None, {"NANOSPEC_POLL_URL": "http://192.168.1.20:7860/"}) == "http://192.168.1.20:7860"
    assert local_only("http://127.0.0.1:7860") and local_only("http://localhost:7860") and local_only("http://[::1]:80")
    assert not local_only("http://192.168.1.20:7860") and not local_only("https://x.hf.space")
