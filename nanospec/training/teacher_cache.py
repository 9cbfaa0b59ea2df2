"""The target's teacher-forced view of each training answer, kept on disk after its first forward.

A round's step spends about two thirds of its time in the target's forward over the batch (on 2 CPU cores:
~3.5 of ~5.2 s per 2,048 padded tokens), and every epoch and every later round over the same chunks repeats
it. This cache keeps, per answer, the target's features (fp16) and its top-k next-token ids (int32) and
logits (fp16) at every position: about 1.2 KB per token for SmolLM2-135M (2.5 GB for 2.1 M tokens), on
the local disk under the model cache (`teacher/`), never in the repository.

One folder per (target, chunk content, k): `TARGET/CHUNK-FINGERPRINT-kK/` with `feats.npy`, `ids.npy`,
`logits.npy` (one row per token of the chunk, memory-mapped) and `filled.npy` (one flag per answer, set
after its rows are written, so a job killed mid-write leaves that answer to be computed again). Values are
rounded through fp16 on the way in and read back as fp32, so a batch sees the same numbers whether its
answers were just computed or read back: an interrupted round resumes to the same weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from nanospec.training.round_data import TeacherBatch, TokenSequence, teacher_forward


def chunk_fingerprint(tokens: np.ndarray, offsets: np.ndarray) -> str:
    """sha256 of a chunk's tokens and offsets: another chunk under the same name gets another folder."""
    h = hashlib.sha256(np.ascontiguousarray(tokens).tobytes())
    h.update(np.ascontiguousarray(offsets).tobytes())
    return h.hexdigest()[:16]


class _ChunkStore:
    """The memory-mapped arrays of one chunk."""

    def __init__(self, folder: Path, offsets: np.ndarray, hidden: int, k: int):
        folder.mkdir(parents=True, exist_ok=True)
        rows, answers = int(offsets[-1]), len(offsets) - 1
        self.offsets = offsets
        self.feats = _open(folder / "feats.npy", np.float16, (rows, hidden))
        self.ids = _open(folder / "ids.npy", np.int32, (rows, k))
        self.logits = _open(folder / "logits.npy", np.float16, (rows, k))
        self.filled = _open(folder / "filled.npy", np.bool_, (answers,))


def _open(path: Path, dtype, shape: tuple[int, ...]) -> np.memmap:
    """An existing array of that dtype and shape, opened for reading and writing; else a new zeroed one."""
    if path.exists():
        try:
            arr = np.load(path, mmap_mode="r+")
            if arr.dtype == dtype and arr.shape == shape:
                return arr
        except (OSError, ValueError):
            pass
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)


class TeacherCache:
    """Per-answer teacher outputs of one target at one k, under `root` (see the module docstring)."""

    def __init__(self, root: Path, target_key: str, hidden: int, k: int):
        self.folder = Path(root) / target_key
        self.hidden, self.k = hidden, k
        self._stores: dict[str, _ChunkStore] = {}

    def attach(self, name: str, tokens: np.ndarray, offsets: np.ndarray) -> None:
        """Make the answers of chunk `name` (its path, as `TokenSequence.chunk` holds it) cacheable; its folder
        is named by the file's stem and the chunk's content, so it is found again from any checkout."""
        stem = Path(name).stem
        self._stores[name] = _ChunkStore(self.folder / f"{stem}-{chunk_fingerprint(tokens, offsets)}-k{self.k}",
                                         offsets, self.hidden, self.k)

    def get(self, seq: TokenSequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        store = self._stores.get(seq.chunk)
        if store is None or not store.filled[seq.row]:
            return None
        a, b = int(store.offsets[seq.row]), int(store.offsets[seq.row + 1])
        return (torch.from_numpy(np.asarray(store.feats[a:b], dtype=np.float32)),
                torch.from_numpy(np.asarray(store.ids[a:b], dtype=np.int64)),
                torch.from_numpy(np.asarray(store.logits[a:b], dtype=np.float32)))

    def put(self, seq: TokenSequence, feats: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store one answer's rows ([L, H], [L, k], [L, k]); returns them as they will be read back."""
        f16, l16 = feats.to(torch.float16), logits.to(torch.float16)
        store = self._stores.get(seq.chunk)
        if store is not None:
            a, b = int(store.offsets[seq.row]), int(store.offsets[seq.row + 1])
            store.feats[a:b] = f16.numpy()
            store.ids[a:b] = ids.to(torch.int32).numpy()
            store.logits[a:b] = l16.numpy()
            store.filled[seq.row] = True   # after the rows: a kill before this line leaves the answer unfilled
        return f16.float(), ids.long(), l16.float()


def cached_teacher(target, seqs: list[TokenSequence], ids: torch.Tensor, attention: torch.Tensor, k: int,
                   cache: TeacherCache | None) -> TeacherBatch:
    """The batch's teacher view: answers in `cache` read back, the others computed in one forward (and
    stored). Without a cache: `teacher_forward` as it is. Padding positions hold zeros."""
    if cache is None:
        return teacher_forward(target, ids, attention, k)
    rows = [cache.get(s) for s in seqs]
    missing = [i for i, r in enumerate(rows) if r is None]
    if missing:
        length = max(len(seqs[i].ids) for i in missing)
        fresh = teacher_forward(target, ids[missing, :length], attention[missing, :length], k)
        for j, i in enumerate(missing):
            n = len(seqs[i].ids)
            rows[i] = cache.put(seqs[i], fresh.feats[j, :n], fresh.topk_ids[j, :n], fresh.topk_logits[j, :n])
    B, L = ids.shape
    feats = torch.zeros(B, L, rows[0][0].shape[-1])
    top_ids, top_logits = torch.zeros(B, L, k, dtype=torch.long), torch.zeros(B, L, k)
    for i, (f, t, v) in enumerate(rows):
        feats[i, :f.shape[0]], top_ids[i, :t.shape[0]], top_logits[i, :v.shape[0]] = f, t, v
    return TeacherBatch(feats, top_ids, top_logits)
