"""Build the retrieval datastore from a folder of answer chunks, or say how an existing one stands.

    python -m nanospec.retrieval.build --data train_data/smollm2-135m --out assets/retrieval/smollm2-135m.npz
    python -m nanospec.retrieval.build --status --out assets/retrieval/smollm2-135m.npz [--data ...]

Only the chunks the folder's manifest lists are read (a chunk is listed once it is complete), each
checked against its sha256 and tokenizer; a bad one is skipped with one line. Every document is one
answer's prompt + answer ids (or the answer and the last `--prompt-tail` prompt tokens). Answers of
held-out prompts (the training rounds' validation split) are left out unless `--no-holdout`, so
`bench` can measure on text the store has never seen.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from nanospec.retrieval.storage import load_store, save_store
from nanospec.retrieval.store import SuffixStore

MAX_MB = 20.0


def read_documents(folder: Path, prompt_tail: int, holdout: bool, max_tokens: int,
                   warn=print) -> tuple[list[np.ndarray], dict]:
    """Documents from the folder's usable chunks, and the manifest fields that describe them."""
    from nanospec.training.answer_chunks import iter_chunks, read_manifest
    from nanospec.training.round_data import is_validation

    manifest = read_manifest(folder)
    if manifest is None:
        raise ValueError(f"{folder}: no manifest.json (not an answer folder, or nothing written yet)")
    tokenizer = manifest.get("tokenizer")
    listed = {str(c.get("file")): c for c in manifest.get("chunks", [])}
    docs, sources, total, held_out = [], [], 0, 0
    for chunk in iter_chunks(folder, tokenizer, warn):
        used = 0
        for i in range(len(chunk)):
            if holdout and is_validation(int(chunk.pool_index[i])):
                held_out += 1
                continue
            seq = chunk.sequence(i)
            start = 0 if prompt_tail < 0 else max(int(chunk.answer_start[i]) - prompt_tail, 0)
            doc = seq[start:]
            if max_tokens and total + doc.size + 1 > max_tokens:
                break
            docs.append(doc)
            total += doc.size + 1
            used += 1
        sources.append({"file": chunk.name, "sha256": listed.get(chunk.name, {}).get("sha256"),
                        "answers": len(chunk), "used": used})
    info = {"tokenizer": tokenizer, "target": manifest.get("target"), "target_hash": manifest.get("target_hash"),
            "data": str(folder), "sources": sources, "held_out_answers": held_out}
    return docs, info


def build(folder: Path, out: Path, prompt_tail: int = -1, holdout: bool = True, max_tokens: int = 0,
          max_mb: float = MAX_MB, warn=print) -> dict:
    """Read, index and save; returns the written manifest plus `bytes` and `seconds`. Refuses (ValueError,
    nothing written) when no document is usable or the file would exceed `max_mb`."""
    t0 = time.perf_counter()
    docs, info = read_documents(folder, prompt_tail, holdout, max_tokens, warn)
    if not docs:
        raise ValueError(f"{folder}: no usable answers (every chunk missing, foreign or held out)")
    settings = {"prompt_tail": prompt_tail, "holdout": holdout, "max_tokens": max_tokens}
    store = SuffixStore.from_documents(docs)
    tmp = out.with_name(out.name + ".new")
    manifest = save_store(tmp, store, dict(info, settings=settings))
    size = tmp.stat().st_size
    if size > max_mb * 1e6:
        tmp.unlink()
        raise ValueError(f"the store would take {size / 1e6:.1f} MB, over the {max_mb:g} MB cap; "
                         f"pass --max-tokens below {len(store)}")
    tmp.replace(out)
    return dict(manifest, bytes=size, seconds=round(time.perf_counter() - t0, 2))


def status(out: Path, folder: Path | None, warn=print) -> list[str]:
    """Lines describing the store at `out` and, with a data folder, whether it covers every chunk."""
    store = load_store(out, warn=warn)
    if store is None:
        return [f"{out}: no usable store"]
    m = store.manifest
    lines = [f"{out}: {m['tokens']:,} tokens, {m['documents']:,} documents, {out.stat().st_size / 1e6:.2f} MB, "
             f"tokenizer {m.get('tokenizer')}, settings {m.get('settings')}",
             f"  built from {len(m.get('sources', []))} chunk(s) of {m.get('data')}"]
    if folder is not None:
        from nanospec.training.answer_chunks import read_manifest

        data = read_manifest(folder) or {}
        have = {(s.get("file"), s.get("sha256")) for s in m.get("sources", [])}
        new = [c.get("file") for c in data.get("chunks", []) if (c.get("file"), c.get("sha256")) not in have]
        lines.append(f"  {folder}: {len(new)} listed chunk(s) not in the store"
                     + (f" ({', '.join(map(str, new))}; a rebuild reads the usable ones)" if new else ": up to date"))
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nanospec.retrieval.build", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, help="answer folder with manifest.json (e.g. train_data/smollm2-135m)")
    p.add_argument("--out", type=Path, required=True, help="the store's .npz file")
    p.add_argument("--status", action="store_true", help="describe the store at --out instead of building")
    p.add_argument("--prompt-tail", type=int, default=-1,
                   help="prompt tokens kept before each answer (-1: the whole prompt)")
    p.add_argument("--no-holdout", action="store_true",
                   help="also index the answers of held-out prompts (bench figures are then optimistic)")
    p.add_argument("--max-tokens", type=int, default=0, help="stop adding answers at this many tokens (0: all)")
    p.add_argument("--max-mb", type=float, default=MAX_MB, help="refuse to write a larger file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.status:
        print("\n".join(status(args.out, args.data)))
        return 0
    if args.data is None:
        print("error: --data is required to build (or pass --status)", file=sys.stderr)
        return 2
    try:
        m = build(args.data, args.out, args.prompt_tail, not args.no_holdout, args.max_tokens, args.max_mb)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    used = sum(s["used"] for s in m["sources"])
    print(f"wrote {args.out}: {m['tokens']:,} tokens, {m['documents']:,} documents ({used:,} answers from "
          f"{len(m['sources'])} chunk(s), {m['held_out_answers']:,} held out), {m['bytes'] / 1e6:.2f} MB, "
          f"{m['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
