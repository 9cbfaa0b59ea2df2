"""Continuations -> a small draft tree (a count-weighted trie), as plain numpy data.

Each row of the continuation matrix is what followed one occurrence of the matched context. The
trie of those rows counts, per node, how many occurrences began with its path; its empirical
probability is count / the parent's count (the root's count is the number of occurrences that
have at least one next token, so the root's children sum to 1). The tree keeps the `max_nodes`
nodes with the highest counts (count / occurrences is the path's empirical probability); a child
never counts more than its parent and ties go to the shallower node, so the kept set is closed
under ancestors. Nodes are returned depth by depth: parents before children.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RetrievedTree:
    tokens: np.ndarray      # [K] int64 token id per node
    parents: np.ndarray     # [K] int64 parent node index; -1 = hangs below the root (the context's last token)
    depths: np.ndarray      # [K] int64, 1 for the root's children
    probs: np.ndarray       # [K] float64, count / parent's count
    counts: np.ndarray      # [K] int64 occurrences whose continuation starts with the node's path
    match_length: int = 0   # context tokens matched (0: no match, empty tree)
    occurrences: int = 0    # occurrences with a next token (the root's count)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def path_probs(self) -> np.ndarray:
        """[K] empirical probability of each node's whole path: count / occurrences."""
        return self.counts / max(self.occurrences, 1)


def empty_tree(match_length: int = 0) -> RetrievedTree:
    z = np.zeros(0, dtype=np.int64)
    return RetrievedTree(z, z.copy(), z.copy(), np.zeros(0), z.copy(), match_length, 0)


def continuation_tree(conts: np.ndarray, max_nodes: int, min_count: int = 1, match_length: int = 0) -> RetrievedTree:
    """[m, D] continuations (-1 after a document's end) -> the `max_nodes` most frequent trie nodes."""
    if max_nodes < 0 or min_count < 1:
        raise ValueError(f"need max_nodes >= 0 and min_count >= 1; got {max_nodes} and {min_count}")
    rows = conts[conts[:, 0] >= 0] if conts.size else conts
    m = int(rows.shape[0]) if rows.ndim == 2 else 0
    if m == 0 or max_nodes == 0:
        return empty_tree(match_length)
    rows = rows[np.lexsort(rows.T[::-1])]            # lexicographic row order: equal prefixes are adjacent
    depth = rows.shape[1]
    # first[j, d]: row j starts a new run of equal prefixes rows[:, :d + 1] (a trie node, when ok)
    differs = np.logical_or.accumulate(rows[1:] != rows[:-1], axis=1)              # [m - 1, D]
    first = np.concatenate([np.ones((1, depth), dtype=bool), differs])               # [m, D]
    ok = rows >= 0                                                                   # [m, D]
    # runs, depth by depth (depth-major: parents before children), with a sentinel ending each depth
    grid = np.ones((depth, m + 1), dtype=bool)
    grid[:, :m] = first.T
    starts = np.flatnonzero(grid)
    sizes = np.diff(starts)                                                          # run lengths
    d, j = np.divmod(starts[:-1], m + 1)
    node = (j < m)
    node[node] = ok[j[node], d[node]]                # a run of rows that ended is no node
    d, j, cnt = d[node], j[node], sizes[node].astype(np.int64)
    n_nodes = int(cnt.size)
    # every row's node at each depth: nodes are numbered in the same depth-major order
    node_of = (np.cumsum((first & ok).T.ravel()) - 1).reshape(depth, m)               # [D, m]
    par = np.where(d > 0, node_of[np.maximum(d - 1, 0), j], -1)
    tok, dep = rows[j, d], d + 1
    parent_count = np.where(par >= 0, cnt[np.maximum(par, 0)], m)
    rank = np.lexsort((dep, -cnt))                     # most occurrences first, then shallower first
    kept = np.sort(rank[:max_nodes])
    kept = kept[cnt[kept] >= min_count]
    new_index = np.full(n_nodes, -1, dtype=np.int64)
    new_index[kept] = np.arange(kept.size)
    kept_par = par[kept]
    kept_par = np.where(kept_par >= 0, new_index[np.maximum(kept_par, 0)], -1)
    return RetrievedTree(tok[kept], kept_par, dep[kept], cnt[kept] / parent_count[kept], cnt[kept],
                         match_length, m)
