"""Lookup time and match lengths of a retrieval store, on contexts from held-out answers.

    python -m nanospec.retrieval.bench --store assets/retrieval/smollm2-135m.npz --data train_data/smollm2-135m

Contexts are the `--context` tokens before random positions inside the greedy answers of held-out
prompts (the training rounds' validation split, which `build` leaves out of the store). Prints the
median and p95 time per lookup (µs; the target is <= 500 µs), the match-length distribution, and how
many of the answer's next tokens the retrieved tree holds as one path (what greedy verification
could accept from this branch alone). Timings from a busy machine are flagged, not trusted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from nanospec.retrieval.draft import RetrievedTree
from nanospec.retrieval.index import LookupSettings, RetrievalIndex
from nanospec.retrieval.storage import load_store


def held_out_answers(folder: Path, warn=print) -> list[tuple[np.ndarray, int]]:
    """(ids, answer_start) of every greedy answer to a held-out prompt in the folder's usable chunks."""
    from nanospec.training.answer_chunks import iter_chunks, read_manifest
    from nanospec.training.round_data import is_validation

    tokenizer = (read_manifest(folder) or {}).get("tokenizer")
    out = []
    for chunk in iter_chunks(folder, tokenizer, warn):
        for i in range(len(chunk)):
            if is_validation(int(chunk.pool_index[i])) and not chunk.sampled[i]:
                out.append((chunk.sequence(i).astype(np.int64), int(chunk.answer_start[i])))
    return out


def sample_contexts(answers: list[tuple[np.ndarray, int]], n: int, context: int, depth: int,
                    seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n (context [<= context], truth [<= depth]) pairs at random positions inside the answers."""
    rng = np.random.default_rng(seed)
    usable = [(ids, s) for ids, s in answers if len(ids) - 1 > max(s, 1)]
    out = []
    for _ in range(n if usable else 0):
        ids, start = usable[rng.integers(len(usable))]
        p = int(rng.integers(max(start, 1), len(ids)))          # predict ids[p:] from ids[:p]
        out.append((ids[max(p - context, 0):p], ids[p:p + depth]))
    return out


def accepted_length(tree: RetrievedTree, truth: np.ndarray) -> int:
    """How many leading truth tokens the tree holds as one root path (greedy acceptance from the tree)."""
    node, n = -1, 0
    for token in truth.tolist():
        kids = np.flatnonzero((tree.parents == node) & (tree.tokens == token))
        if not kids.size:
            break
        node, n = int(kids[0]), n + 1
    return n


def run(index: RetrievalIndex, samples: list, warmup: int = 50) -> dict:
    for ctx, _ in samples[:warmup]:
        index.lookup(ctx)
    times, lengths, accepted, nodes = [], Counter(), [], []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for ctx, truth in samples:
        t0 = time.perf_counter_ns()
        tree = index.lookup(ctx)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        lengths[tree.match_length] += 1
        accepted.append(accepted_length(tree, truth))
        nodes.append(len(tree))
    share = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    t = np.array(times)
    return {"queries": len(samples), "median_us": float(np.median(t)), "p95_us": float(np.percentile(t, 95)),
            "mean_us": float(t.mean()), "match_lengths": dict(sorted(lengths.items())),
            "mean_accepted": float(np.mean(accepted)), "mean_nodes": float(np.mean(nodes)), "cpu_share": share}


def report(r: dict, n_answers: int) -> list[str]:
    total = r["queries"]
    hist = ", ".join(f"{k or 'none'}: {100 * v / total:.1f}%" for k, v in r["match_lengths"].items())
    busy = "" if r["cpu_share"] >= 0.9 else (f"  (busy machine: this process got {100 * r['cpu_share']:.0f}% "
                                               "of a core; do not trust these times)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [f"{total} lookups on {n_answers} held-out answers (load average {load:.2f})",
            f"lookup: median {r['median_us']:.1f} µs, p95 {r['p95_us']:.1f} µs, mean {r['mean_us']:.1f} µs{busy}",
            f"match length (context tokens): {hist}",
            f"tree: {r['mean_nodes']:.1f} nodes on average; the answer's next tokens held as one path: "
            f"{r['mean_accepted']:.2f} on average"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nanospec.retrieval.bench", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, required=True, help="the store's .npz file")
    p.add_argument("--data", type=Path, default=Path("train_data/smollm2-135m"),
                   help="answer folder whose held-out answers give the contexts")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--context", type=int, default=16, help="context tokens per lookup")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    store = load_store(args.store)
    if store is None:
        return 1
    if not store.manifest.get("settings", {}).get("holdout", True):
        print("note: this store was built with --no-holdout; it holds these answers, so matches are optimistic")
    answers = held_out_answers(args.data)
    samples = sample_contexts(answers, args.queries, args.context, args.depth, args.seed)
    if not samples:
        print(f"error: no held-out answers in {args.data}", file=sys.stderr)
        return 1
    index = RetrievalIndex(store, LookupSettings(max_context=args.context, depth=args.depth, max_nodes=args.nodes))
    print("\n".join(report(run(index, samples), len(answers))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
