"""The teacher cache (`training/teacher_cache.py`): an answer's target view computed once, read back the same
in later epochs, rounds and processes; a half-written answer or another chunk's content is never read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nanospec.bench.random_pair import random_target, random_target_config
from nanospec.training import teacher_cache
from nanospec.training.round_data import TokenSequence, pad_batch, teacher_forward
from nanospec.training.teacher_cache import TeacherCache, cached_teacher

K = 4


@pytest.fixture(scope="module")
def target():
    return random_target(random_target_config(512, 64, 2, heads=2, kv_heads=1, intermediate=128), seed=0).eval()


def chunk(seed: int = 0, lengths=(7, 12, 5)):
    g = np.random.default_rng(seed)
    tokens = g.integers(3, 500, sum(lengths)).astype(np.uint16)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    seqs = [TokenSequence(torch.from_numpy(tokens[offsets[i]:offsets[i + 1]].astype(np.int64)), 2, i, False,
                          "answers-00000.npz", i) for i in range(len(lengths))]
    return tokens, offsets, seqs


def new_cache(root, tokens, offsets) -> TeacherCache:
    cache = TeacherCache(root, "tiny", 64, K)
    cache.attach("answers-00000.npz", tokens, offsets)
    return cache


def forwards(monkeypatch) -> list:
    calls = []
    real = teacher_cache.teacher_forward
    monkeypatch.setattr(teacher_cache, "teacher_forward", lambda *a, **kw: (calls.append(a[1].shape[0]), real(*a, **kw))[1])
    return calls


def test_an_answer_is_computed_once_and_read_back_the_same(tmp_path, target, monkeypatch):
    tokens, offsets, seqs = chunk()
    ids, attention, _ = pad_batch(seqs, True)
    plain = teacher_forward(target, ids, attention, K)
    calls = forwards(monkeypatch)
    first = cached_teacher(target, seqs, ids, attention, K, new_cache(tmp_path, tokens, offsets))
    again = cached_teacher(target, seqs, ids, attention, K, new_cache(tmp_path, tokens, offsets))  # a new process
    assert calls == [3]                                # one forward, for the first call only
    for got in (first, again):
        for i, s in enumerate(seqs):
            n = len(s.ids)
            assert torch.allclose(got.feats[i, :n], plain.feats[i, :n], rtol=2e-3, atol=2e-3)  # fp16 rounding
            assert torch.equal(got.topk_ids[i, :n], plain.topk_ids[i, :n])
            assert torch.allclose(got.topk_logits[i, :n], plain.topk_logits[i, :n], rtol=2e-3, atol=2e-3)
            assert not got.feats[i, n:].any()          # padding holds zeros
    assert torch.equal(first.feats, again.feats) and torch.equal(first.topk_logits, again.topk_logits)


def test_only_the_missing_answers_are_computed(tmp_path, target, monkeypatch):
    tokens, offsets, seqs = chunk()
    cache = new_cache(tmp_path, tokens, offsets)
    ids, attention, _ = pad_batch(seqs[:1], True)
    cached_teacher(target, seqs[:1], ids, attention, K, cache)
    calls = forwards(monkeypatch)
    ids, attention, _ = pad_batch(seqs, True)
    cached_teacher(target, seqs, ids, attention, K, cache)
    assert calls == [2]


def test_a_half_written_answer_or_other_content_is_computed_again(tmp_path, target, monkeypatch):
    tokens, offsets, seqs = chunk()
    ids, attention, _ = pad_batch(seqs, True)
    cached_teacher(target, seqs, ids, attention, K, new_cache(tmp_path, tokens, offsets))
    folder = next((tmp_path / "tiny").iterdir())
    filled = np.load(folder / "filled.npy", mmap_mode="r+")
    filled[1] = False                                  # killed after its rows, before its flag
    filled.flush()
    del filled
    calls = forwards(monkeypatch)
    cached_teacher(target, seqs, ids, attention, K, new_cache(tmp_path, tokens, offsets))
    assert calls == [1]
    other, other_offsets, other_seqs = chunk(seed=1)   # the same file name, other tokens
    ids, attention, _ = pad_batch(other_seqs, True)
    cached_teacher(target, other_seqs, ids, attention, K, new_cache(tmp_path, other, other_offsets))
    assert calls == [1, 3] and len(list((tmp_path / "tiny").iterdir())) == 2


def test_without_a_cache_the_batch_is_the_plain_forward(target):
    _, _, seqs = chunk()
    ids, attention, _ = pad_batch(seqs, True)
    a, b = cached_teacher(target, seqs, ids, attention, K, None), teacher_forward(target, ids, attention, K)
    assert torch.equal(a.feats, b.feats) and torch.equal(a.topk_ids, b.topk_ids)


def test_two_folders_with_the_same_chunk_name_keep_their_own_answers(tmp_path, target):
    """`data` may name two answer folders, each with an answers-00000.npz: each answer reads its own rows."""
    from nanospec.training.answer_chunks import AnswerRecord, write_chunk, write_manifest
    from nanospec.training.round_data import load_round_data

    folders = []
    for n, folder in enumerate((tmp_path / "a", tmp_path / "b")):
        folder.mkdir()
        g = np.random.default_rng(n)
        records = [AnswerRecord(ids=g.integers(3, 500, 9 + 2 * n).tolist(), answer_start=4, pool_index=i,
                                sampled=False, finished=True, source=0) for i in range(3)]
        write_manifest(folder, {"format": 1, "chunks": [write_chunk(folder, "answers-00000.npz", records, "t")]})
        folders.append(folder)
    data = load_round_data(folders, "t", warn=pytest.fail)
    assert len(data.arrays) == 2 and len({s.chunk for s in data.train}) == 2
    cache = TeacherCache(tmp_path / "cache", "tiny", 64, K)
    for name, (tokens, offsets) in data.arrays.items():
        cache.attach(name, tokens, offsets)
    seqs = data.train
    ids, attention, _ = pad_batch(seqs, True)
    cached_teacher(target, seqs, ids, attention, K, cache)
    again = cached_teacher(target, seqs, ids, attention, K, cache)
    plain = teacher_forward(target, ids, attention, K)
    for i, s in enumerate(seqs):
        n = len(s.ids)
        assert torch.allclose(again.feats[i, :n], plain.feats[i, :n], rtol=2e-3, atol=2e-3)
