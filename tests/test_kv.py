"""KV compaction: after acceptance the target cache equals running the accepted tokens one by one."""

from __future__ import annotations

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
