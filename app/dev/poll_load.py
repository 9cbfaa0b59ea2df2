"""Load test of the class poll: 30 students on their phones while visitors decode in the same app.

    python -m app.dev.poll_load                    # 30 students, 5 questions, 4 decoding visitors
    python -m app.dev.poll_load --students 30 --questions 5 --decoders 4 --max-new-tokens 64

It starts `python app.py` on 127.0.0.1 (its own process, the default pair, a fresh poll database in a
temporary folder) and only sends requests from here:
- decoders: `--decoders` gradio_client visitors press Run back to back (the app decodes one run at a
  time, its model queue, so this keeps the engine busy all the time); each run's tokens/s is the
  engine's own figure from the run's trace (`decode_tokens_per_s`: decoding after the prefill);
- phase 1 "alone": that decoding without the poll, for `--alone-s` seconds and at least `--alone-runs` runs;
- phase 2 "with the class": the same decoding while `--students` simulated phones (httpx + asyncio) join
  within `--join-s` seconds (GET /poll/<code>: the page load), poll the state every 1.5 s as the
  page's script does, and answer each open question (POST /poll/<code>/answer), a third of them
  changing their mind once; one more device sends 200 answers to the first question. The teacher
  (this script, with the poll's key, through the same SQLite file the app uses) shows each question
  for `--question-s` seconds, reveals it and moves on.
Checks: every count in the poll (what the projector draws) equals the students' last answers exactly,
and the 200 answers from one device count as one. Prints p50/p95 latency of page loads, answers and
state polls, and decoding tokens/s alone vs with the class. Figures: docs/benchmarks.md ("Class poll").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from app.dev.served import connect, free_port, start_app, stop_app

PROMPT = "Write a short story about a robot who learns to paint."


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


class Decoders:
    """`n` visitors pressing Run back to back; records each finished run's decoding tokens/s with its end time."""

    def __init__(self, url: str, server, n: int, max_new_tokens: int):
        from app.inputs import DEFAULTS

        self.opts = {**DEFAULTS, "max_new_tokens": max_new_tokens}
        self.clients = [connect(url, server) for _ in range(n)]
        self.runs: list[tuple[float, float, int]] = []   # (finished at, decode tokens/s, new tokens)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._visitor, args=(c,), daemon=True) for c in self.clients]
        self.errors: list[str] = []

    def warm_up(self) -> None:
        self.clients[0].predict(PROMPT, **self.opts, api_name="/run")   # loads the pair in the app

    def _visitor(self, client) -> None:
        from nanospec.events import load_trace

        while not self.stop.is_set():
            try:
                out = client.predict(PROMPT, **self.opts, api_name="/run")
                # the run's JSON trace: the API's outputs leave the State out, so it is the 9th (LIVE_OUTPUTS)
                values = [o.get("value") if isinstance(o, dict) else o for o in out]
                trace = next(v for v in values if isinstance(v, str) and v.endswith(".json"))
                _, summary, _ = load_trace(trace)
                self.runs.append((time.monotonic(), summary.decode_tokens_per_s, summary.new_tokens))
            except Exception as exc:  # noqa: BLE001 — reported, not fatal to the load test
                if self.stop.is_set():
                    return   # the run in flight when the server stopped
                self.errors.append(repr(exc)[:200])
                time.sleep(1.0)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        """Stop sending runs; the runs in the queue are not waited for (the server is stopped next)."""
        self.stop.set()

    def between(self, t0: float, t1: float) -> list[float]:
        return [tps for at, tps, _ in self.runs if t0 <= at <= t1]


class _Classroom:
    """One simulated class against a running app: the students' devices, one device that answers 200
    times, and the teacher's steps through the questions; the latencies and each device's last answer."""

    def __init__(self, http, store, code: str, token: str, rng: random.Random, question_s: float):
        self.http, self.store, self.code, self.token = http, store, code, token
        self.rng, self.question_s = rng, question_s
        self.lat = {"page": [], "answer": [], "state": []}
        self.last: dict[tuple[int, str], int] = {}
        self.refused: list[str] = []
        self.done = asyncio.Event()

    async def timed(self, kind: str, coro):
        t0 = time.perf_counter()
        r = await coro
        self.lat[kind].append(time.perf_counter() - t0)
        return r

    async def student(self, i: int, join_s: float) -> None:
        rng, code = self.rng, self.code
        device = f"loadtest-device-{i:04d}-{rng.randrange(16**8):08x}"
        await asyncio.sleep(rng.uniform(0, join_s))
        r = await self.timed("page", self.http.get(f"/poll/{code}"))
        if r.status_code != 200:
            self.refused.append(f"page {r.status_code}")
        answered: set[int] = set()
        while not self.done.is_set():
            r = await self.timed("state", self.http.get(f"/poll/{code}/state", params={"device": device}))
            st = r.json()
            q = st.get("question")
            if st.get("status") == "open" and q and q["id"] not in answered:
                answered.add(q["id"])
                await asyncio.sleep(rng.uniform(0.3, min(3.0, self.question_s / 3)))
                await self.answer(q, device)
            await asyncio.sleep(1.5)

    async def answer(self, q: dict, device: str) -> None:
        """One choice, and a changed mind a third of the time; the last accepted one counts."""
        picks = [self.rng.randrange(len(q["options"]))]
        if self.rng.random() < 1 / 3:
            picks.append(self.rng.randrange(len(q["options"])))
        for choice in picks:
            r = await self.timed("answer", self.http.post(f"/poll/{self.code}/answer", json={
                "question": q["id"], "choice": choice, "device": device}))
            if r.status_code == 200:
                self.last[(q["id"], device)] = choice
            else:
                self.refused.append(f"answer {r.status_code}: {r.text[:80]}")

    async def spammer(self) -> None:
        device = "loadtest-one-device-200-answers"
        while self.store.poll(self.code).current != 0:
            await asyncio.sleep(0.1)
        for k in range(200):
            r = await self.http.post(f"/poll/{self.code}/answer",
                                     json={"question": 0, "choice": k % 2, "device": device})
            if r.status_code == 200:
                self.last[(0, device)] = k % 2

    async def teacher(self, n_questions: int, join_s: float) -> None:
        await asyncio.sleep(join_s)        # everyone has joined
        for idx in range(n_questions):
            self.store.show(self.code, self.token, idx)
            await asyncio.sleep(self.question_s)
            self.store.reveal(self.code, self.token, idx)
            await asyncio.sleep(1.0)
        self.done.set()


async def classroom(url: str, store, code: str, token: str, n_questions: int, students: int, join_s: float,
                    question_s: float, seed: int) -> dict:
    """The teacher steps through the questions while the students join, poll and answer. Returns latencies
    and the answers each device sent last per question."""
    import httpx

    limits = httpx.Limits(max_connections=students + 8)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:
        room = _Classroom(http, store, code, token, random.Random(seed), question_s)
        await asyncio.gather(room.teacher(n_questions, join_s), room.spammer(),
                             *(room.student(i, join_s) for i in range(students)))
    return {"lat": room.lat, "last": room.last, "refused": room.refused}


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--decoders", type=int, default=4)
    parser.add_argument("--join-s", type=float, default=10.0, help="students join within this many seconds")
    parser.add_argument("--question-s", type=float, default=10.0, help="each question stays open this long")
    parser.add_argument("--alone-s", type=float, default=60.0, help="decoding without the poll, first")
    parser.add_argument("--alone-runs", type=int, default=3, help="... and until this many runs finished alone")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--app-args", default="", help="extra arguments for app.py, e.g. '--tiny'")
    args = parser.parse_args(argv)
    if not 1 <= args.students <= 200 or not 0 <= args.decoders <= 8:
        raise SystemExit("load_bench: --students 1..200 and --decoders 0..8 (a local test, bounded)")

    from app.lesson.callbacks import lesson_data
    from app.poll.store import PollStore
    from app.lesson.poll_panel import poll_questions

    questions = poll_questions(lesson_data().prompt_ids[0])[:args.questions]
    with tempfile.TemporaryDirectory(prefix="nanospec-poll-bench-") as tmp:
        db = Path(tmp) / "poll.sqlite3"
        os.environ["NANOSPEC_POLL_DB"] = str(db)          # inherited by the app's process
        store = PollStore(db)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_app(port, *args.app_args.split())
        try:
            connect(url + "/", server)   # waits until the app serves
            say(f"app up on {url}")
            dec = Decoders(url + "/", server, args.decoders, args.max_new_tokens) if args.decoders else None
            if dec:
                dec.warm_up()
                say("model loaded (warm-up run done); decoding alone")
                dec.start()
            t0 = time.monotonic()
            # at least --alone-s, and until --alone-runs runs have finished (a busy machine decodes slowly)
            while dec and (time.monotonic() - t0 < args.alone_s or len(dec.between(t0, time.monotonic())) < args.alone_runs):
                time.sleep(0.5)
            t1 = time.monotonic()
            say(f"{len(dec.runs) if dec else 0} runs finished alone; the class joins")
            code, token = store.create("load test", questions)
            result = asyncio.run(classroom(url, store, code, token, len(questions), args.students, args.join_s,
                                           args.question_s, args.seed))
            t2 = time.monotonic()
            say("the class is done")
            if dec:
                dec.finish()
        finally:
            stop_app(server)
        report(args, store, code, questions, result, dec, (t0, t1, t2))


def report(args, store, code, questions, result, dec, times) -> None:
    t0, t1, t2 = times
    lat, last = result["lat"], result["last"]
    print(f"class poll load test: {args.students} students joining within {args.join_s:.0f} s, {len(questions)} "
          f"questions open {args.question_s:.0f} s each, {args.decoders} visitors decoding back to back "
          f"({args.max_new_tokens} new tokens a run, the app's default method), cpu count {os.cpu_count()}, "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"{'':24}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for kind, label in (("page", "student page load"), ("answer", "answer (POST)"), ("state", "state poll")):
        v = [x * 1e3 for x in lat[kind]]
        print(f"{label:24}{len(v):6d}{pct(v, .5):10.1f}{pct(v, .95):10.1f}{max(v, default=float('nan')):10.1f}")
    ok = True
    for qs in store.questions(code):
        expected = [0] * len(qs.question.options)
        for (idx, _), choice in last.items():
            if idx == qs.idx:
                expected[choice] += 1
        same = list(qs.counts) == expected
        ok &= same
        print(f"question {qs.idx + 1} ({qs.question.key}): counted {list(qs.counts)} = {qs.total}, sent (last per "
              f"device) {expected} = {sum(expected)}: {'exact' if same else 'MISMATCH'}")
    spam = store.mine(code, "loadtest-one-device-200-answers", 0)
    print(f"200 answers from one device to question 1: counted as one (its last choice {spam}) -> "
          f"{'yes' if spam is not None else 'NO'}")
    print(f"refused student requests: {len(result['refused'])} {result['refused'][:3]}")
    if dec:
        alone, loaded = dec.between(t0, t1), dec.between(t1, t2)
        print(f"decoding tokens/s (engine's figure per run, median): alone {statistics.median(alone) if alone else float('nan'):.2f} "
              f"({len(alone)} runs)  with the class {statistics.median(loaded) if loaded else float('nan'):.2f} "
              f"({len(loaded)} runs)")
        if dec.errors:
            print(f"decoder errors: {len(dec.errors)} {dec.errors[:2]}")
    p95 = max(pct(lat["page"], .95), pct(lat["answer"], .95))
    print(f"verdict: counts {'exact' if ok else 'WRONG'}; p95 page/answer {p95 * 1e3:.0f} ms "
          f"({'within' if p95 <= 2.0 else 'OVER'} the 2 s target)")


if __name__ == "__main__":
    main()
