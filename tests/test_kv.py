"""KV compaction: after acceptance the target cache equals running the accepted tokens one by one."""

from __future__ import annotations

import pytest
import torch

from nanospec.decoding.kv import compact_cache, crop_cache, new_cache
from nanospec.decoding.tree import ancestor_mask, depths_from_parents, tree_attention_mask, tree_position_ids
from nanospec.decoding.verify import target_forward

from .conftest import DEVICE


def test_compacted_cache_equals_autoregressive_cache(tiny_pair):
    model, _ = tiny_pair
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 32000, (1, 9), generator=g)
    n = prompt.shape[1]
    # tree: root 0 with two branches; accept path 0 -> 2 -> 4 -> 6
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 4, 3])
    tokens = torch.randint(0, 32000, (8,), generator=g)
    path = torch.tensor([0, 2, 4, 6])
    prompt, parents, tokens, path = (t.to(DEVICE) for t in (prompt, parents, tokens, path))

    cache = new_cache()
    target_forward(model, prompt, torch.arange(n, device=DEVICE)[None], cache)
    depths = depths_from_parents(parents)
    out_tree = target_forward(model, tokens[None], tree_position_ids(depths, n), cache,
                              tree_attention_mask(ancestor_mask(parents), n))
    compact_cache(cache, n, path)

    ref = new_cache()
    seq = torch.cat([prompt[0], tokens[path]])[None]
    out_ref = target_forward(model, seq, torch.arange(seq.shape[1], device=DEVICE)[None], ref)
    assert cache.get_seq_length() == ref.get_seq_length() == n + 4
    for a, b in zip(cache.layers, ref.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5)
        assert torch.allclose(a.values, b.values, atol=1e-5)
    # the tree forward's outputs on the path equal the sequential forward's
    assert torch.allclose(out_tree.logits[path], out_ref.logits[n:], atol=1e-4)

    crop_cache(cache, n + 1)
    assert cache.get_seq_length() == n + 1


@pytest.mark.parametrize("path", [[0], [0, 1], [0, 1, 3], [0, 2]])
def test_a_path_given_on_the_host_compacts_alike(tiny_pair, monkeypatch, path):
    """With the path's host indices, a path of the tree's first nodes (0, 1, 2, ...) keeps its entries where
    they are without copying; any other path is copied as before. Either way the cache is the same."""
    model, _ = tiny_pair
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 32000, (1, 6), generator=g).to(DEVICE)
    parents = torch.tensor([-1, 0, 1, 2, 0], device=DEVICE)
    tokens = torch.randint(0, 32000, (5,), generator=g).to(DEVICE)
    caches = []
    for host in (None, path):
        cache = new_cache()
        target_forward(model, prompt, torch.arange(6, device=DEVICE)[None], cache)
        target_forward(model, tokens[None], tree_position_ids(depths_from_parents(parents), 6), cache,
                       tree_attention_mask(ancestor_mask(parents), 6))
        copies = []
        gather = torch.Tensor.index_select
        monkeypatch.setattr(torch.Tensor, "index_select", lambda t, *a: (copies.append(1), gather(t, *a))[1])
        compact_cache(cache, 6, torch.tensor(path, device=DEVICE), host)
        monkeypatch.undo()
        caches.append(cache)
        assert cache.get_seq_length() == 6 + len(path)
        in_place = host is not None and path == list(range(len(path)))
        assert (len(copies) == 0) == in_place
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_buffered_cache_grows_crops_and_matches_the_stock_cache(tiny_pair, monkeypatch):
    """The engine's cache writes into a buffer (no copy of the whole cache per forward): past its first
    capacity it grows, a crop only shortens the view, and every forward reads what the stock
    concatenating cache would give it, bit for bit."""
    from transformers import DynamicCache

    from nanospec.decoding import kv

    model, _ = tiny_pair
    monkeypatch.setattr(kv, "MIN_CAPACITY", 8)  # force several regrowths on a short sequence
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 32000, (1, 30), generator=g).to(DEVICE)
    ours, stock = new_cache(), DynamicCache()
    assert isinstance(ours.layer_class_to_replicate(), kv.BufferedLayer)
    pos = 0
    for n in (5, 1, 4, 1, 1, 9, 3):  # prefill, then steps of mixed sizes
        chunk, p = seq[:, pos:pos + n], torch.arange(pos, pos + n, device=DEVICE)[None]
        a = target_forward(model, chunk, p, ours)
        b = target_forward(model, chunk, p, stock)
        assert torch.equal(a.logits, b.logits)
        pos += n
    layer = ours.layers[0]
    assert ours.get_seq_length() == pos == layer.keys.shape[-2] and layer._kbuf.shape[-2] >= pos
    crop_cache(ours, 20)
    assert ours.get_seq_length() == 20 and torch.equal(ours.layers[0].keys, stock.layers[0].keys[..., :20, :])
    buffer = layer._kbuf
    a = target_forward(model, seq[:, 20:22], torch.arange(20, 22, device=DEVICE)[None], ours)
    assert layer._kbuf is buffer  # written in place, not reallocated
    crop_cache(stock, 20)
    b = target_forward(model, seq[:, 20:22], torch.arange(20, 22, device=DEVICE)[None], stock)
    assert torch.equal(a.logits, b.logits)


def test_tree_attention_equals_stock_sdpa_bit_for_bit(tiny_pair):
    """Grouped heads under a tree mask in one kernel call (attention.py) give the stock sdpa path's
    result exactly, on the tiny pair's grouped-query target."""
    from nanospec.bench.random_pair import random_target

    from nanospec.decoding.attention import TREE_SDPA, use_tree_attention

    model, _ = tiny_pair
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the case it changes
    # Two fresh copies built from the same config and seed: the session's model may carry an engine's
    # packed CPU weights, which cannot be deep-copied.
    stock, ours = (random_target(model.config, seed=0).to(DEVICE) for _ in range(2))
    stock.config._attn_implementation = "sdpa"  # the session's model may already have been switched by an engine
    assert use_tree_attention(ours.config) and ours.config._attn_implementation == TREE_SDPA
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, 32000, (1, 11), generator=g).to(DEVICE)
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 4, 3], device=DEVICE)
    tokens = torch.randint(0, 32000, (1, 8), generator=g).to(DEVICE)
    anc, n = ancestor_mask(parents), prompt.shape[1]
    outs = []
    for m in (stock, ours):
        cache = new_cache()
        target_forward(m, prompt, torch.arange(n, device=DEVICE)[None], cache)
        outs.append(target_forward(m, tokens, tree_position_ids(depths_from_parents(parents), n), cache,
                                   tree_attention_mask(anc, n)).logits)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_attention_rows_do_not_depend_on_their_neighbours(dtype):
    """In bf16/fp16 on a CPU (attention.py runs the kernel in fp64 inside) a query row verified among
    others, under a mask that hides keys after it, gets the bits it gets decoded alone over just the
    keys it sees: the number of rows and the masked keys do not change how its sums round."""
    from nanospec.decoding.attention import tree_sdpa_forward

    if DEVICE.type != "cpu":
        pytest.skip("the widened attention is the CPU's half-precision path")

    class Layer:  # what the attention function reads of a layer: its grouping
        num_key_value_groups = 3

    g = torch.Generator().manual_seed(5)
    heads, kv_heads, dim = 9, 3, 64
    for cached in (20, 63, 130, 300):
        for rows in (2, 9, 16):
            q = torch.randn(1, heads, rows, dim, generator=g).to(dtype)
            k, v = (torch.randn(1, kv_heads, cached + rows, dim, generator=g).to(dtype) for _ in range(2))
            causal = torch.ones(rows, cached + rows, dtype=torch.bool).tril(cached)[None, None]
            together, _ = tree_sdpa_forward(Layer(), q, k, v, causal, scaling=dim ** -0.5)  # [1, rows, H, D]
            for r in range(rows):
                seen = cached + r + 1
                alone, _ = tree_sdpa_forward(Layer(), q[:, :, r:r + 1], k[:, :, :seen], v[:, :, :seen], None,
                                             scaling=dim ** -0.5)
                assert torch.equal(alone[0, 0], together[0, r]), f"{cached} cached keys, row {r} of {rows}"
