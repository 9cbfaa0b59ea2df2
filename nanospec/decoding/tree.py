"""Draft-tree data and pure tensor functions: EAGLE-2 reranking, tree masks, positions, paths.

A tree has T nodes; node 0 is the root (the last token the target emitted, not yet in its
cache). `parents[i] < i` for every non-root node (parents before children), `parents[0] = -1`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor     # [T] long, token id per node (node 0 = root)
    parents: torch.Tensor    # [T] long, parent node index, -1 for the root
    depths: torch.Tensor     # [T] long, 0 for the root
    scores: torch.Tensor     # [T] float, cumulative draft log-prob (0 for the root)
    in_active: torch.Tensor  # [T] bool, token was in the drafter's active set when drafted
    sources: torch.Tensor | None = None  # [T] long, copy_branch.ROOT/HEAD/COPY/BOTH/PAD; None = root + head
    ancestors: torch.Tensor | None = None  # [T, T] bool, ancestor_mask(parents); made once per tree
    enabled: torch.Tensor | None = None  # [T] bool, nodes the draft budget kept (fixed shape); None = all
    copy_match: torch.Tensor | None = None  # [] long, the copy chain's match length (copy_branch.match_length)
    retrieved_prob: torch.Tensor | None = None  # [T] float, retrieval's count / parent's count (0: not proposed)
    retrieved_match: torch.Tensor | None = None  # [] long, the retrieval lookup's match length

    def __post_init__(self) -> None:
        # the verification mask, the copy chain's merge and acceptance all read it: build it once
        if self.ancestors is None:
            self.ancestors = ancestor_mask(self.parents)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[T] parents -> [T, T] bool, mask[i, j] = j is i or an ancestor of i.

    Transitive closure by repeated squaring of (I + parent edges): log2(T) small matmuls built
    from comparisons of index tensors, no data-dependent loop and no value written from the
    host, so nothing syncs to the host.
    """
    t = parents.shape[0]
    idx = torch.arange(t, device=parents.device)
    up = torch.where(parents >= 0, parents, idx)                       # the root points at itself
    reach = ((idx[:, None] == idx[None, :]) | (up[:, None] == idx[None, :])).float()  # [T, T] I + edges
    for _ in range(max(1, (t - 1).bit_length())):
        reach = ((reach @ reach) > 0).float()
    return reach > 0


def depths_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each node (root = 0), from the ancestor mask's row sums."""
    return ancestor_mask(parents).sum(dim=1) - 1


def tree_attention_mask(ancestors: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[T, T] ancestor mask -> [1, 1, T, prefix_len + T] bool: each node sees the whole cached
    prefix and its ancestors."""
    t = ancestors.shape[0]
    prefix = torch.ones(t, prefix_len, dtype=torch.bool, device=ancestors.device)
    return torch.cat([prefix, ancestors], dim=1)[None, None]


def tree_position_ids(depths: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[1, T]: a node at depth d sits at sequence position prefix_len + d."""
    return (depths + prefix_len)[None]


def root_to_leaf_paths(parents: torch.Tensor) -> list[list[int]]:
    """Every root-to-leaf path as node indices, leaves in index order."""
    par = parents.tolist()
    has_child = set(p for p in par if p >= 0)
    paths = []
    for leaf in range(len(par)):
        if leaf in has_child:
            continue
        path = [leaf]
        while par[path[-1]] >= 0:
            path.append(par[path[-1]])
        paths.append(path[::-1])
    return paths


def children_lists(parents: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def select_tree(
    cand_tokens: torch.Tensor,
    cand_parents: torch.Tensor,
    cand_scores: torch.Tensor,
    cand_in_active: torch.Tensor,
    root_token: torch.Tensor | int,
    root_in_active: torch.Tensor | bool,
    n_keep: int,
) -> DraftTree:
    """EAGLE-2 rerank: keep the `n_keep` best candidates by cumulative log-prob and build the tree.

    `root_token` is best a [1] tensor on the candidates' device (an int costs a host->device copy).
    Candidates are given in expansion order (each candidate's parent comes earlier), with
    `cand_parents[i] = -1` for children of the root, else the candidate index of the parent.
    A child's score never exceeds its parent's, and a stable sort keeps earlier (shallower)
    candidates first on ties, so every kept node's parent is kept too.
    """
    n = cand_tokens.shape[0]
    n_keep = min(n_keep, n)
    order = torch.sort(cand_scores, descending=True, stable=True).indices[:n_keep]
    kept = torch.sort(order).values  # expansion order => parents before children
    # Map candidate index -> tree node index (root is node 0).
    remap = torch.full((n + 1,), -1, dtype=torch.long, device=cand_tokens.device)
    remap[kept] = torch.arange(1, n_keep + 1, device=cand_tokens.device)
    par = cand_parents[kept]
    # (never -1: the sort above keeps every kept node's parent; checking would cost a host sync)
    node_par = torch.where(par >= 0, remap[par.clamp(min=0)], torch.zeros_like(par))
    dev = cand_tokens.device
    parents = torch.cat([torch.full((1,), -1, dtype=node_par.dtype, device=dev), node_par])
    root = torch.as_tensor(root_token, dtype=cand_tokens.dtype, device=dev).reshape(1)
    tokens = torch.cat([root, cand_tokens[kept]])
    scores = torch.cat([torch.zeros(1, device=dev, dtype=cand_scores.dtype), cand_scores[kept]])
    root_flag = torch.as_tensor(root_in_active, dtype=torch.bool, device=dev).reshape(1)
    in_active = torch.cat([root_flag, cand_in_active[kept]])
    anc = ancestor_mask(parents)
    return DraftTree(tokens, parents, anc.sum(dim=1) - 1, scores, in_active, ancestors=anc)


def keep_nodes(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The tree without the nodes `keep` (bool, one per node) leaves out, parents re-indexed; the
    kept set must be ancestor-closed (the copy chain's PAD nodes, which have no children, and the
    nodes a draft budget prunes are). Its boolean mask reads the tensor: a CPU's path only, which
    is why an accelerator keeps the fixed shape and disables nodes instead."""
    if bool(keep.all()):
        return tree
    new_index = torch.cumsum(keep.to(torch.long), 0) - 1
    parents = tree.parents[keep]
    parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], parents)
    return DraftTree(tokens=tree.tokens[keep], parents=parents, depths=tree.depths[keep],
                     scores=tree.scores[keep], in_active=tree.in_active[keep],
                     sources=tree.sources[keep] if tree.sources is not None else None,
                     ancestors=tree.ancestors[keep][:, keep], copy_match=tree.copy_match,
                     retrieved_prob=tree.retrieved_prob[keep] if tree.retrieved_prob is not None else None,
                     retrieved_match=tree.retrieved_match)
