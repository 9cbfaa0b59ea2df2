"""A training round's data: the answer chunks as sequences, a fixed validation split, batches, and the
target's features and top-k distribution from one teacher-forced forward.

Features are not committed (4.6 KB per token for SmolLM2-135M in fp32; the chunks hold 2 bytes per
token): a batch pays one target forward over its padded tokens, unless `teacher_cache.py` kept an
answer's from an earlier epoch or round on the local disk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from nanospec.training.answer_chunks import iter_chunks, read_manifest

VAL_MODULUS, VAL_REMAINDER = 97, 13   # a prompt is held out when pool_index % 97 == 13 (stable as data grows)


@dataclass
class TokenSequence:
    """One prompt + answer as token ids (`ids` [L] int64); the answer starts at `answer_start`."""

    ids: torch.Tensor
    answer_start: int
    pool_index: int
    sampled: bool
    chunk: str = ""             # where it was read: the chunk's path and its row there (teacher_cache.py)
    row: int = -1
    source: str = ""            # the prompt's source, as the folder's manifest names it


@dataclass
class RoundData:
    train: list[TokenSequence]
    val: list[TokenSequence]
    chunks: list[dict]          # [{"folder", "file", "answers"}] in the order read
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # chunk path -> (tokens, offsets)
    copies: int = 0             # extra copies of repeated sources' answers in `train` (see `repeat_sources`)


def is_validation(pool_index: int) -> bool:
    return pool_index % VAL_MODULUS == VAL_REMAINDER


def parse_repeat(text: str) -> dict[str, int]:
    """'templated=3,code=2' -> {'templated': 3, 'code': 2}: each named source's training answers taken that
    many times a pass ('' = every answer once). ValueError naming what is wrong."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, times = part.partition("=")
        if not name.strip() or not times.strip().isdigit() or int(times) < 1:
            raise ValueError(f"repeat {part!r}: write SOURCE=TIMES with TIMES a whole number >= 1, "
                             "e.g. 'templated=3'")
        out[name.strip()] = int(times)
    return out


def repeat_sources(train: list[TokenSequence], repeat: dict[str, int], known: set[str]) -> int:
    """Append the extra copies that `repeat` asks for to `train` (in place); -> how many were added."""
    unknown = sorted(set(repeat) - known)
    if unknown:
        raise ValueError(f"repeat names unknown prompt sources {unknown}; the data's sources are {sorted(known)}")
    extra = [s for s in train for _ in range(repeat.get(s.source, 1) - 1)]
    train.extend(extra)
    return len(extra)


def load_round_data(folders: list[Path], tokenizer_hash: str | None, only: list[dict] | None = None,
                    max_val: int = 256, warn=print, repeat: dict[str, int] | None = None) -> RoundData:
    """Every usable chunk of `folders` (or exactly the chunks named in `only`, as a resumed round recorded
    them; any now missing is warned about). Validation = greedy answers of held-out pool indices (their
    sampled answers are left out of training too), at most `max_val`. `repeat` (see `parse_repeat`) weights
    sources by repeating their training answers; validation is never repeated."""
    wanted = {(c["folder"], c["file"]) for c in only} if only is not None else None
    train, val, used, arrays, known = [], [], [], {}, set()
    for folder in folders:
        names = list((read_manifest(Path(folder)) or {}).get("sources", []))
        known.update(names)
        for chunk in iter_chunks(Path(folder), tokenizer_hash, warn):
            if wanted is not None and (str(folder), chunk.name) not in wanted:
                continue
            used.append({"folder": str(folder), "file": chunk.name, "answers": len(chunk)})
            where = str(Path(folder) / chunk.name)   # two folders may each hold an answers-00000.npz
            arrays[where] = (chunk.tokens, chunk.offsets)
            for i in range(len(chunk)):
                seq = TokenSequence(torch.from_numpy(chunk.sequence(i).astype(np.int64)), int(chunk.answer_start[i]),
                                    int(chunk.pool_index[i]), bool(chunk.sampled[i]), where, i,
                                    names[int(chunk.source[i])] if int(chunk.source[i]) < len(names) else "")
                if not is_validation(seq.pool_index):
                    train.append(seq)
                elif not seq.sampled and len(val) < max_val:
                    val.append(seq)
    if wanted is not None:
        for folder, name in sorted(wanted - {(c["folder"], c["file"]) for c in used}):
            warn(f"warning: the round's chunk {Path(folder) / name} is no longer usable; continuing without it")
    copies = repeat_sources(train, repeat or {}, known)
    return RoundData(train, val, used, arrays, copies)


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Batches of about `batch_tokens` padded tokens (length-sorted within seeded groups of 64), shuffled;
    a pure function of (lengths, batch_tokens, seed, epoch), so a resumed round rebuilds the same plan."""
    rng = random.Random(f"round-{seed}-{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for g in range(0, len(order), 64):
        cur, longest = [], 0
        for j in sorted(order[g:g + 64], key=lambda k: lengths[k]):
            if cur and max(longest, lengths[j]) * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur, longest = [], 0
            cur.append(j)
            longest = max(longest, lengths[j])
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def pad_batch(seqs: list[TokenSequence], prompt_loss: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> ids [B, L] (right-padded with 0), attention [B, L], train mask [B, L-1]: True at positions t
    whose next feature f[t+1] is trained (t in start..len-2; start 0, or the answer's with `prompt_loss` off)."""
    L = max(len(s.ids) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    attention = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L - 1, dtype=torch.bool)
    for row, s in enumerate(seqs):
        n = len(s.ids)
        ids[row, :n] = s.ids
        attention[row, :n] = 1
        start = 0 if prompt_loss else max(s.answer_start - 2, 0)
        mask[row, start:n - 1] = True
    return ids, attention, mask


@dataclass
class TeacherBatch:
    """The target's view of a batch: features f [B, L, H] (final-norm output, fp32) and, at every position,
    its top-k next-token ids [B, L, k] and logits [B, L, k]."""

    feats: torch.Tensor
    topk_ids: torch.Tensor
    topk_logits: torch.Tensor


@torch.no_grad()
def teacher_forward(target, ids: torch.Tensor, attention: torch.Tensor, k: int, rows: int = 512) -> TeacherBatch:
    """One teacher-forced target forward; the top-k over the full vocabulary in slices of `rows` positions
    (a full [B*L, V] logit matrix would not fit comfortably)."""
    feats = target.model(input_ids=ids, attention_mask=attention).last_hidden_state.float()   # [B, L, H]
    w = target.get_output_embeddings().weight                                                  # [V, H]
    flat = feats.reshape(-1, feats.shape[-1])
    vals, idx = [], []
    for i in range(0, flat.shape[0], rows):
        top = (flat[i:i + rows] @ w.T.float()).topk(k, dim=-1)
        vals.append(top.values)
        idx.append(top.indices)
    shape = (*feats.shape[:2], k)
    return TeacherBatch(feats, torch.cat(idx).reshape(shape), torch.cat(vals).reshape(shape))
