"""What a drafter queries: the shipped store plus this app's own finished answers, kept in memory.

    index = RetrievalIndex(load_store(path, tokenizer_hash), LookupSettings())
    tree = index.lookup(context_ids)       # a RetrievedTree (empty when nothing matched)
    index.add_document(prompt_and_answer)  # after a request finishes

The in-memory part is a second, small `SuffixStore` rebuilt from its documents on every addition
(it holds at most `memory_tokens` tokens, oldest documents dropped first; a rebuild at the 64k-token
cap took ~25 ms here).
The new store replaces the old one in one assignment, so a lookup running meanwhile on another
thread sees either. A lookup takes the longer of the two stores' matches; on equal lengths the
occurrences of both are counted together.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nanospec.retrieval.draft import RetrievedTree, continuation_tree, empty_tree
from nanospec.retrieval.store import SuffixStore


@dataclass
class LookupSettings:
    max_context: int = 16       # context tokens matched at most
    min_match: int = 2          # shortest match that proposes anything
    depth: int = 6              # continuation tokens read per occurrence
    max_nodes: int = 16         # nodes in the returned tree
    max_occurrences: int = 256  # occurrences counted at most (evenly spread over the match's range)
    min_count: int = 1          # nodes seen fewer times are left out

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_context:
            raise ValueError(f"need 1 <= min_match <= max_context; got {self.min_match} and {self.max_context}")
        if self.depth < 1 or self.max_nodes < 0 or self.max_occurrences < 1 or self.min_count < 1:
            raise ValueError("depth, max_occurrences and min_count must be >= 1 and max_nodes >= 0")


class RetrievalIndex:
    def __init__(self, store: SuffixStore | None, settings: LookupSettings | None = None,
                 memory_tokens: int = 65536):
        self.store = store
        self.settings = settings or LookupSettings()
        self.memory_tokens = memory_tokens
        self._docs: deque[np.ndarray] = deque()
        self.memory: SuffixStore | None = None
        self._adding = threading.Lock()   # additions from several request threads take turns

    def add_document(self, ids: Sequence[int] | np.ndarray) -> None:
        """Index one finished request's ids (prompt + answer) in memory; the oldest go past the cap."""
        doc = np.asarray(ids, dtype=np.int64).reshape(-1)
        if doc.size < 2:
            return
        dtype = self.store.tokens.dtype if self.store is not None else None
        with self._adding:
            self._docs.append(doc[-self.memory_tokens:])
            while sum(d.size + 1 for d in self._docs) > self.memory_tokens and len(self._docs) > 1:
                self._docs.popleft()
            self.memory = SuffixStore.from_documents(list(self._docs), dtype=dtype)

    def lookup(self, context: Sequence[int] | np.ndarray, settings: LookupSettings | None = None) -> RetrievedTree:
        """The continuation tree of the context's longest match; `settings`: this lookup's (default: the index's)."""
        s = settings or self.settings
        found = []
        for store in (self.store, self.memory):
            if store is not None:
                match = store.longest_match(context, s.max_context, s.min_match)
                if match.length:
                    found.append((store, match))
        if not found:
            return empty_tree()
        best = max(m.length for _, m in found)
        conts = [st.continuations(st.continuation_starts(m, s.max_occurrences), s.depth)
                 for st, m in found if m.length == best]
        return continuation_tree(np.concatenate(conts), s.max_nodes, s.min_count, best)
