"""Where a verification forward's time goes: the target's forward over k tree tokens, split by part.

    python -m nanospec.bench.forward_parts                 # default pair, k = 1, 4, 9, 16, 300 cached tokens

Runs the engine's own verification call (`target_forward` with the tree mask, explicit positions and the
engine's KV cache, then the cache compaction a step does after acceptance) for trees of k nodes, and
times each part by wrapping the functions the stock transformers model calls: the linears (LM head apart),
attention (the kernel call with the tree mask), rotary (cos/sin tables and their application), norms,
cache writes, mask building and embedding; "other" is the rest of the forward's wall time (transformers'
per-layer Python, residual adds, activations, reshapes). Medians over repeats; the wrappers' own cost
(~1 µs a call, ~300 calls) lands in "other". Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from contextlib import contextmanager

import torch
import torch.nn as nn

PARTS = ("linears", "lm_head", "attention", "rotary", "norms", "cache_write", "mask", "embed")


class PartClock:
    """Accumulates seconds per part while `installed()`; `take()` returns and clears them."""

    def __init__(self):
        self.acc: dict[str, float] = {}

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.acc[name] = self.acc.get(name, 0.0) + time.perf_counter() - t0
        return timed

    def take(self) -> dict[str, float]:
        out, self.acc = self.acc, {}
        return out

    @contextmanager
    def installed(self, model):
        """Wrap the callables a Llama-family forward goes through; everything is restored on exit."""
        from transformers import cache_utils
        from transformers.masking_utils import create_causal_mask  # noqa: F401  (the model module holds its own name)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from nanospec.decoding import kv
        from nanospec.loaders.cpu_linear import PackedLinear

        model_module = __import__(type(model.base_model).__module__, fromlist=["_"])
        head = model.get_output_embeddings()
        norm_cls = type(model.base_model.norm)
        rotary_cls = type(model.base_model.rotary_emb)
        targets = [(head, "forward", "lm_head"),  # first: its own wrapper calls the unwrapped class forward
                   (PackedLinear, "forward", "linears"), (nn.Linear, "forward", "linears"),
                   (norm_cls, "forward", "norms"), (rotary_cls, "forward", "rotary"),
                   (model_module, "apply_rotary_pos_emb", "rotary"), (model_module, "create_causal_mask", "mask"),
                   (cache_utils.DynamicLayer, "update", "cache_write"), (kv.BufferedLayer, "update", "cache_write"),
                   (nn.Embedding, "forward", "embed")]
        saved = []
        mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
        impl = model.config._attn_implementation
        try:
            for obj, attr, name in targets:
                if hasattr(obj, attr):
                    saved.append((obj, attr, obj.__dict__.get(attr, None) if isinstance(obj, nn.Module) else getattr(obj, attr)))
                    setattr(obj, attr, self.wrap(name, getattr(obj, attr)))
            saved_attn = mapping.get(impl)
            if saved_attn is not None:
                mapping[impl] = self.wrap("attention", saved_attn)
            yield self
        finally:
            for obj, attr, orig in reversed(saved):
                if orig is None:
                    delattr(obj, attr)
                else:
                    setattr(obj, attr, orig)
            if impl in mapping and saved_attn is not None:
                mapping[impl] = saved_attn


def tree_parents(k: int) -> torch.Tensor:
    """A tree of k nodes shaped like the CPU default's: up to 4 children of the root, the rest in chains
    under them (depth ≤ 1 + (k - 5) // 4 + 1)."""
    parents = [-1] + [0] * min(k - 1, 4)
    parents += [i - 4 for i in range(5, k)]
    return torch.tensor(parents)


def profile_sizes(engine, sizes: list[int], context: int, repeats: int) -> list[dict[str, float]]:
    """Median ms per part for a verification of each tree size, after `context` cached tokens."""
    from nanospec.decoding.kv import compact_cache, crop_cache, new_cache
    from nanospec.decoding.tree import ancestor_mask, tree_attention_mask, tree_position_ids
    from nanospec.decoding.verify import target_forward

    model, dev = engine.model, engine.device
    gen = torch.Generator().manual_seed(0)
    cache = new_cache()
    prompt = torch.randint(0, engine.vocab_size, (1, context), generator=gen).to(dev)
    target_forward(model, prompt, torch.arange(context, device=dev)[None], cache, with_logits=False)
    clock, rows = PartClock(), []
    with torch.inference_mode(), clock.installed(model):
        for k in sizes:
            anc = ancestor_mask(tree_parents(k).to(dev))
            depths = anc.sum(dim=1) - 1
            tokens = torch.randint(0, engine.vocab_size, (1, k), generator=gen).to(dev)
            keep = torch.arange(min(k, 2), device=dev)  # root and one child accepted
            samples = []
            for r in range(repeats + 2):  # two warm-ups
                clock.take()
                t0 = time.perf_counter()
                mask = tree_attention_mask(anc, context) if k > 1 else None
                target_forward(model, tokens, tree_position_ids(depths, context), cache, mask)
                t1 = time.perf_counter()
                if k > 1:
                    compact_cache(cache, context, keep)
                t2 = time.perf_counter()
                crop_cache(cache, context)
                parts = clock.take()
                parts.update(forward=t1 - t0, compaction=t2 - t1)
                if r >= 2:
                    samples.append(parts)
            row = {name: 1000 * statistics.median(s.get(name, 0.0) for s in samples)
                   for name in ("forward", "compaction", *PARTS)}
            row["other"] = row["forward"] - sum(row[p] for p in PARTS)
            row["k"] = k
            rows.append(row)
    return rows


def print_table(rows: list[dict[str, float]]) -> None:
    cols = ("forward", *PARTS, "other", "compaction")
    print("| k | " + " | ".join(cols) + " | ÷ k=1 |")
    print("|---" * (len(cols) + 2) + "|")
    base = rows[0]["forward"]
    for row in rows:
        print(f"| {row['k']} | " + " | ".join(f"{row[c]:.2f}" for c in cols) + f" | {row['forward'] / base:.2f} |")


def main(argv: list[str] | None = None) -> int:
    from nanospec.pair import load_pair

    ap = argparse.ArgumentParser(prog="python -m nanospec.bench.forward_parts", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,9,16", help="tree sizes k, comma-separated (1 = a plain step)")
    ap.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    if not sizes or min(sizes) < 1:
        raise SystemExit("--sizes: positive integers, e.g. 1,4,9,16")
    engine, info = load_pair(dtype=a.dtype)
    print(f"{info.target} on {info.device} ({info.dtype}), {torch.get_num_threads()} threads, "
          f"{engine.kernels}; {a.context} cached tokens; median ms over {a.repeats} repeats")
    print_table(profile_sizes(engine, sizes, a.context, a.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
