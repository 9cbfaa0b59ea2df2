"""KV-cache housekeeping on transformers' DynamicCache: keep only the accepted path, or roll back."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


@torch.inference_mode()
def compact_cache(cache: DynamicCache, prefix_len: int, keep: torch.Tensor) -> None:
    """Keep entries [0, prefix_len) plus `prefix_len + keep` (tree nodes on the accepted path).

    After a tree verification the cache holds prefix_len + T entries; the accepted path's
    nodes are copied in place to positions prefix_len .. prefix_len + len(keep) - 1 and the
    cache is cropped there: the prefix is never copied.
    """
    end = prefix_len + int(keep.shape[0])
    for layer in _layers(cache):
        # keys/values: [B, H_kv, S, D]
        assert layer.keys.shape[-2] >= end, "cache shorter than the tree"
        src = keep.to(layer.keys.device) + prefix_len
        for name in ("keys", "values"):
            kv = getattr(layer, name)
            kv[..., prefix_len:end, :] = kv.index_select(-2, src)  # index_select copies first: overlap is safe
            setattr(layer, name, kv[..., :end, :])


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
