"""A datastore of token sequences (documents) indexed for "longest suffix of the context" lookups.

Layout: the documents one after the other, each followed by a separator (the dtype's largest value,
never a token id): `tokens` = doc0 SEP doc1 SEP ... docK-1 SEP, `offsets[i]` the start of doc i.

The index is the suffix array of the *reversed* stream. A suffix of the context that occurs in the
store is, read backwards, a prefix of some suffix of the reversed stream, so one binary search for the
reversed context finds the longest one: it is the longer common prefix with the two suffixes next to
the insertion point. All its occurrences then form one contiguous range of the suffix array.
A reversed occurrence at r covers forward positions n-r-L .. n-r-1, so what followed it starts at
n - r. The context holds no SEP, so a match never spans two documents, and continuations are cut at
the next SEP.

Comparisons run on bytes: the reversed stream is kept big-endian, where byte order is numeric order,
so comparing a slice with the pattern is one memcmp (a lookup is ~3 binary searches of log2 n steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from nanospec.retrieval.suffix_array import suffix_array


def token_dtype(max_id: int) -> np.dtype:
    """uint16 when every id is below 65535 (the separator takes the largest value), else uint32."""
    if max_id < np.iinfo(np.uint16).max:
        return np.dtype(np.uint16)
    if max_id < np.iinfo(np.uint32).max:
        return np.dtype(np.uint32)
    raise ValueError(f"token id {max_id} does not fit uint32")


def separator(dtype: np.dtype) -> int:
    return int(np.iinfo(dtype).max)


@dataclass
class Match:
    """The longest context suffix found: `length` tokens, occurring at suffix-array rows lo..hi-1."""

    length: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


NO_MATCH = Match(0, 0, 0)


@dataclass
class SuffixStore:
    tokens: np.ndarray                  # [n] uint16/uint32, documents each followed by SEP
    offsets: np.ndarray                 # [docs + 1] int64, doc i = tokens[offsets[i]:offsets[i+1] - 1]
    sa: np.ndarray                      # [n] int32, suffix array of tokens[::-1]
    manifest: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens.ndim != 1 or self.sa.shape != self.tokens.shape:
            raise ValueError(f"tokens {self.tokens.shape} and suffix array {self.sa.shape} must be 1-D, equal length")
        self.sep = separator(self.tokens.dtype)
        self.width = self.tokens.dtype.itemsize
        self._big = self.tokens.dtype.newbyteorder(">")
        self._rev = self.tokens[::-1].astype(self._big).tobytes()   # the reversed stream as big-endian bytes

    # ---- building ---------------------------------------------------------------------------------

    @classmethod
    def from_documents(cls, docs: Iterable[Sequence[int] | np.ndarray], dtype: np.dtype | None = None,
                       manifest: dict | None = None) -> "SuffixStore":
        """Documents (token id sequences; empty ones are dropped) -> a store with its suffix array."""
        arrays = [np.asarray(d, dtype=np.int64).reshape(-1) for d in docs]
        arrays = [a for a in arrays if a.size]
        top = max((int(a.max()) for a in arrays), default=0)
        if any(int(a.min()) < 0 for a in arrays):
            raise ValueError("token ids must be >= 0")
        dtype = np.dtype(dtype) if dtype is not None else token_dtype(top)
        sep = separator(dtype)
        if top >= sep:
            raise ValueError(f"token id {top} does not fit {dtype} below its separator {sep}")
        lengths = np.array([a.size + 1 for a in arrays], dtype=np.int64)   # + the separator
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.full(int(offsets[-1]), sep, dtype=dtype)
        for start, a in zip(offsets[:-1], arrays):
            tokens[start:start + a.size] = a
        return cls(tokens, offsets, suffix_array(tokens[::-1]), manifest or {})

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1] - 1]

    # ---- lookup -----------------------------------------------------------------------------------

    def _pattern(self, context: Sequence[int] | np.ndarray, max_len: int) -> bytes:
        """The context's last `max_len` tokens reversed, as big-endian bytes; cut at the first id the
        store cannot hold (it could never match)."""
        tail = np.asarray(context, dtype=np.int64).reshape(-1)[-max_len:][::-1]
        bad = np.flatnonzero((tail < 0) | (tail >= self.sep))
        if bad.size:
            tail = tail[: bad[0]]
        return tail.astype(self._big).tobytes()

    def _suffix_bytes(self, row: int, n_bytes: int) -> bytes:
        s = int(self.sa[row]) * self.width
        return self._rev[s:s + n_bytes]

    def _lower(self, pattern: bytes) -> int:
        """First row whose suffix, cut to the pattern's length, is >= the pattern."""
        lo, hi, w = 0, len(self.sa), len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._suffix_bytes(mid, w) < pattern:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _upper(self, pattern: bytes) -> int:
        """First row whose suffix, cut to the pattern's length, is > the pattern."""
        lo, hi, w = 0, len(self.sa), len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._suffix_bytes(mid, w) <= pattern:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _common_tokens(self, row: int, pattern: bytes) -> int:
        if not 0 <= row < len(self.sa):
            return 0
        other = self._suffix_bytes(row, len(pattern))
        k = 0
        for a, b in zip(other, pattern):
            if a != b:
                break
            k += 1
        return k // self.width

    def longest_match(self, context: Sequence[int] | np.ndarray, max_len: int = 16, min_len: int = 2) -> Match:
        """The longest suffix of the context's last `max_len` tokens that occurs in the store, if it has
        at least `min_len` tokens (else `NO_MATCH`), with the suffix-array rows of its occurrences."""
        if min_len < 1 or max_len < min_len:
            raise ValueError(f"need 1 <= min_len <= max_len; got min_len={min_len}, max_len={max_len}")
        pattern = self._pattern(context, max_len)
        if len(pattern) < min_len * self.width or not len(self.sa):
            return NO_MATCH
        at = self._lower(pattern)
        length = max(self._common_tokens(at - 1, pattern), self._common_tokens(at, pattern))
        if length < min_len:
            return NO_MATCH
        prefix = pattern[: length * self.width]
        return Match(length, self._lower(prefix), self._upper(prefix))

    def continuation_starts(self, match: Match, cap: int = 256) -> np.ndarray:
        """[m] int64 forward positions right after each occurrence (at most `cap`, evenly spread over
        the range when there are more)."""
        if match.count == 0:
            return np.zeros(0, dtype=np.int64)
        rows = np.arange(match.lo, match.hi)
        if rows.size > cap:
            rows = rows[np.linspace(0, rows.size - 1, cap).round().astype(np.int64)]
        return len(self.tokens) - self.sa[rows].astype(np.int64)

    def continuations(self, starts: np.ndarray, depth: int) -> np.ndarray:
        """[m, depth] int64: the `depth` tokens from each start, -1 from its document's end on."""
        n = len(self.tokens)
        idx = np.minimum(starts[:, None] + np.arange(depth)[None, :], n - 1)       # the last token is a SEP
        vals = self.tokens[idx].astype(np.int64)
        ended = np.logical_or.accumulate(vals == self.sep, axis=1)
        return np.where(ended, -1, vals)
