"""The class poll's rules in SQLite: the teacher's key, one answer per device per question, closing,
revealing, ending, expiry, refusals that change nothing, restart persistence, concurrent writers."""

from __future__ import annotations

import threading

import pytest

from app.poll.charts import bars_html, live_html, summary_html, truth_sentence
from app.poll.store import (CODE_ALPHABET, CODE_LENGTH, PollClosed, PollError, PollExpired, PollForbidden,
                            PollNotFound, PollQuestion, PollStore, poll_db_path)

QUESTIONS = [PollQuestion("chapter-2", "How many?", ("0", "1", "2", "3"), 2, "Because."),
             PollQuestion("chapter-3", "Which phase?", ("draft", "lm head"), 1, "Timer.")]
DEV = [f"device-{i:02d}-abcdefghijkl" for i in range(40)]


@pytest.fixture
def store(tmp_path):
    return PollStore(tmp_path / "poll.sqlite3")


def started(store, idx=0):
    code, token = store.create("test", QUESTIONS)
    store.show(code, token, idx)
    return code, token


def test_codes_are_random_short_and_distinct_and_the_key_is_not_the_code(store):
    made = [store.create("t", QUESTIONS) for _ in range(30)]
    codes = {c for c, _ in made}
    assert len(codes) == 30
    assert all(len(c) == CODE_LENGTH and set(c) <= set(CODE_ALPHABET) for c in codes)
    assert all(len(t) >= 32 and c not in t for c, t in made)


def test_teacher_operations_need_the_key(store):
    code, token = store.create("t", QUESTIONS)
    for op in (lambda k: store.show(code, k, 0), lambda k: store.close(code, k, 0),
               lambda k: store.reveal(code, k, 0), lambda k: store.end(code, k)):
        for bad in ("", "x" * 32, None, code):
            with pytest.raises(PollForbidden):
                op(bad)
    assert store.poll(code).current == -1 and not store.poll(code).ended
    assert [q.state for q in store.questions(code)] == ["waiting", "waiting"]
    with pytest.raises(PollNotFound):
        store.show("NOSUCH", token, 0)


def test_the_database_holds_only_a_hash_of_the_key(store):
    code, token = store.create("t", QUESTIONS)
    assert token.encode() not in store.path.read_bytes()
    wal = store.path.with_name(store.path.name + "-wal")
    assert not wal.exists() or token.encode() not in wal.read_bytes()


def test_one_answer_per_device_per_question_and_a_repeat_replaces(store):
    code, token = started(store)
    for _ in range(200):
        store.answer(code, DEV[0], 0, 1)
    assert store.counts(code, 0) == [0, 1, 0, 0]
    store.answer(code, DEV[0], 0, 3)                 # changed their mind: still one answer
    assert store.counts(code, 0) == [0, 0, 0, 1]
    for d in DEV[1:11]:
        store.answer(code, d, 0, 2)
    assert store.counts(code, 0) == [0, 0, 10, 1]
    assert store.mine(code, DEV[0], 0) == 3 and store.mine(code, DEV[20], 0) is None


@pytest.mark.parametrize("question,choice,device,error", [
    (7, 0, DEV[0], PollError),            # unknown question
    ("x", 0, DEV[0], PollError),
    (None, 0, DEV[0], PollError),
    (1, 0, DEV[0], PollClosed),           # exists but not on screen
    (0, 4, DEV[0], PollError),            # no such choice
    (0, -1, DEV[0], PollError),
    (0, "1", DEV[0], PollError),
    (0, True, DEV[0], PollError),
    (0, 1.0, DEV[0], PollError),
    (0, 1, "short", PollError),           # malformed device token
    (0, 1, "bad token with spaces!!", PollError),
    (0, 1, None, PollError),
])
def test_bad_answers_are_refused_and_change_nothing(store, question, choice, device, error):
    code, token = started(store)
    store.answer(code, DEV[5], 0, 0)
    with pytest.raises(error):
        store.answer(code, device, question, choice)
    assert [q.counts for q in store.questions(code)] == [(1, 0, 0, 0), (0, 0)]


def test_closing_and_revealing_stop_answers_and_keep_the_counts(store):
    code, token = started(store)
    store.answer(code, DEV[0], 0, 2)
    store.close(code, token, 0)
    with pytest.raises(PollClosed):
        store.answer(code, DEV[0], 0, 1)         # no change after closing
    with pytest.raises(PollClosed):
        store.answer(code, DEV[1], 0, 1)
    store.reveal(code, token, 0)
    with pytest.raises(PollClosed):
        store.answer(code, DEV[0], 0, 1)
    assert store.counts(code, 0) == [0, 0, 1, 0]
    qs = store.questions(code)[0]
    assert qs.state == "revealed" and truth_sentence(qs) == "1 of 1 answered “2”, the right answer."
    store.show(code, token, 1)                   # next question opens; the revealed one stays revealed
    store.answer(code, DEV[0], 1, 0)
    assert [q.state for q in store.questions(code)] == ["revealed", "open"]
    store.show(code, token, 0)                   # going back does not reopen it
    assert store.questions(code)[0].state == "revealed"


def test_ending_closes_everything(store):
    code, token = started(store)
    store.end(code, token)
    assert store.poll(code).ended
    with pytest.raises(PollClosed):
        store.answer(code, DEV[0], 0, 1)
    html = summary_html(store.questions(code))
    assert "Nobody answered" in html and "How many?" in html and "Which phase?" not in html   # never asked


def test_codes_expire(tmp_path):
    store = PollStore(tmp_path / "p.sqlite3", ttl_s=60)
    code, token = store.create("t", QUESTIONS, now=1000.0)
    store.show(code, token, 0)
    store.answer(code, DEV[0], 0, 1, now=1059.0)
    with pytest.raises(PollExpired):
        store.answer(code, DEV[1], 0, 1, now=1060.0)
    assert store.counts(code, 0) == [0, 1, 0, 0]
    assert store.poll(code).expired(1060.0) and not store.poll(code).expired(1059.9)
    with pytest.raises(PollExpired):
        store.poll(code, now=1061.0, allow_expired=False)
    # a day after expiry a new poll's creation deletes it
    store.create("t", QUESTIONS, now=1060.0 + 86401)
    with pytest.raises(PollNotFound):
        store.poll(code)


def test_a_restart_keeps_the_answers(tmp_path):
    path = tmp_path / "folder" / "poll.sqlite3"
    first = PollStore(path)
    code, token = started(first)
    for d in DEV[:7]:
        first.answer(code, d, 0, 3)
    del first
    again = PollStore(path)                      # a new process opens the same file
    assert again.counts(code, 0) == [0, 0, 0, 7]
    again.answer(code, DEV[0], 0, 0)             # and the one-per-device rule still holds
    assert again.counts(code, 0) == [1, 0, 0, 6]
    again.reveal(code, token, 0)                 # the teacher's key still works


def test_concurrent_answers_from_many_threads_are_each_counted_once(store):
    code, token = started(store)
    errors = []

    def student(device):
        try:
            for choice in (0, 1, 2, 1, 3, 2):   # changes their mind; the last one counts
                store.answer(code, device, 0, choice)
        except Exception as exc:  # noqa: BLE001 — collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=student, args=(d,)) for d in DEV[:30]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.counts(code, 0) == [0, 0, 30, 0]


def test_the_default_path_is_the_cache_folder_or_the_variable_never_the_cwd(tmp_path, monkeypatch):
    assert poll_db_path({"NANOSPEC_POLL_DB": str(tmp_path / "x.db")}) == tmp_path / "x.db"
    monkeypatch.delenv("NANOSPEC_POLL_DB", raising=False)
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path / "cache"))
    assert poll_db_path() == tmp_path / "cache" / "poll.sqlite3"
    assert poll_db_path({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "nanospec" / "poll.sqlite3"
    assert poll_db_path({}).is_absolute()


def test_projector_html_marks_the_truth_only_when_revealed(store):
    code, token = started(store)
    for d, c in zip(DEV[:23], [2] * 14 + [1] * 9):
        store.answer(code, d, 0, c)
    qs = store.questions(code)[0]
    live = live_html(qs, "Question 1 of 2", code, "http://x/poll/" + code)
    assert "23 answers" in live and "✓" not in live and "right answer" not in live
    store.reveal(code, token, 0)
    qs = store.questions(code)[0]
    shown = live_html(qs, "Question 1 of 2", code, "http://x/poll/" + code)
    assert "14 of 23 answered “2”, the right answer." in shown and "✓ 2" in shown
    assert bars_html(qs, True).count("class='lab right'") == 1


@pytest.mark.parametrize("env", [{"NANOSPEC_CACHE": "/tmp/nc"}, {"XDG_CACHE_HOME": "/tmp/xdg"}, {}])
def test_the_default_folder_is_the_engines_cache_folder(env, monkeypatch):
    from nanospec.loaders.default_model import cache_root

    for name in ("NANOSPEC_CACHE", "XDG_CACHE_HOME", "NANOSPEC_POLL_DB"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert poll_db_path().parent == cache_root()
