"""The class poll's rules, kept in SQLite (the standard library's `sqlite3`, WAL mode).

    store = PollStore(path)                              # default: poll_db_path()
    code, token = store.create("Prompt code-06", questions)   # token: the teacher's secret
    store.show(code, token, 0)                           # question 0 is on screen and open
    store.answer(code, device, 0, 2)                     # a student's tap: one row per (poll, question, device)
    store.reveal(code, token, 0); store.counts(code, 0)  # -> [0, 0, 1, ...]

Every teacher operation takes the token (only its SHA-256 is stored); a student's operations take the
code and a random device token from the student's browser. One answer per device per question: the
answers table's primary key is (code, question, device) and a repeated answer replaces the row. Codes
are random and expire (`ttl_s`, 3 hours by default). Each operation opens its own connection, so one
store serves the web server's threads; `busy_timeout` makes concurrent writers wait instead of failing.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"   # no 0/O, 1/I: read off a projector
CODE_LENGTH = 6
TTL_S = 3 * 3600
DEVICE_RE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
STATES = ("waiting", "open", "closed", "revealed")

SCHEMA = """
CREATE TABLE IF NOT EXISTS polls (
    code TEXT PRIMARY KEY,
    teacher_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    current INTEGER NOT NULL DEFAULT -1,     -- the question on screen; -1 = none yet
    ended INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 0       -- bumped by every teacher operation (students re-render on change)
);
CREATE TABLE IF NOT EXISTS questions (
    code TEXT NOT NULL REFERENCES polls(code) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    key TEXT NOT NULL,                       -- where it comes from, e.g. "chapter-3"
    text TEXT NOT NULL,
    options TEXT NOT NULL,                   -- JSON list of strings
    answer INTEGER NOT NULL,
    why TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'open', 'closed', 'revealed')),
    PRIMARY KEY (code, idx)
);
CREATE TABLE IF NOT EXISTS answers (
    code TEXT NOT NULL,
    idx INTEGER NOT NULL,
    device TEXT NOT NULL,
    choice INTEGER NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (code, idx, device),         -- one answer per device per question
    FOREIGN KEY (code, idx) REFERENCES questions(code, idx) ON DELETE CASCADE
);
"""


class PollError(ValueError):
    """A refused request; `status` is the HTTP status the web routes answer with."""

    status = 400


class PollNotFound(PollError):
    status = 404


class PollExpired(PollError):
    status = 410


class PollForbidden(PollError):
    status = 403


class PollClosed(PollError):
    status = 409


@dataclass(frozen=True)
class PollQuestion:
    key: str
    text: str
    options: tuple[str, ...]
    answer: int
    why: str = ""

    def __post_init__(self):
        if len(self.options) < 2 or not 0 <= self.answer < len(self.options):
            raise ValueError(f"question {self.key!r}: needs 2+ options and an answer among them")


@dataclass(frozen=True)
class QuestionState:
    idx: int
    question: PollQuestion
    state: str
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Poll:
    code: str
    title: str
    created: float
    expires: float
    current: int
    ended: bool
    version: int
    size: int          # number of questions

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires


def poll_db_path(env: dict[str, str] | None = None) -> Path:
    """`$NANOSPEC_POLL_DB` if set, else `poll.sqlite3` in the nanospec cache folder (the README's rule, as the
    engine applies it: `$NANOSPEC_CACHE`, else `$XDG_CACHE_HOME/nanospec`, else `~/.cache/nanospec`): never
    the current directory."""
    env = os.environ if env is None else env
    if env.get("NANOSPEC_POLL_DB"):
        return Path(env["NANOSPEC_POLL_DB"]).expanduser()
    if env.get("NANOSPEC_CACHE"):
        return Path(env["NANOSPEC_CACHE"]).expanduser() / "poll.sqlite3"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "nanospec" / "poll.sqlite3"


@functools.lru_cache(maxsize=1)
def default_store() -> "PollStore":
    """The app's store at `poll_db_path()`, opened on first use (never at import)."""
    return PollStore(poll_db_path())


def normal_code(code: str) -> str:
    """A typed code as stored: upper case, no spaces or dashes."""
    return re.sub(r"[\s-]", "", str(code or "")).upper()[:32]


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class PollStore:
    def __init__(self, path: str | Path, ttl_s: float = TTL_S):
        self.path = Path(path)
        self.ttl_s = ttl_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def _db(self, write: bool = False):
        db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        try:
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA synchronous=NORMAL")   # WAL: durable at each checkpoint, safe against corruption
            if write:
                db.execute("BEGIN IMMEDIATE")         # take the write lock now: no upgrade deadlock between writers
            try:
                yield db
            except BaseException:
                if write:
                    db.execute("ROLLBACK")
                raise
            if write:
                db.execute("COMMIT")
        finally:
            db.close()

    # -- teacher ---------------------------------------------------------------------------------------
    def create(self, title: str, questions: list[PollQuestion], now: float | None = None) -> tuple[str, str]:
        """A new poll; returns (code, teacher token). Polls expired for a day are deleted on the way."""
        if not questions:
            raise PollError("a poll needs at least one question")
        now = time.time() if now is None else now
        token = secrets.token_urlsafe(24)
        with self._db(write=True) as db:
            db.execute("DELETE FROM polls WHERE expires < ?", (now - 86400,))
            while True:
                code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
                if db.execute("SELECT 1 FROM polls WHERE code = ?", (code,)).fetchone() is None:
                    break
            db.execute("INSERT INTO polls (code, teacher_hash, title, created, expires) VALUES (?, ?, ?, ?, ?)",
                       (code, _hash(token), title, now, now + self.ttl_s))
            db.executemany("INSERT INTO questions (code, idx, key, text, options, answer, why) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(code, i, q.key, q.text, json.dumps(list(q.options)), q.answer, q.why)
                            for i, q in enumerate(questions)])
        return code, token

    def _teacher(self, db, code: str, token: str) -> sqlite3.Row:
        row = db.execute("SELECT teacher_hash FROM polls WHERE code = ?", (normal_code(code),)).fetchone()
        if row is None:
            raise PollNotFound(f"no poll with code {normal_code(code)!r}")
        if not hmac.compare_digest(row[0], _hash(str(token or ""))):
            raise PollForbidden("this needs the teacher's key of the poll")
        return row

    def _question_idx(self, db, code: str, idx) -> int:
        try:
            idx = int(idx)
        except (TypeError, ValueError):
            raise PollError(f"question id must be a whole number, not {idx!r}") from None
        if db.execute("SELECT 1 FROM questions WHERE code = ? AND idx = ?", (code, idx)).fetchone() is None:
            raise PollError(f"poll {code} has no question {idx}")
        return idx

    def _teacher_op(self, code: str, token: str, sql: list[tuple[str, tuple]], idx=None) -> None:
        code = normal_code(code)
        with self._db(write=True) as db:
            self._teacher(db, code, token)
            if idx is not None:
                idx = self._question_idx(db, code, idx)
            for statement, params in sql:
                db.execute(statement, tuple(code if p is _CODE else idx if p is _IDX else p for p in params))
            db.execute("UPDATE polls SET version = version + 1 WHERE code = ?", (code,))

    def show(self, code: str, token: str, idx: int) -> None:
        """Put question `idx` on screen; a question shown for the first time opens for answers."""
        self._teacher_op(code, token, [
            ("UPDATE polls SET current = ? WHERE code = ?", (_IDX, _CODE)),
            ("UPDATE questions SET state = 'open' WHERE code = ? AND idx = ? AND state = 'waiting'", (_CODE, _IDX)),
        ], idx)

    def close(self, code: str, token: str, idx: int) -> None:
        """Stop taking answers to `idx` (a revealed question stays revealed)."""
        self._teacher_op(code, token, [("UPDATE questions SET state = 'closed' WHERE code = ? AND idx = ? AND "
                                        "state IN ('waiting', 'open')", (_CODE, _IDX))], idx)

    def reveal(self, code: str, token: str, idx: int) -> None:
        """Show the truth of `idx` (closes it: no answer changes after the reveal)."""
        self._teacher_op(code, token, [("UPDATE questions SET state = 'revealed' WHERE code = ? AND idx = ?",
                                        (_CODE, _IDX))], idx)

    def end(self, code: str, token: str) -> None:
        """End the poll: the open question closes (one never shown stays 'waiting': the summary leaves it out);
        students see that it is over."""
        self._teacher_op(code, token, [
            ("UPDATE polls SET ended = 1 WHERE code = ?", (_CODE,)),
            ("UPDATE questions SET state = 'closed' WHERE code = ? AND state = 'open'", (_CODE,)),
        ])

    def check_teacher(self, code: str, token: str) -> Poll:
        with self._db() as db:
            self._teacher(db, normal_code(code), token)
        return self.poll(code)

    # -- anyone with the code ---------------------------------------------------------------------------
    def poll(self, code: str, now: float | None = None, allow_expired: bool = True) -> Poll:
        code = normal_code(code)
        with self._db() as db:
            row = db.execute("SELECT code, title, created, expires, current, ended, version, "
                             "(SELECT COUNT(*) FROM questions q WHERE q.code = p.code) FROM polls p WHERE code = ?",
                             (code,)).fetchone()
        if row is None:
            raise PollNotFound(f"no poll with code {code!r}")
        poll = Poll(row[0], row[1], row[2], row[3], row[4], bool(row[5]), row[6], row[7])
        if not allow_expired and poll.expired(now):
            raise PollExpired(f"poll {code} has expired")
        return poll

    def questions(self, code: str) -> list[QuestionState]:
        """Every question of a poll with its state and its answer counts per choice."""
        code = normal_code(code)
        with self._db() as db:
            rows = db.execute("SELECT idx, key, text, options, answer, why, state FROM questions WHERE code = ? "
                              "ORDER BY idx", (code,)).fetchall()
            tallies = db.execute("SELECT idx, choice, COUNT(*) FROM answers WHERE code = ? GROUP BY idx, choice",
                                 (code,)).fetchall()
        by = {(i, c): n for i, c, n in tallies}
        out = []
        for idx, key, text, options, answer, why, state in rows:
            q = PollQuestion(key, text, tuple(json.loads(options)), answer, why)
            out.append(QuestionState(idx, q, state, tuple(by.get((idx, c), 0) for c in range(len(q.options)))))
        return out

    def counts(self, code: str, idx: int) -> list[int]:
        return list(self.questions(code)[idx].counts)

    def mine(self, code: str, device: str, idx: int) -> int | None:
        with self._db() as db:
            row = db.execute("SELECT choice FROM answers WHERE code = ? AND idx = ? AND device = ?",
                             (normal_code(code), idx, device)).fetchone()
        return None if row is None else row[0]

    # -- students ----------------------------------------------------------------------------------------
    def answer(self, code: str, device: str, idx, choice, now: float | None = None) -> None:
        """A student's answer: refused (PollError, nothing changed) unless the poll is live, `idx` is the
        question on screen and open, and `choice` is one of its options. A repeat replaces the device's row."""
        code, now = normal_code(code), (time.time() if now is None else now)
        if not isinstance(device, str) or not DEVICE_RE.match(device):
            raise PollError("device token must be 16-64 letters, digits, '-' or '_'")
        if isinstance(choice, bool) or not isinstance(choice, int):
            raise PollError(f"choice must be a whole number, not {choice!r}")
        with self._db(write=True) as db:
            row = db.execute("SELECT expires, current, ended FROM polls WHERE code = ?", (code,)).fetchone()
            if row is None:
                raise PollNotFound(f"no poll with code {code!r}")
            expires, current, ended = row
            if now >= expires:
                raise PollExpired(f"poll {code} has expired")
            if ended:
                raise PollClosed(f"poll {code} has ended")
            idx = self._question_idx(db, code, idx)
            state, options = db.execute("SELECT state, options FROM questions WHERE code = ? AND idx = ?",
                                        (code, idx)).fetchone()
            if idx != current or state != "open":
                raise PollClosed(f"question {idx} is not open for answers ({'not on screen' if idx != current else state})")
            n = len(json.loads(options))
            if not 0 <= choice < n:
                raise PollError(f"question {idx} has choices 0..{n - 1}, not {choice}")
            db.execute("INSERT INTO answers (code, idx, device, choice, at) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (code, idx, device) DO UPDATE SET choice = excluded.choice, at = excluded.at",
                       (code, idx, device, choice, now))


_CODE, _IDX = object(), object()   # placeholders in `_teacher_op`'s statements
