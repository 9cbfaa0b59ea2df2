"""Soak test: many visitors at once on one app, through `gradio_client`, as a public Space would see them.

    python -m app.dev.soak --clients 4 --runs 10                  # default pair, 64 new tokens
    python -m app.dev.soak --clients 4 --runs 10 --tiny           # the tiny random engine (seconds)

Launches `python app.py` in its own process on a free port, runs every prompt once alone (the
reference answers), then N clients at once, each sending M requests (greedy, the app's default
settings; prompts from the project's held-out set, one after another per client). Reports errors,
request latency (p50 / p95, queue wait included), whether every answer equals the same prompt run
alone, and the server's resident memory (RSS, from /proc) after every 10 runs. Exit code 1 if a
target is missed: 0 errors, 0 mismatched answers, RSS after the last tenth within 5% of after run 10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from app.dev.served import connect, free_port, start_app, stop_app

RSS_DRIFT_LIMIT = 0.05


@dataclass
class SoakReport:
    clients: int
    runs_per_client: int
    max_new_tokens: int
    method: str
    prompts: int
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    rss_mb: dict[int, float] = field(default_factory=dict)   # completed runs -> server RSS
    wall_s: float = 0.0

    @property
    def rss_drift(self) -> float | None:
        """(RSS after the last tenth - after run 10) / after run 10."""
        if 10 not in self.rss_mb or len(self.rss_mb) < 2:
            return None
        last = self.rss_mb[max(self.rss_mb)]
        return (last - self.rss_mb[10]) / self.rss_mb[10]

    @property
    def passed(self) -> bool:
        drift = self.rss_drift
        return not self.errors and not self.mismatches and (drift is None or abs(drift) <= RSS_DRIFT_LIMIT)


class _TokenText(HTMLParser):
    """The text of the answer box's token spans (`app/templates/answer_token.html`), markup left out."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.pieces = 0, []

    def handle_starttag(self, tag, attrs):
        if self.depth:
            self.depth += tag == "span"
        elif tag == "span" and "tok" in (dict(attrs).get("class") or "").split():
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth and tag == "span":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.pieces.append(data)


def answer_text(outputs) -> str:
    """The answer's text from a `/run` result: the answer box's tokens joined. Only the text: each
    token's underline (its origin) depends on the trees the draft budget chose, which depend on the
    measured speed and so on the load, while the text must not."""
    box = outputs[0]
    parser = _TokenText()
    parser.feed(str(box))
    return "".join(parser.pieces)


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def soak_prompts(count: int = 8) -> list[str]:
    """Prompt-box texts of the held-out prompts, round-robin over categories (multi-turn ones included)."""
    from app.inputs import prompt_text
    from nanospec.data.prompts import load_prompts

    items = load_prompts(split="heldout")
    by_cat: dict[str, list[dict]] = {}
    for item in items:
        by_cat.setdefault(item["category"], []).append(item)
    ordered = [group[i] for i in range(max(map(len, by_cat.values()))) for group in by_cat.values() if i < len(group)]
    return [prompt_text(item) for item in ordered[:count]]


def run_soak(url: str, server, clients: int, runs: int, max_new_tokens: int, method: str,
             prompts: list[str], log=print) -> SoakReport:
    from app.inputs import DEFAULTS

    # every knob by name (the API's parameter names are the run options'), the page's defaults but these
    knobs = {**DEFAULTS, "method": method, "max_new_tokens": max_new_tokens}
    report = SoakReport(clients, runs, max_new_tokens, method, len(prompts))
    reference: dict[str, str] = {}
    solo = connect(url, server, download_files=False)
    for i, prompt in enumerate(prompts):  # each prompt alone: the first also loads the model
        reference[prompt] = answer_text(solo.predict(prompt, **knobs, api_name="/run"))
        log(f"reference {i + 1}/{len(prompts)}: {len(reference[prompt])} characters")
        if not reference[prompt]:  # no text read from the answer box: every comparison would pass
            report.errors.append(f"reference {i + 1}: no answer text in the /run result")
    lock = threading.Lock()
    done = [0]

    def visitor(c: int) -> None:
        client = connect(url, server, download_files=False)
        for r in range(runs):
            prompt = prompts[(c * runs + r) % len(prompts)]
            t0 = time.perf_counter()
            try:
                got = answer_text(client.predict(prompt, **knobs, api_name="/run"))
            except Exception as exc:  # noqa: BLE001 — counted and reported
                with lock:
                    report.errors.append(f"client {c} run {r}: {type(exc).__name__}: {exc}")
                continue
            finally:
                latency = time.perf_counter() - t0
            with lock:
                report.latencies_s.append(latency)
                if got != reference[prompt]:
                    report.mismatches.append(f"client {c} run {r}: prompt {prompts.index(prompt)}")
                done[0] += 1
                log(f"run {done[0]}: client {c}, {latency:.1f} s, {'same' if got == reference[prompt] else 'DIFFERENT'}")
                if done[0] % 10 == 0:
                    report.rss_mb[done[0]] = rss_mb(server.pid)
                    log(f"{done[0]} runs: server RSS {report.rss_mb[done[0]]:.0f} MB")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=visitor, args=(c,), name=f"visitor-{c}") for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.wall_s = time.perf_counter() - t0
    return report


def format_report(report: SoakReport) -> str:
    lat = sorted(report.latencies_s)
    p50 = statistics.median(lat) if lat else float("nan")
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))] if lat else float("nan")
    drift = report.rss_drift
    lines = [
        f"{report.clients} clients x {report.runs_per_client} runs, {report.method}, {report.max_new_tokens} new "
        f"tokens, {report.prompts} prompts, {report.wall_s:.0f} s",
        f"errors: {len(report.errors)}   mismatched answers: {len(report.mismatches)}",
        f"latency per request (queue included): p50 {p50:.2f} s   p95 {p95:.2f} s",
        "server RSS (MB) after run: " + ", ".join(f"{n}: {mb:.0f}" for n, mb in sorted(report.rss_mb.items())),
        f"RSS after run {max(report.rss_mb) if report.rss_mb else '-'} vs after run 10: "
        + ("not measured" if drift is None else f"{drift:+.1%} (target within ±{RSS_DRIFT_LIMIT:.0%})"),
        f"targets met: {'yes' if report.passed else 'NO'}",
    ]
    lines += [f"  error: {e}" for e in report.errors[:10]] + [f"  mismatch: {m}" for m in report.mismatches[:10]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--runs", type=int, default=10, help="requests per client")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--method", default="nanospec")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts (held-out set)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random engine instead of the default pair")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument("--ui-nice", type=int, default=None, help="passed to app.py (its default: 10)")
    parser.add_argument("--json", default=None, help="write the report as JSON")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.runs < 1:
        parser.error("--clients and --runs must be at least 1")
    port = args.port or free_port()
    app_args = (["--tiny"] if args.tiny else []) + ([f"--ui-nice={args.ui_nice}"] if args.ui_nice is not None else [])
    server = start_app(port, *app_args)
    try:
        report = run_soak(f"http://127.0.0.1:{port}/", server, args.clients, args.runs, args.max_new_tokens,
                          args.method, soak_prompts(args.prompts), log=lambda m: print(m, flush=True))
    finally:
        stop_app(server)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(report), "rss_drift": report.rss_drift,
                                               "passed": report.passed}, indent=2))
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
