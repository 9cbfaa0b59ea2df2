"""Where a step's time goes on this machine: target forward cost vs tokens, and phase medians per step.

    python -m nanospec.bench.forward_cost                 # default pair, held-out prompt 5, 64 new tokens

Prints (1) the median wall time of one target forward over 1, 4, 12 and 24 tokens (no cache;
the cost of verifying a tree of that size, roughly), and (2) the median per-step time of each
phase for `ar` and one speculative method on the same prompt. Together they say how large τ must
be for a tree method to beat plain decoding here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nanospec.timing import sync


def forward_ms(model, ids: torch.Tensor, n_tokens: int, repeats: int = 5) -> float:
    """Median ms of one forward (with the LM head) over the first `n_tokens` ids, after a warm-up.

    The device is synchronised before each clock read, so CUDA work is timed, not just queued."""
    x = ids[:, :n_tokens]
    with torch.inference_mode():
        model(input_ids=x)
        times = []
        for _ in range(repeats):
            sync(x.device)
            t0 = time.perf_counter()
            model(input_ids=x)
            sync(x.device)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def phase_medians(result) -> tuple[float, dict[str, float]]:
    """Median wall ms per decode step and median ms of each phase."""
    steps = [e for e in result.events if not e.is_prefill]
    phases = {k: statistics.median(e.phases[k] for e in steps) for k in steps[0].phases}
    return statistics.median(e.wall_ms for e in steps), phases


def main(argv: list[str] | None = None) -> int:
    from nanospec.pair import load_pair
    from nanospec.data.prompts import load_prompts, prompt_messages

    ap = argparse.ArgumentParser(prog="python -m nanospec.bench.forward_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="nanospec")
    ap.add_argument("--prompt-index", type=int, default=4, help="index into the held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sizes", default="1,4,12,24", help="forward sizes in tokens")
    ap.add_argument("--no-pack", action="store_true", help="PyTorch's default fp32 CPU linear kernel (see cpu_linear.py)")
    a = ap.parse_args(argv)

    engine, info = load_pair(pack_linears=not a.no_pack)
    item = load_prompts(split="heldout")[a.prompt_index]
    messages = prompt_messages(item)
    ids = torch.tensor([engine.encode_prompt(messages)], device=engine.device)
    sizes = [int(s) for s in a.sizes.split(",")]
    if max(sizes) > ids.shape[1]:
        raise SystemExit(f"--sizes: the prompt has only {ids.shape[1]} tokens")
    print(f"{info.target} on {info.device} ({info.dtype}), {torch.get_num_threads()} threads, "
          f"{engine.packed_linears} packed linears; prompt {item['id']}")
    for n in sizes:
        print(f"  one forward over {n:3d} tokens: {forward_ms(engine.model, ids, n):7.1f} ms")
    engine.generate(messages, method=a.method, max_new_tokens=4)  # warm-up
    for method in ("ar", a.method):
        result = engine.generate(messages, method=method, max_new_tokens=a.max_new_tokens)
        wall, phases = phase_medians(result)
        shown = ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if v >= 0.05)
        outside = statistics.median(e.wall_ms - e.phases.get("verify_forward", 0.0)
                                    for e in result.events if not e.is_prefill)
        print(f"  {method:>9}: {wall:6.1f} ms/step (median), tau {result.summary.tau:.2f}, "
              f"{outside:.1f} ms outside the verification forward; phases (ms): {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
