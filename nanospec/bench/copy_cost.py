"""What the copy branch costs per step: its lookup + tree merge (`copy_lookup` phase) against the step.

    python -m nanospec.bench.copy_cost [--copy-branch 4] [--limit 4] [--max-new-tokens 64]

Decodes held-out prompts with `nanospec` and the copy branch on the default pair and reports, per
decode step, the median `copy_lookup` time, the median step wall time and their ratio; then times
the lookup alone on random contexts of growing length (tensor ops only, so its cost grows with the
context but no Python loop runs over it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nanospec.decoding.copy_branch import lookup_continuation


def step_shares(engine, prompts: list, options: dict) -> dict:
    """Median copy_lookup ms, step ms and their per-step ratio over every decode step of every prompt."""
    copy_ms, step_ms = [], []
    for prompt in prompts:
        result = engine.generate(prompt, method="nanospec", **options)
        for e in result.events[1:]:
            copy_ms.append(e.phases.get("copy_lookup", 0.0))
            step_ms.append(e.wall_ms)
    ratios = [c / s for c, s in zip(copy_ms, step_ms) if s > 0]
    return {"steps": len(step_ms), "copy_ms": statistics.median(copy_ms), "step_ms": statistics.median(step_ms),
            "share": statistics.median(ratios)}


def lookup_ms(context_len: int, n_tokens: int, repeats: int = 50, device: str = "cpu") -> float:
    """Median ms of one `lookup_continuation` on a random context of `context_len` tokens."""
    g = torch.Generator().manual_seed(context_len)
    context = torch.randint(0, 1000, (context_len,), generator=g).to(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        lookup_continuation(context, n_tokens).tokens.sum().item()  # .item(): wait for the device
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nanospec.bench.copy_cost", description=__doc__.split("\n")[0])
    p.add_argument("--copy-branch", type=int, default=4)
    p.add_argument("--limit", type=int, default=4, help="held-out prompts to decode")
    p.add_argument("--max-new-tokens", type=int, default=64)
    a = p.parse_args(argv)
    from nanospec.data.prompts import load_prompts, prompt_messages
    from nanospec.pair import load_pair
    engine, info = load_pair()
    prompts = [prompt_messages(item) for item in load_prompts(split="heldout")[: a.limit]]
    options = {"max_new_tokens": a.max_new_tokens, "copy_branch": a.copy_branch}
    engine.generate(prompts[0], method="nanospec", **{**options, "max_new_tokens": 4})  # warm-up
    s = step_shares(engine, prompts, options)
    print(f"{info.target} | {info.device} | nanospec, copy branch {a.copy_branch}, {len(prompts)} held-out prompts, "
          f"{s['steps']} decode steps")
    print(f"copy_lookup {s['copy_ms']:.3f} ms per step (median), step {s['step_ms']:.1f} ms (median), "
          f"per-step ratio {100 * s['share']:.2f}% (median)")
    for n in (256, 1024, 4096):
        print(f"lookup alone, context {n:>5} tokens: {lookup_ms(n, a.copy_branch, device=str(engine.device)):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
