"""Suffix arrays by prefix doubling, in numpy.

`suffix_array(text)` returns the start positions of `text`'s suffixes in lexicographic order, where
a suffix that is a prefix of another sorts first (Python's list order). Prefix doubling: after
round k every suffix's rank is the rank of its first 2^k tokens; round k + 1 sorts by the pair
(rank[i], rank[i + 2^k]) with one stable argsort of a packed int64 key, and it stops once all
ranks differ. Each round is O(n log n); the rounds needed are log2 of the longest repeated
substring (a few for text, at most log2 n).
"""

from __future__ import annotations

import numpy as np


def suffix_array(text: np.ndarray) -> np.ndarray:
    """[n] integer tokens -> [n] int32 suffix start positions, sorted."""
    text = np.asarray(text)
    if text.ndim != 1:
        raise ValueError(f"suffix_array takes a 1-D token array; got shape {text.shape}")
    n = int(text.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    if n >= 2 ** 31 - 1:
        raise ValueError(f"{n} tokens do not fit an int32 suffix array")
    # rank 0..(distinct - 1) by the first token; +1 below leaves 0 for "past the end"
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    k = 1
    while True:
        second = np.zeros(n, dtype=np.int64)
        second[: n - k] = rank[k:] + 1                              # 0: the suffix ends before i + k
        key = rank * (n + 1) + second                               # < n * (n + 1): fits int64
        order = np.argsort(key, kind="stable")                       # [n] sorted by first 2k tokens
        sorted_key = key[order]
        new_rank = np.empty(n, dtype=np.int64)
        new_rank[order] = np.concatenate([[0], np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        rank = new_rank
        if rank[order[-1]] == n - 1 or k >= n:                       # every rank distinct: sorted
            return order.astype(np.int32)
        k *= 2

