"""The retrieved branch: continuations looked up in a store of the target's own past answers, as
more nodes of the draft tree (issue 49, part 2; the store and its lookup are `nanospec.retrieval`).

Each step the longest match (at least `retrieval_min_match` tokens, at most the last `CONTEXT`) of
the recent context in the store proposes what followed it there, as a count-weighted trie of up to
N nodes (`RetrievalIndex.lookup`). The trie hangs below the root and is merged depth by depth
into the step's tree (after the copy chain): a retrieved node whose token already sits under its
(merged) parent is not repeated, it only records its retrieval probability there; the others are
appended with their parents re-mapped. The target verifies the whole tree in one forward, so the
output stays the target's: a retrieved node is one more deterministic candidate for the same
acceptance rules, exactly like a copied one.

Host and device: the lookup reads host ids only (the prompt, then each step's accepted tokens and
bonus, which the step's one read has already brought to the host), so it adds no device->host read.
Its result goes to the device in one packed host->device copy (from pinned memory, asynchronous, on
CUDA), and the merge is tensor code of a fixed shape: the merged tree always has T + N nodes, the
unused slots being PAD nodes (duplicates of node 1 under the root, never accepted: see
copy_branch.py). A CPU without `fixed_shape` merges on host lists instead and makes no PAD slots
(`merge_retrieved_on_host`: the same tree as the tensor merge with its PAD slots dropped).

    RetrievedBranch(index, n_nodes, depth, min_match, device)   per request:
        begin(prompt_ids, first_token)       at prefill (host ids)
        extend(tree, vocab, timer, fixed)    after the copy chain: the tree with the branch merged in
                                             (a CPU without a fixed shape: `merge_retrieved_on_host`)
        append(tokens)                       after verification: the step's accepted tokens + bonus (host ids)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from nanospec.decoding.copy_branch import HEAD, PAD, RETRIEVED, ROOT
from nanospec.decoding.tree import DraftTree, ancestor_mask
from nanospec.retrieval.draft import RetrievedTree
from nanospec.retrieval.index import LookupSettings, RetrievalIndex
from nanospec.retrieval.storage import load_store, tokenizer_fingerprint
from nanospec.timing import PhaseTimer

logger = logging.getLogger(__name__)

CONTEXT = 16  # context tokens matched at most (the host keeps only these)
# rows of the packed host->device copy: tokens, parents (-1: the root), depths, probs (count /
# parent's count), path probs (count / occurrences), valid, the match length (first column)
TOK, PAR, DEP, PROB, PATH, VALID, MATCH = range(7)


def load_retrieval(path: Path | str, tokenizer) -> RetrievalIndex | None:
    """The pair's retrieval index, or None (the branch stays off) with one log line when the store at
    `path` is missing, damaged or built with another tokenizer. Never raises."""
    try:
        fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
    except Exception as err:  # a tokenizer without a vocabulary: no check possible, no store either
        logger.warning("retrieval store %s skipped: no tokenizer fingerprint (%s); retrieved drafts are off", path, err)
        return None
    store = load_store(path, fingerprint, warn=logger.warning)
    return RetrievalIndex(store) if store is not None else None


def start_retrieval(index: RetrievalIndex | None, tree, prompt_ids: Sequence[int], first_token: int,
                    device: torch.device | str) -> "RetrievedBranch | None":
    """A speculative request's retrieved branch (`tree`: its TreeConfig), or None when the option is
    off (`retrieval_nodes` 0) or the engine has no store."""
    if index is None or not tree.retrieval_nodes:
        return None
    branch = RetrievedBranch(index, tree.retrieval_nodes, tree.retrieval_depth, tree.retrieval_min_match, device)
    branch.begin(prompt_ids, first_token)
    return branch


class RetrievedBranch:
    def __init__(self, index: RetrievalIndex, n_nodes: int, depth: int, min_match: int,
                 device: torch.device | str = "cpu"):
        if n_nodes < 1:
            raise ValueError(f"n_nodes must be >= 1; got {n_nodes}")
        self.index, self.n_nodes, self.depth = index, n_nodes, depth
        self.settings = LookupSettings(max_context=CONTEXT, min_match=min_match, depth=depth, max_nodes=n_nodes)
        self.device = torch.device(device)
        self.context = np.zeros(0, dtype=np.int64)
        self.last: RetrievedTree | None = None  # the last step's lookup (for inspection and tests)
        # one pinned host buffer per request: the copy never waits for the device's queue
        # (its numpy view is taken here, once: reading a tensor inside a step is what the sync rules forbid)
        pinned = self.device.type == "cuda"
        self._staging = torch.zeros((7, n_nodes), dtype=torch.float64, pin_memory=pinned)
        self._host = self._staging.numpy()

    def begin(self, prompt_ids: Sequence[int], first_token: int) -> None:
        """The prompt's host ids and the first generated token (the first root)."""
        self.context = np.zeros(0, dtype=np.int64)
        self.append([*list(prompt_ids)[-CONTEXT:], int(first_token)])

    def append(self, tokens: Sequence[int]) -> None:
        """Host ids a step emitted (accepted drafts, then the bonus, which is the next root)."""
        self.context = np.concatenate([self.context, np.asarray(tokens, dtype=np.int64)])[-CONTEXT:]

    def lookup(self) -> RetrievedTree:
        self.last = self.index.lookup(self.context, self.settings)
        return self.last

    def extend(self, tree: DraftTree, vocab, timer: PhaseTimer, fixed_shape: bool = False) -> DraftTree:
        """The tree with the retrieved trie merged in: T + N nodes with a fixed shape (any device but a
        CPU, or `fixed_shape`), else only the nodes it adds, merged on the host."""
        with timer.phase("retrieval_lookup"):
            found = self.lookup()
            if fixed_shape or self.device.type != "cpu":
                return merge_retrieved(tree, self._upload(found), self.depth, vocab)
            # a CPU reads its own memory for free: merge on host lists, without the PAD slots
            return tree if len(found) == 0 else merge_retrieved_on_host(tree, found, vocab)

    def _upload(self, found: RetrievedTree) -> torch.Tensor:
        """[7, N] float64 on the device: the lookup's nodes, packed (host data, one copy)."""
        k = len(found)
        host = self._host
        host[:] = 0.0
        host[PAR, :] = -1.0
        if k:
            host[TOK, :k], host[PAR, :k], host[DEP, :k] = found.tokens, found.parents, found.depths
            host[PROB, :k], host[PATH, :k], host[VALID, :k] = found.probs, found.path_probs, 1.0
        host[MATCH, 0] = found.match_length
        if self.device.type == "cpu":
            return self._staging.clone()  # the tree must not share the buffer the next step fills
        return self._staging.to(self.device, non_blocking=True)


def merge_retrieved(tree: DraftTree, packed: torch.Tensor, max_depth: int, vocab) -> DraftTree:
    """The tree [T] plus the retrieved trie (`packed` [7, N], see `RetrievedBranch._upload`) as N more
    nodes [T + N], parents first. Tensor code with a fixed shape: nothing reads the device."""
    t, n, dev = len(tree), int(packed.shape[1]), tree.tokens.device
    old_src, old_prob = _merge_inputs(tree)
    tok, par, dep = packed[TOK].long(), packed[PAR].long(), packed[DEP].long()
    prob, valid = packed[PROB].to(tree.scores.dtype), packed[VALID] > 0
    j = torch.arange(n, device=dev)
    mapped = torch.zeros(n, dtype=torch.long, device=dev)   # each retrieved node's index in the merged tree
    parent = torch.zeros(n, dtype=torch.long, device=dev)   # ... and its parent's
    matched = torch.zeros(n, dtype=torch.bool, device=dev)  # it already is a node of the tree
    for d in range(1, max_depth + 1):  # depth by depth: a parent is mapped before its children
        at = valid & (dep == d)
        up = torch.where(par >= 0, mapped[par.clamp(min=0)], torch.zeros_like(par))
        same = (tree.tokens[None, :] == tok[:, None]) & (tree.parents[None, :] == up[:, None])  # [N, T]
        hit = same.any(dim=1)
        first = torch.argmax(same.to(torch.uint8), dim=1)   # the earliest such node
        mapped = torch.where(at, torch.where(hit, first, t + j), mapped)
        parent = torch.where(at, up, parent)
        matched = matched | (at & hit)
    real = valid & ~matched                                                  # [N] a new node
    in_active = torch.where(real, vocab.contains(tok).to(torch.bool), tree.in_active[1])
    scores = torch.where(real, torch.log(packed[PATH].clamp(min=1e-9)).to(tree.scores.dtype), tree.scores[1])
    # a node of the tree that retrieval also proposed keeps its label and records its retrieval probability
    hit_prob = torch.zeros_like(old_prob).scatter_reduce(0, torch.where(matched, mapped, 0),
                                                         torch.where(matched, prob, 0.0), reduce="amax")
    parents = torch.cat([tree.parents, torch.where(real, parent, torch.zeros_like(parent))])
    return DraftTree(tokens=torch.cat([tree.tokens, torch.where(real, tok, tree.tokens[1])]), parents=parents,
                     depths=torch.cat([tree.depths, torch.where(real, dep, torch.ones_like(dep))]),
                     scores=torch.cat([tree.scores, scores]), in_active=torch.cat([tree.in_active, in_active]),
                     sources=torch.cat([old_src, torch.where(real, RETRIEVED, PAD)]),
                     ancestors=ancestor_mask(parents), copy_match=tree.copy_match,
                     retrieved_prob=torch.cat([torch.maximum(old_prob, hit_prob), torch.where(real, prob, 0.0)]),
                     retrieved_match=packed[MATCH, 0].long())


def merge_retrieved_on_host(tree: DraftTree, found: RetrievedTree, vocab) -> DraftTree:
    """A CPU's merge (no fixed shape): the tree `drop_pad_nodes(merge_retrieved(...))` gives, made from
    host lists instead of a hundred small tensor ops (about a millisecond a step on 2 CPU cores).
    Nodes come in the lookup's order (parents first); one whose token already sits under its (merged)
    parent records its probability there, the others are appended."""
    t = len(tree)
    old_src, old_prob = _merge_inputs(tree)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    at: dict[tuple[int, int], int] = {}
    for i in range(t - 1, 0, -1):  # the earliest node wins, as merge_retrieved's argmax
        at[(parents[i], tokens[i])] = i
    mapped: list[int] = []                      # each retrieved node's index in the merged tree
    new: list[int] = []                         # the retrieved nodes appended (their index in `found`)
    new_parents: list[int] = []
    hits: dict[int, int] = {}                   # tree node -> a retrieved node that matched it
    for j, (tok, par) in enumerate(zip(found.tokens.tolist(), found.parents.tolist())):
        up = mapped[par] if par >= 0 else 0
        node = at.get((up, tok)) if up < t else None
        if node is None:
            mapped.append(t + len(new))
            new.append(j)
            new_parents.append(up)
        else:
            mapped.append(node)
            hits.setdefault(node, j)
    dtype, dev = tree.scores.dtype, tree.tokens.device
    prob = torch.from_numpy(np.asarray(found.probs, dtype=np.float64)).to(dtype)
    rp = old_prob.clone()
    for node, j in hits.items():
        rp[node] = torch.maximum(rp[node], prob[j])
    sel = np.asarray(new, dtype=np.int64)
    new_tokens = torch.from_numpy(np.asarray(found.tokens[sel], dtype=np.int64)).to(dev)
    n = len(new)
    anc = torch.zeros(t + n, t + n, dtype=torch.bool)
    anc[:t, :t] = tree.ancestors
    for k, par in enumerate(new_parents):
        anc[t + k] = anc[par]
        anc[t + k, t + k] = True
    path = torch.from_numpy(np.asarray(found.path_probs[sel], dtype=np.float64))
    return DraftTree(tokens=torch.cat([tree.tokens, new_tokens]),
                     parents=torch.cat([tree.parents, torch.tensor(new_parents, dtype=tree.parents.dtype)]),
                     depths=torch.cat([tree.depths, torch.from_numpy(np.asarray(found.depths[sel], dtype=np.int64))]),
                     scores=torch.cat([tree.scores, torch.log(path.clamp(min=1e-9)).to(dtype)]),
                     in_active=torch.cat([tree.in_active, vocab.contains(new_tokens).to(torch.bool)]),
                     sources=torch.cat([old_src, torch.full((n,), RETRIEVED, dtype=old_src.dtype)]),
                     ancestors=anc.to(dev), copy_match=tree.copy_match,
                     retrieved_prob=torch.cat([rp, prob[torch.from_numpy(sel)]]),
                     retrieved_match=torch.tensor(found.match_length, dtype=torch.long))


def _merge_inputs(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """Both merges: the drafted tree's node sources and retrieval probabilities (defaults when it has none)."""
    if len(tree) < 2:
        raise ValueError("the retrieved branch needs a drafted tree with at least one node besides the root")
    sources = tree.sources if tree.sources is not None else torch.where(tree.depths > 0, HEAD, ROOT)
    prob = tree.retrieved_prob if tree.retrieved_prob is not None else torch.zeros_like(tree.scores)
    return sources, prob
