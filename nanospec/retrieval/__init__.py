"""Drafts retrieved from the target's own past answers (issue 49, part 2).

A suffix-array datastore of token sequences (`store.SuffixStore`), a lookup that turns the longest
match of the recent context into a count-weighted draft tree (`index.RetrievalIndex`,
`draft.RetrievedTree`), one-file save/load (`storage`), and two commands: `build` (the store from
the answer chunks in train_data/) and `bench` (lookup time and match lengths on held-out answers).
Runtime modules import numpy only; the commands read the chunks through `nanospec.training`.
"""

from nanospec.retrieval.draft import RetrievedTree, continuation_tree
from nanospec.retrieval.index import LookupSettings, RetrievalIndex
from nanospec.retrieval.storage import load_store, save_store
from nanospec.retrieval.store import Match, SuffixStore
from nanospec.retrieval.suffix_array import suffix_array

__all__ = ["LookupSettings", "Match", "RetrievalIndex", "RetrievedTree", "SuffixStore", "continuation_tree",
           "load_store", "save_store", "suffix_array"]
