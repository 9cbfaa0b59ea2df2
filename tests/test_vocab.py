"""Vocabulary policies: Ctx/Ext contents, FIFO eviction, logits over the active rows, incremental gather."""

from __future__ import annotations

import pytest
import torch

from nanospec.vocab import ActiveVocab, FullVocab, build_vocab

from .conftest import DEVICE

V, H = 50, 8


@pytest.fixture()
def weight():
    return torch.randn(V, H, generator=torch.Generator().manual_seed(0)).to(DEVICE)


def members(vocab) -> set[int]:
    return set(torch.nonzero(vocab.member[:V]).flatten().tolist())


def add(vocab, ids) -> int:
    prop = vocab.propose(torch.tensor(ids))
    return vocab.commit(prop, int(prop.n_new))


def test_ctx_then_ext_contents(weight):
    vocab = ActiveVocab(weight, None, capacity=100)
    prompt = torch.tensor([5, 6, 5, 7])
    top = torch.tensor([[1, 2, 3], [2, 3, 4], [6, 8, 9], [7, 7, 10]])
    assert vocab.begin_request(prompt, top) == 10
    assert members(vocab) == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
    assert vocab.size == 10
    # Ext: tree tokens + the target's top-k at each node
    tree_tokens = torch.tensor([7, 11, 12])
    tree_top = torch.tensor([[11, 13, 1], [14, 2, 3], [15, 16, 12]])
    n = add(vocab, torch.cat([tree_tokens, tree_top.flatten()]).tolist())
    assert n == 6
    assert members(vocab) == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
    # a new request resets the set
    vocab.begin_request(torch.tensor([40]), torch.tensor([[41, 42, 40]]))
    assert members(vocab) == {40, 41, 42}


def test_fifo_eviction_at_capacity(weight):
    vocab = ActiveVocab(weight, None, capacity=4)
    assert add(vocab, [1, 2, 3]) == 3
    assert add(vocab, [2, 4, 5]) == 2          # 2 is already in; 4 fills, 5 evicts the oldest (1)
    assert members(vocab) == {2, 3, 4, 5}
    assert add(vocab, [6]) == 1                # evicts 2 (oldest remaining slot)
    assert members(vocab) == {3, 4, 5, 6}
    assert vocab.size == 4
    assert add(vocab, [10, 11, 12, 13, 14, 15]) == 4  # more than capacity at once: keep the latest
    assert members(vocab) == {12, 13, 14, 15}
    assert sorted(vocab.ids.tolist()) == [12, 13, 14, 15]


def test_logits_over_active_equal_full_logits(weight):
    core = torch.tensor([0, 1, 2, 3])
    vocab = ActiveVocab(weight, core, capacity=6, name="hybrid")
    vocab.begin_request(torch.tensor([9, 20]), torch.tensor([[21, 22, 0], [23, 9, 1]]))
    h = torch.randn(3, H).to(DEVICE)
    vocab.wait_ready()  # on CUDA the rows are gathered on a side stream
    act = vocab.logits(h)
    ids = vocab.slot_ids(torch.arange(vocab.size))
    full = FullVocab(weight).logits(h)
    assert act.shape == (3, vocab.size) == (3, 4 + 5)
    assert torch.allclose(act, full[:, ids])
    assert set(ids.tolist()) == {0, 1, 2, 3, 9, 20, 21, 22, 23}


def test_only_new_rows_are_gathered(weight):
    w = weight.clone()
    vocab = ActiveVocab(w, None, capacity=20)
    add(vocab, [1, 2, 3])
    assert vocab.rows_gathered == 3
    w[1] += 100.0                              # rows already in the buffer are not copied again...
    w[4] += 100.0
    add(vocab, [1, 2, 3, 4, 4])
    assert vocab.rows_gathered == 4            # ...only the one new id was gathered
    vocab.wait_ready()
    slot = {i: s for s, i in enumerate(vocab.ids.tolist()) if i >= 0}
    assert torch.equal(vocab.buffer[slot[1]], weight[1])
    assert torch.equal(vocab.buffer[slot[4]], w[4])


def test_static_and_full_policies(weight):
    freq = torch.arange(V - 1, -1, -1)
    static = build_vocab("static", weight, capacity=8, frequent_ids=freq, static_size=10, core_size=0)
    static.begin_request(torch.tensor([0]), torch.tensor([[1, 2, 3]]))
    assert members(static) == set(range(40, 50)) and static.size == 10
    assert static.propose(torch.tensor([1, 2])) is None
    full = build_vocab("full", weight, capacity=8, frequent_ids=None, static_size=10, core_size=0)
    assert full.size == V and bool(full.contains(torch.tensor([3, 49])).all())
    with pytest.raises(ValueError, match="frequency"):
        build_vocab("hybrid", weight, capacity=8, frequent_ids=None, static_size=10, core_size=4)
