"""Streaming overhead of the app: tokens/s through the launched app (gradio_client) vs the engine.

    python -m app.dev.bench_app                      # default pair, the app's default 64 tokens, 5 runs each, interleaved
    python -m app.dev.bench_app --method ar --max-new-tokens 32 --runs 5

Each side runs in its own process, as in real use: the app is `python app.py` (its own server
process, decoding in a worker thread), the engine is a warm `SpecEngine.generate` loop in a second
process (what `python -m nanospec generate` runs, minus the model load). This script only sends
requests and times them; it never touches torch, so neither side inherits the other's CPU threads.
Both sides use the same prompt and settings (greedy, so the same tokens), one untimed warm-up each,
and the runs alternate so load changes on the machine hit both alike. The app side is timed
wall-clock around the whole request (queue, prefill, every streamed update, the final charts and
downloads); the engine side around `generate` (prefill included). The client does not fetch the
two trace files the run's last update offers for download (the app still writes them within the
timed request): a browser fetches them only when the user clicks, and fetching them here would
add their transfer to every request; `--download-files` fetches them as well. Target: app / engine
>= 0.85 (results: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from app.dev.served import ROOT, connect, free_port, start_app, stop_app

PROMPT = "Write a short story about a robot who learns to paint."


def engine_worker(method: str | None, device: str | None) -> None:
    """Child process: load the pair once, then one JSON request per stdin line -> one JSON line out."""
    from app.models import pair_loader

    engine, info = pair_loader(device=device)(None)
    method = method or ("nanospec" if engine.head is not None else "ar")
    print(json.dumps({"ready": True, "method": method, "pair": f"{info.target} + {info.head or 'no head'}",
                      "device": info.device}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        result = engine.generate(req["prompt"], **req["options"])
        wall = time.perf_counter() - t0
        print(json.dumps({"tokens": result.summary.new_tokens, "wall_s": wall}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default=None, help="default: nanospec with a trained head, else ar")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the app's default (64)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--download-files", action="store_true",
                        help="let the client also fetch the run's two trace files after each run")
    parser.add_argument("--engine-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine_worker:
        return engine_worker(args.method, args.device)

    from app.inputs import DEFAULTS

    if args.max_new_tokens is None:
        args.max_new_tokens = DEFAULTS["max_new_tokens"]
    worker = subprocess.Popen([sys.executable, "-m", "app.dev.bench_app", "--engine-worker",
                               *(["--method", args.method] if args.method else []),
                               *(["--device", args.device] if args.device else [])],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = free_port()
    server = start_app(port, *(["--device", args.device] if args.device else []))
    try:
        hello = json.loads(worker.stdout.readline())
        method = hello["method"]
        opts = {**DEFAULTS, "method": method, "max_new_tokens": args.max_new_tokens}  # every knob the page has
        client = connect(f"http://127.0.0.1:{port}/", server, download_files=args.download_files)

        def engine_run() -> tuple[int, float]:
            worker.stdin.write(json.dumps({"prompt": args.prompt, "options": opts}) + "\n")
            worker.stdin.flush()
            reply = json.loads(worker.stdout.readline())
            return reply["tokens"], reply["wall_s"]

        def app_run() -> float:
            t0 = time.perf_counter()
            client.predict(args.prompt, **opts, api_name="/run")  # the first call also loads the pair in the app
            return time.perf_counter() - t0

        engine_run(), app_run()  # warm-up: model load in the app, first-call costs on both sides
        engine_tps, app_tps = [], []
        for _ in range(args.runs):
            n, wall = engine_run()
            engine_tps.append(n / wall)
            app_tps.append(n / app_run())  # greedy: the app emits the same n tokens
    finally:
        stop_app(server)
        worker.stdin.close()
        worker.terminate()
        worker.wait(30)
    e, a = statistics.median(engine_tps), statistics.median(app_tps)
    print(f"pair: {hello['pair']} on {hello['device']}; method {method}; {args.max_new_tokens} new tokens; "
          f"{args.runs} runs each, alternating (median); client fetches trace files: {args.download_files}")
    for label, med, runs in (("engine (own process)   ", e, engine_tps), ("through the app (client)", a, app_tps)):
        print(f"{label}: {med:7.2f} tokens/s   runs: {', '.join(f'{x:.2f}' for x in runs)}")
    ratios = [x / y for x, y in zip(app_tps, engine_tps)]
    print(f"ratio app / engine: {a / e:.3f} (median of pairs {statistics.median(ratios):.3f})  (target >= 0.85)")


if __name__ == "__main__":
    main()
