"""Streaming overhead of the app: tokens/s through the launched app (gradio_client) vs the engine directly.

    python -m app.bench_app                      # default pair, 48 tokens, 3 runs each, interleaved
    python -m app.bench_app --method ar --max-new-tokens 32 --runs 5

Both paths use the same engine object, prompt and settings (greedy, so the same tokens); each side
is timed wall-clock around the whole request (prefill included) after one untimed warm-up each.
The target is app/engine >= 0.85.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

PROMPT = "Write a short story about a robot who learns to paint."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default=None, help="default: nanospec with a trained head, else ar")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument("--random-head", action="store_true", help="use a random head if none is shipped")
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args(argv)

    from gradio_client import Client

    from app.inputs import DEFAULTS
    from app.models import pair_loader
    from app.ui import build_app

    engine, info = pair_loader(device=args.device, random_head_if_missing=args.random_head)(None)
    method = args.method or ("nanospec" if engine.head is not None else "ar")
    opts = {**{k: DEFAULTS[k] for k in ("depth", "top_k", "total_tokens", "temperature", "top_p", "seed",
                                        "capacity")}, "method": method, "max_new_tokens": args.max_new_tokens}
    demo = build_app(lambda progress=None: (engine, info))
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    client = Client(url, verbose=False)
    ui_args = [args.prompt, method, opts["max_new_tokens"], opts["depth"], opts["top_k"], opts["total_tokens"],
               opts["temperature"], opts["top_p"], opts["seed"], opts["capacity"]]

    def direct() -> tuple[int, float]:
        t0 = time.perf_counter()
        result = engine.generate(args.prompt, **opts)
        return result.summary.new_tokens, time.perf_counter() - t0

    def direct_in_thread() -> tuple[int, float]:
        """The app decodes in a worker thread; on some CPUs (OpenMP under load) that alone changes speed."""
        box = []
        worker = threading.Thread(target=lambda: box.append(direct()))
        worker.start()
        worker.join()
        return box[0]

    def through_app() -> float:
        t0 = time.perf_counter()
        client.predict(*ui_args, api_name="/run")
        return time.perf_counter() - t0

    try:
        direct(), direct_in_thread(), through_app()  # warm-up: first-call costs (kernels, buffers, plotly)
        main_tps, thread_tps, app_tps = [], [], []
        for _ in range(args.runs):  # interleaved, so load changes on the machine hit all sides alike
            n, wall = direct()
            main_tps.append(n / wall)
            n, wall = direct_in_thread()
            thread_tps.append(n / wall)
            app_tps.append(n / through_app())  # greedy: the app emits the same n tokens
    finally:
        demo.close()
    m, t, a = (statistics.median(x) for x in (main_tps, thread_tps, app_tps))
    e = max(m, t)  # the stricter baseline
    print(f"pair: {info.target} + {info.head or 'no head'} on {info.device}; method {method}; "
          f"{args.max_new_tokens} new tokens; {args.runs} runs each (median)")
    for label, med, runs in (("engine, main thread  ", m, main_tps), ("engine, worker thread", t, thread_tps),
                             ("through the app      ", a, app_tps)):
        print(f"{label}: {med:7.2f} tokens/s   runs: {', '.join(f'{x:.2f}' for x in runs)}")
    print(f"ratio app / engine (faster of the two): {a / e:.3f}  (target >= 0.85)")


if __name__ == "__main__":
    main()
