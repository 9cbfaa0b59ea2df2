"""KV-cache housekeeping on transformers' DynamicCache: keep only the accepted path, or roll back."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


def compact_cache(cache: DynamicCache, prefix_len: int, keep: torch.Tensor) -> None:
    """Keep entries [0, prefix_len) plus `prefix_len + keep` (tree nodes on the accepted path).

    After a tree verification the cache holds prefix_len + T entries; the accepted path's
    nodes move to positions prefix_len .. prefix_len + len(keep) - 1 and the rest are dropped.
    """
    for layer in _layers(cache):
        # keys/values: [B, H_kv, S, D]
        assert layer.keys.shape[-2] >= prefix_len + int(keep.shape[0]), "cache shorter than the tree"
        src = keep.to(layer.keys.device) + prefix_len
        layer.keys = torch.cat([layer.keys[..., :prefix_len, :], layer.keys.index_select(-2, src)], dim=-2)
        layer.values = torch.cat([layer.values[..., :prefix_len, :], layer.values.index_select(-2, src)], dim=-2)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop every entry at or past `length` (roll back speculative head entries)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def _layers(cache: DynamicCache):
    """Initialised full-attention layers; other layer kinds would need their own bookkeeping."""
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", layer.keys is not None) or layer.keys is None:
            continue
        if getattr(layer, "is_sliding", False):
            raise ValueError("sliding-window KV caches are not supported by the tree verifier")
        yield layer
