"""KV-cache housekeeping: a transformers `DynamicCache` whose layers write into a growing buffer, and the
two explicit edits a speculative step makes to it (keep only the accepted path, or roll back).

transformers' `DynamicLayer` appends with `torch.cat`, which copies the whole cache on every forward: at a
few hundred tokens that is ~2.5 ms of a 31 ms plain step on a CPU (docs/benchmarks.md, "Verification
forward by part"), paid by every method. `BufferedLayer` keeps keys and values in a buffer with room to
spare (doubled when full) and exposes the filled part as a view, so a step writes only its own entries.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # entries allocated at first, per layer


class BufferedLayer(DynamicLayer):
    """A `DynamicLayer` backed by a preallocated buffer; `keys`/`values` are views of its first `length`
    entries, so the stock attention code reads them unchanged."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self.length + n, key_states, value_states)
        end = self.length + n
        self._kbuf[..., self.length:end, :] = key_states      # [B, H_kv, n, D] into the buffer
        self._vbuf[..., self.length:end, :] = value_states
        self.set_length(end)
        return self.keys, self.values

    def _reserve(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if self._kbuf is not None and self._kbuf.shape[-2] >= need:
            return
        cap = max(MIN_CAPACITY, need, 2 * (self._kbuf.shape[-2] if self._kbuf is not None else 0))
        kbuf = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
        vbuf = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
        if self.length:
            kbuf[..., :self.length, :] = self._kbuf[..., :self.length, :]
            vbuf[..., :self.length, :] = self._vbuf[..., :self.length, :]
        self._kbuf, self._vbuf = kbuf, vbuf

    def set_length(self, length: int) -> None:
        """Keep the first `length` entries (the buffer stays allocated)."""
        self.length = length
        self.keys = self._kbuf[..., :length, :]
        self.values = self._vbuf[..., :length, :]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            self.set_length(max(0, self.length + tokens_to_remove))
        elif tokens_to_remove > 0:
            super().crop(tokens_to_remove)  # raises, as the stock layer does

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self.length = 0
        super().reset()


def new_cache() -> DynamicCache:
    """An empty cache whose layers are `BufferedLayer`s (created on first use, one per model layer)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = BufferedLayer
    return cache


@torch.inference_mode()
def compact_cache(cache: DynamicCache, prefix_len: int, keep: torch.Tensor, path: list[int] | None = None) -> None:
    """Keep entries [0, prefix_len) plus `prefix_len + keep` (tree nodes on the accepted path).

    After a tree verification the cache holds prefix_len + T entries; the accepted path's
    nodes are copied in place to positions prefix_len .. prefix_len + len(keep) - 1 and the
    cache is cropped there: the prefix is never copied. `path`: the same indices on the host, when
    known; if they are 0, 1, 2, ... (the root alone, or a path of the tree's first nodes: about half
    the steps) the entries are already in place and only the length changes.
    """
    end = prefix_len + int(keep.shape[0])
    if path is not None and path == list(range(len(path))):
        crop_cache(cache, end)
        return
    for layer in _layers(cache):
        # keys/values: [B, H_kv, S, D]
        assert layer.keys.shape[-2] >= end, "cache shorter than the tree"
        src = keep.to(layer.keys.device) + prefix_len
        for name in ("keys", "values"):
            kv = getattr(layer, name)
            kv[..., prefix_len:end, :] = kv.index_select(-2, src)  # index_select copies first: overlap is safe
        _set_length(layer, end)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop every entry at or past `length` (roll back speculative head entries)."""
    for layer in _layers(cache):
        _set_length(layer, min(length, layer.keys.shape[-2]))


def _set_length(layer, length: int) -> None:
    if isinstance(layer, BufferedLayer):
        layer.set_length(length)
    else:  # a stock layer (a cache made elsewhere)
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
