"""The context-copy branch: prompt-lookup continuations as one extra chain of the draft tree.

Prompt lookup (transformers' `prompt_lookup_num_tokens`) copies what followed the last matching
n-gram of the context. Here that copied continuation of up to N tokens joins the drafter's tree
as one more chain rooted at the root; where its first tokens already are a path of the tree, it
continues from that path's end instead of repeating it. The target verifies the whole tree in
the same forward, so the output stays the target's (a deterministic extra child is one more
candidate for the same acceptance rules).

Everything here runs on the model's device with fixed shapes, so nothing syncs to the host:

    lookup_continuation(context, N, max_ngram) -> CopyChain   the copied continuation, [N] + a length
    merge_copy_chain(tree, chain, in_active) -> DraftTree     the tree with N more nodes (T + N)
    drop_pad_nodes(tree) -> DraftTree                         without its PAD nodes (CPU only)
    CopyBranch                                                the per-request state the engine holds

The merged tree always has T + N nodes (on a CPU, the engine then drops the PAD nodes: see
`drop_pad_nodes`). Chain positions that are already in the tree, or that
the lookup could not fill, become PAD nodes: duplicates of node 1 under the root. Both acceptance
rules try children in index order, so a PAD node (a later duplicate of an earlier sibling) is
never accepted (greedy takes the first match; rejection sampling has set p(x) = 0 by then); the
engine drops PAD nodes from the step's event.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanospec.timing import PhaseTimer
from nanospec.decoding.tree import DraftTree, keep_nodes

# where a tree node came from (DraftTree.sources, StepEvent.tree_sources)
ROOT, HEAD, COPY, BOTH, PAD, RETRIEVED = 0, 1, 2, 3, 4, 5  # RETRIEVED: retrieved_branch.py's alone
SOURCE_NAMES = ("root", "head", "copy", "both", "pad", "retrieved")
DEFAULT_MAX_NGRAM = 2  # transformers' default max_matching_ngram_size


MATCH_CAP = 8  # context tokens compared when measuring how long a copy's match is


@dataclass
class CopyChain:
    tokens: torch.Tensor  # [N] long, the copied continuation (positions >= length are filler)
    length: torch.Tensor  # [] long, valid tokens in `tokens` (0 = no match)
    match: torch.Tensor | None = None  # [] long, how many context tokens the copied place matches (<= MATCH_CAP)


def lookup_continuation(context: torch.Tensor, n_tokens: int, max_ngram: int = DEFAULT_MAX_NGRAM) -> CopyChain:
    """What followed the earliest earlier occurrence of the context's last n-gram, longest n-gram first.

    Same choice as transformers' prompt lookup: n-gram sizes from `max_ngram` down to 1; for the
    largest size with a match, the earliest match whose continuation is non-empty; up to
    `n_tokens` tokens, cut at the end of the context. Tensor ops only: no host sync.
    """
    if n_tokens < 1 or max_ngram < 1:
        raise ValueError(f"n_tokens and max_ngram must be >= 1; got {n_tokens} and {max_ngram}")
    n, dev = int(context.shape[0]), context.device
    start = torch.zeros((), dtype=torch.long, device=dev)
    found = torch.zeros((), dtype=torch.bool, device=dev)
    for g in range(1, min(max_ngram, n - 1) + 1):  # larger g later, so it overrides
        # windows over context[:-1] only: each has a continuation inside the context
        windows = context[:-1].unfold(0, g, 1)                               # [n - g, g]
        hit = (windows == context[n - g:]).all(dim=1)                        # [n - g]
        first = torch.argmax(hit.to(torch.uint8))                            # earliest hit (0 if none)
        any_hit = hit.any()
        start = torch.where(any_hit, first + g, start)
        found = found | any_hit
    length = torch.where(found, (n - start).clamp(max=n_tokens), torch.zeros_like(start))
    idx = (start + torch.arange(n_tokens, device=dev)).clamp(max=max(n - 1, 0))
    return CopyChain(tokens=context[idx], length=length, match=match_length(context, start, found))


def match_length(context: torch.Tensor, start: torch.Tensor, found: torch.Tensor) -> torch.Tensor:
    """[] long: how many tokens before `start` equal the context's last tokens, read backwards (at
    least the matched n-gram, at most `MATCH_CAP`; 0 without a match). A longer match is a copy
    more likely to go on as the context did: the draft budget prices copied nodes by it."""
    n, dev = int(context.shape[0]), context.device
    j = torch.arange(MATCH_CAP, device=dev)
    mine = start - 1 - j                                                     # backwards from the match's end
    last = n - 1 - j                                                         # backwards from the context's end
    same = (context[mine.clamp(min=0)] == context[last.clamp(min=0)]) & (mine >= 0) & (mine < last)
    return torch.where(found, torch.cumprod(same.to(torch.long), 0).sum(), torch.zeros_like(start))


class CopyBranch:
    """Per request: the tokens so far (prompt, everything emitted, the root last) in a device
    buffer, and the chain it adds to each step's tree. What the engine calls:

        begin(prompt_ids, first_token)      at prefill
        extend(tree, vocab, timer, fixed)   after drafting: the tree with the copy chain merged in
        append(tokens)                      after verification: the step's accepted tokens + bonus

    Sizes are host integers the engine already knows, so appending and slicing never sync.
    """

    def __init__(self, n_tokens: int, max_ngram: int = DEFAULT_MAX_NGRAM, device: torch.device | str = "cpu",
                 capacity: int = 1024):
        if n_tokens < 1 or max_ngram < 1:
            raise ValueError(f"n_tokens and max_ngram must be >= 1; got {n_tokens} and {max_ngram}")
        self.n_tokens, self.max_ngram = n_tokens, max_ngram
        self.buffer = torch.zeros(capacity, dtype=torch.long, device=device)
        self.length = 0

    def begin(self, prompt_ids: torch.Tensor, first_token: int) -> None:
        """Prompt ids [n] and the first generated token (the first root)."""
        self.length = 0
        self.append(prompt_ids.reshape(-1))
        self.append(torch.tensor([first_token], device=self.buffer.device))

    def append(self, tokens: torch.Tensor) -> None:
        """Tokens [m] emitted by a step (accepted drafts, then the bonus, which is the next root)."""
        m = int(tokens.shape[0])
        if self.length + m > self.buffer.shape[0]:
            grown = torch.zeros(2 * (self.length + m), dtype=torch.long, device=self.buffer.device)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        self.buffer[self.length: self.length + m] = tokens
        self.length += m

    @property
    def tokens(self) -> torch.Tensor:
        return self.buffer[: self.length]

    def lookup(self) -> CopyChain:
        return lookup_continuation(self.tokens, self.n_tokens, self.max_ngram)

    def extend(self, tree: DraftTree, vocab, timer: PhaseTimer, fixed_shape: bool = False) -> DraftTree:
        """The tree with the chain merged in. A CPU pays for every verified node and reads its own
        memory for free, so there the PAD slots are dropped unless `fixed_shape`; any other device
        always keeps the fixed shape (dropping them would sync the host)."""
        with timer.phase("copy_lookup"):
            chain = self.lookup()
            merged = merge_copy_chain(tree, chain, vocab.contains(chain.tokens))
            if fixed_shape or merged.tokens.device.type != "cpu":
                return merged
            return drop_pad_nodes(merged)


def merge_copy_chain(tree: DraftTree, chain: CopyChain, chain_in_active: torch.Tensor) -> DraftTree:
    """The drafter's tree [T] plus the copy chain as up to N more nodes: [T + N], parents first.

    A head node whose whole root path spells the chain's first tokens is marked BOTH; the chain
    goes on from the deepest such node. Unused chain slots become PAD (see the module docstring).
    `chain_in_active` [N]: whether each copied token is in the drafter's active set (coverage).
    """
    t, n, dev = len(tree), int(chain.tokens.shape[0]), tree.tokens.device
    if t < 2:
        raise ValueError("the copy branch needs a drafted tree with at least one node besides the root")
    depth = tree.depths
    # node i matches when its token is the chain's token at its depth (the root always matches)
    chain_at_depth = chain.tokens[(depth - 1).clamp(0, n - 1)]
    eq = (tree.tokens == chain_at_depth) & (depth >= 1) & (depth <= chain.length)
    eq = eq | (depth == 0)
    # on_chain[i]: every node on i's root path matches, i.e. that path spells the chain's prefix
    on_chain = ~(tree.ancestors & ~eq[None, :]).any(dim=1)                  # [T]
    j = torch.arange(n, device=dev)
    at = on_chain[None, :] & (depth[None, :] == (j + 1)[:, None])            # [N, T]
    hit = at.any(dim=1)                                                      # [N] prefix of Trues
    node = torch.argmax(at.to(torch.uint8), dim=1)                           # [N] its node (0 if none)
    real = ~hit & (j < chain.length)                                         # [N] a new chain node
    one = torch.ones(1, dtype=torch.bool, device=dev)
    prev_hit = torch.cat([one, hit[:-1]])                                    # j = 0 hangs off the root
    prev_node = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), node[:-1]])
    parent = torch.where(prev_hit, prev_node, t + j - 1)
    tokens = torch.where(real, chain.tokens, tree.tokens[1])
    parents = torch.where(real, parent, torch.zeros_like(parent))
    depths = torch.where(real, j + 1, torch.ones_like(j))
    scores = torch.where(real, torch.zeros_like(tree.scores[1]), tree.scores[1]).expand(n)
    in_active = torch.where(real, chain_in_active.to(torch.bool), tree.in_active[1])
    head_src = torch.where(depth == 0, ROOT, torch.where(on_chain, BOTH, HEAD))
    sources = torch.cat([head_src, torch.where(real, COPY, PAD)])
    # the merged tree's ancestor mask from the drafted tree's, without a second closure: real chain
    # nodes are consecutive and hang below `attach` (the deepest node already on the chain, or the
    # root); a PAD node sits under the root and is nobody's ancestor
    n_hit = hit.sum()
    attach = torch.where(n_hit > 0, node.gather(0, (n_hit - 1).clamp(min=0).reshape(1))[0], 0)
    upper = torch.where(real[:, None], tree.ancestors[attach][None, :], tree.ancestors[0][None, :])  # [N, T]
    chain_anc = (j[:, None] == j[None, :]) | (real[:, None] & real[None, :] & (j[None, :] < j[:, None]))
    ancestors = torch.cat([torch.cat([tree.ancestors, torch.zeros_like(upper.T)], dim=1),
                           torch.cat([upper, chain_anc], dim=1)])                   # [T + N, T + N]
    return DraftTree(tokens=torch.cat([tree.tokens, tokens]), parents=torch.cat([tree.parents, parents]),
                     depths=torch.cat([tree.depths, depths]), scores=torch.cat([tree.scores, scores]),
                     in_active=torch.cat([tree.in_active, in_active]), sources=sources, ancestors=ancestors,
                     copy_match=chain.match)


def drop_pad_nodes(tree: DraftTree) -> DraftTree:
    """The merged tree without its PAD nodes (CPU only, see `tree.keep_nodes`). PAD nodes have no
    children, so every kept node keeps its parent."""
    return keep_nodes(tree, tree.sources != PAD)


def drop_padding(nodes: dict[str, list], path: list[int]) -> tuple[dict[str, list], list[int]]:
    """Host side, for the step's event: remove PAD nodes from per-node lists and re-index.

    `nodes` maps names to per-node lists and must hold "sources" and "parents"; `path` (node
    indices) never contains a PAD node, and no node has a PAD parent.
    """
    keep = [i for i, s in enumerate(nodes["sources"]) if s != PAD]
    if len(keep) == len(nodes["sources"]):
        return nodes, path
    new_index = {old: new for new, old in enumerate(keep)}
    out = {name: [values[i] for i in keep] for name, values in nodes.items()}
    out["parents"] = [new_index[p] if p >= 0 else -1 for p in out["parents"]]
    return out, [new_index[i] for i in path]
