"""Would PyTorch's compiler make the target's forward cheaper here? Eager against `torch.compile`, measured.

    python -m nanospec.bench.compiled_forward            # default target, 24 greedy steps, k = 4, 16
    python -m nanospec.bench.compiled_forward --mode max-autotune-no-cudagraphs

Loads the target as stock transformers does (sdpa, fp32, PyTorch's own kernels), prefills a held-out prompt
into the engine's KV cache and decodes greedily one token at a time; then the same with a copy set up as the
engine runs it (packed linears, fused norms, its attention function: `SpecEngine`'s constructor), and with
the stock model under `torch.compile(dynamic=True)` (the compiler brings its own kernels). It prints the
compile time (the first compiled prefill and steps), the median one-token step, a forward over k tokens
after the prompt for each k, and two exactness checks per path: whether its steps pick the stock eager
steps' tokens (and their largest logit difference), and how far a row of its k-token forward is from
the one-token step that fed the same token at the same position (0: the same bits; a verified tree must
pick what `ar` picks, see cpu_linear.py and decoding/attention.py). The engine does not compile; this command is how that choice is measured (docs/benchmarks.md). It takes minutes.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from nanospec.decoding.kv import crop_cache, new_cache
from nanospec.decoding.verify import greedy_token


def decode(model, prompt: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor], list[float], object]:
    """Prefill `prompt` [1, n], then `steps` greedy one-token forwards: (tokens, their logits [V], ms per step,
    the cache). The first token comes from the prefill; step s feeds token s at position n + s."""
    cache = new_cache()
    n = prompt.shape[1]
    with torch.inference_mode():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[0, -1]
        tokens, rows, ms = [int(greedy_token(logits))], [], []
        for s in range(steps):
            x = torch.tensor([[tokens[-1]]])
            t0 = time.perf_counter()
            logits = model(input_ids=x, position_ids=torch.tensor([[n + s]]), past_key_values=cache,
                           use_cache=True).logits[0, -1]
            ms.append((time.perf_counter() - t0) * 1e3)
            rows.append(logits)
            tokens.append(int(greedy_token(logits)))
    return tokens, rows, ms, cache


def k_forward(model, cache, n: int, tokens: list[int], k: int, repeats: int) -> tuple[float, torch.Tensor]:
    """Median ms of one causal forward over `tokens[:k]` at positions n.. after the prompt's n cached
    entries (cropped back after each), and its logits [k, V]."""
    x = torch.tensor([tokens[:k]])
    pos = torch.arange(n, n + k)[None]
    times, logits = [], None
    with torch.inference_mode():
        for _ in range(repeats + 1):
            crop_cache(cache, n)
            t0 = time.perf_counter()
            logits = model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True).logits[0]
            times.append((time.perf_counter() - t0) * 1e3)
        crop_cache(cache, n)
    return statistics.median(times[1:]), logits


def measure(model, prompt: torch.Tensor, steps: int, sizes: list[int], repeats: int) -> dict:
    """One path's figures: tokens, step logits, ms, k-forward ms and how far its k rows are from its steps."""
    t0 = time.perf_counter()
    tokens, rows, ms, cache = decode(model, prompt, steps)
    first_s = time.perf_counter() - t0
    n = prompt.shape[1]
    forward_ms, row_diff = {}, {}
    for k in sizes:
        forward_ms[k], logits = k_forward(model, cache, n, tokens, k, repeats)
        row_diff[k] = max(float((logits[j] - rows[j]).abs().max()) for j in range(k))
    return {"tokens": tokens, "rows": rows, "step_ms": statistics.median(ms[2:]), "first_s": first_s,
            "forward_ms": forward_ms, "row_diff": row_diff}


def against(r: dict, ref: dict) -> str:
    """How a path's steps compare with the reference path's: tokens equal and the largest logit difference."""
    same = sum(x == y for x, y in zip(r["tokens"], ref["tokens"]))
    diff = max(float((x - y).abs().max()) for x, y in zip(r["rows"], ref["rows"]))
    return f"{same} of {len(ref['tokens'])}, {diff:.1e}"


def main(argv: list[str] | None = None) -> int:
    from nanospec.data.prompts import load_prompts, prompt_messages
    from nanospec.decoding.engine import SpecEngine
    from nanospec.decoding.prompt import encode_text
    from nanospec.loaders.loading import load_target

    ap = argparse.ArgumentParser(prog="python -m nanospec.bench.compiled_forward", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target (default: the offline SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt-index", type=int, default=4, help="index into the held-out prompts")
    ap.add_argument("--steps", type=int, default=24, help="greedy one-token steps per path")
    ap.add_argument("--sizes", default="4,16", help="forward sizes k (tokens) after the prompt")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    if max(sizes) > a.steps:
        raise SystemExit(f"--sizes: at most --steps ({a.steps}) tokens")
    loaded = load_target(a.model)
    model = loaded.model
    item = load_prompts(split="heldout")[a.prompt_index]
    prompt = torch.tensor([encode_text(loaded.tokenizer, prompt_messages(item))])
    print(f"{loaded.name} ({loaded.dtype}), {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"prompt {item['id']} ({prompt.shape[1]} tokens), {a.steps} greedy steps")
    eager = measure(model, prompt, a.steps, sizes, a.repeats)
    engine_model = SpecEngine(copy.deepcopy(model), loaded.tokenizer, None).model  # packs its copy in place
    engine = measure(engine_model, prompt, a.steps, sizes, a.repeats)
    del engine_model
    compiled = measure(torch.compile(model, dynamic=True, mode=a.mode), prompt, a.steps, sizes, a.repeats)
    print(f"compile: the first compiled prefill and {a.steps} steps took {compiled['first_s']:.0f} s "
          f"(eager: {eager['first_s']:.1f} s)")
    head = " | ".join(f"k = {k} (÷ step)" for k in sizes)
    print(f"| path | one-token step, ms | {head} | k rows against the steps, largest difference | "
          f"steps against stock eager: tokens equal, largest difference |")
    print("|---|---|" + "---|" * len(sizes) + "---|---|")
    for name, r in (("eager, stock", eager), ("eager, the engine's kernels", engine),
                    (f"compiled ({a.mode}), stock", compiled)):
        cells = " | ".join(f"{r['forward_ms'][k]:.1f} ({r['forward_ms'][k] / r['step_ms']:.2f})" for k in sizes)
        diffs = ", ".join(f"{r['row_diff'][k]:.1e}" for k in sizes)
        print(f"| {name} | {r['step_ms']:.1f} | {cells} | {diffs} | {against(r, eager)} |")
    print(f"compiled ÷ eager one-token step: {compiled['step_ms'] / eager['step_ms']:.2f} stock, "
          f"{compiled['step_ms'] / engine['step_ms']:.2f} the engine's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
