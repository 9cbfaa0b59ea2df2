"""The target's answers on disk: token-id chunks (``.npz``) and one manifest per data folder.

A chunk holds many answers as uint16 token ids (prompt + answer, the chat template applied), flat:

- ``tokens`` [N] uint16, every sequence one after the other; ``offsets`` [n+1] int64 into it;
- ``answer_start`` [n] int32: index in its sequence of the first answer token;
- ``pool_index`` [n] int64: the prompt's index in the prompt pool; ``sampled`` [n] uint8 (0 greedy,
  1 sampled); ``finished`` [n] uint8 (1 = ended with eos, 0 = cut at the length cap);
  ``source`` [n] uint8: index into the manifest's ``sources``;
- ``tokenizer`` (a 0-d string array): the tokenizer fingerprint it was written with.

``manifest.json`` names every chunk with its sha256, size and counts, plus the generation settings,
the target and tokenizer fingerprints and the job's ``cursor`` (next pool index). Both are written
atomically (a temporary file, then ``os.replace``), the chunk before the manifest that lists it.
Reading skips a missing, truncated, altered or foreign chunk with one warning line naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from nanospec.retrieval.storage import tokenizer_fingerprint  # noqa: F401 (the runtime's; re-exported)

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass
class AnswerRecord:
    """One generated answer before it is written: ids = prompt + answer (answer from `answer_start`)."""

    ids: list[int]
    answer_start: int
    pool_index: int
    sampled: bool
    finished: bool
    source: int


@dataclass
class Chunk:
    """One chunk as read back (arrays as described in the module docstring)."""

    name: str
    tokens: np.ndarray
    offsets: np.ndarray
    answer_start: np.ndarray
    pool_index: np.ndarray
    sampled: np.ndarray
    finished: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return len(self.answer_start)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


# ---- fingerprints -----------------------------------------------------------------------------------


def target_fingerprint(model) -> str:
    """sha256 of the target's config and a slice of its weights (cheap; tells two targets apart)."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode("utf-8"))
    for name, p in list(model.named_parameters())[:4] + list(model.named_parameters())[-2:]:
        h.update(name.encode())
        h.update(p.detach().float().reshape(-1)[:4096].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- writing ----------------------------------------------------------------------------------------


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def chunk_arrays(records: list[AnswerRecord], tokenizer_hash: str) -> dict[str, np.ndarray]:
    """Records -> the chunk's arrays (pure). Every id must fit uint16."""
    lengths = np.array([len(r.ids) for r in records], dtype=np.int64)
    flat = np.fromiter((t for r in records for t in r.ids), dtype=np.int64, count=int(lengths.sum()))
    if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(np.uint16).max):
        raise ValueError("token ids must fit uint16 (0..65535); this tokenizer's vocabulary is too large")
    return {"tokens": flat.astype(np.uint16), "offsets": np.concatenate([[0], np.cumsum(lengths)]),
            "answer_start": np.array([r.answer_start for r in records], dtype=np.int32),
            "pool_index": np.array([r.pool_index for r in records], dtype=np.int64),
            "sampled": np.array([r.sampled for r in records], dtype=np.uint8),
            "finished": np.array([r.finished for r in records], dtype=np.uint8),
            "source": np.array([r.source for r in records], dtype=np.uint8),
            "tokenizer": np.array(tokenizer_hash)}


def write_chunk(folder: Path, name: str, records: list[AnswerRecord], tokenizer_hash: str) -> dict:
    """Write chunk `name` atomically; returns its manifest entry (file, sha256, bytes, counts)."""
    if not records:
        raise ValueError("a chunk needs at least one answer")
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **chunk_arrays(records, tokenizer_hash))
    path = Path(folder) / name
    atomic_write_bytes(path, buffer.getvalue())
    return {"file": name, "sha256": file_sha256(path), "bytes": path.stat().st_size, "answers": len(records),
            "sampled": sum(r.sampled for r in records), "tokens": sum(len(r.ids) for r in records),
            "answer_tokens": sum(len(r.ids) - r.answer_start for r in records),
            "pool_range": [min(r.pool_index for r in records), max(r.pool_index for r in records) + 1]}


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_bytes(Path(folder) / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))


# ---- reading ----------------------------------------------------------------------------------------


def load_chunk(path: Path, entry: dict, tokenizer_hash: str | None) -> Chunk:
    """One chunk, checked: ValueError/OSError saying what is wrong (the caller turns it into a warning)."""
    if not path.exists():
        raise FileNotFoundError("missing")
    digest = file_sha256(path)
    if digest != entry.get("sha256"):
        raise ValueError(f"sha256 {digest[:12]} differs from the manifest's {str(entry.get('sha256'))[:12]} "
                         "(truncated or altered)")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    written_with = str(arrays.pop("tokenizer", ""))
    if tokenizer_hash is not None and written_with != tokenizer_hash:
        raise ValueError(f"written with tokenizer {written_with or '?'}, not {tokenizer_hash} (a foreign chunk)")
    chunk = Chunk(name=path.name, **arrays)
    if chunk.offsets[-1] != len(chunk.tokens) or len(chunk.offsets) != len(chunk) + 1:
        raise ValueError("offsets do not fit the tokens")
    return chunk


def iter_chunks(folder: Path, tokenizer_hash: str | None = None,
                warn: Callable[[str], None] = print) -> Iterator[Chunk]:
    """The manifest's chunks in order; any that cannot be used is skipped with one warning line."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        warn(f"warning: {folder / MANIFEST}: missing; no answer chunks read from {folder}")
        return
    if tokenizer_hash is not None and manifest.get("tokenizer") not in (None, tokenizer_hash):
        warn(f"warning: {folder / MANIFEST}: written with tokenizer {manifest.get('tokenizer')}, "
             f"not {tokenizer_hash}; its chunks are checked one by one")
    for entry in manifest.get("chunks", []):
        path = folder / str(entry.get("file", ""))
        try:
            yield load_chunk(path, entry, tokenizer_hash)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
            warn(f"warning: skipped answer chunk {path}: {err}")
