"""The lossless acceptance rules as tensor functions: nothing here reads a value on the host.

Both rules first decide, for every tree node n at once, which of its children the walk would
take if it reached n (`chosen[n]`, T = none); the accepted path is then the chain of chosen
children from the root. Deciding every node in parallel gives the same result as walking the
tree, because each node's decision uses only its own inputs (its logits, its uniforms), and the
walk reads the decisions of the nodes it visits only.

    greedy:   chosen[n] = first child whose token equals the target's argmax at n
    sampling: try n's children in index order, accept child x with probability
              p_n(x) / (mass left), on rejection remove p_n(x) (SpecInfer / EAGLE rule);
              the bonus token is drawn from what is left at the path's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanospec.decoding.tree import ancestor_mask


@dataclass
class DevicePath:
    nodes: torch.Tensor  # [T] long: the accepted path's nodes first (root first), then the others
    length: torch.Tensor  # [1] long: nodes on the path (>= 1, the root)
    bonus: torch.Tensor  # [1] long: the target's token after the path's last node


def sample_token(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [q, V] (rows need not be normalised), u [q] uniform in [0, 1) -> ids [q]."""
    cdf = probs.double().cumsum(-1)                                          # [q, V]
    x = (u.double() * cdf[:, -1])[:, None]                                   # [q, 1]
    # the first index whose cdf exceeds x: always a token of positive probability
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


def greedy_path(tokens: torch.Tensor, parents: torch.Tensor, argmax: torch.Tensor,
                ancestors: torch.Tensor | None = None, enabled: torch.Tensor | None = None) -> DevicePath:
    """Longest path whose every token equals the target's argmax at its parent; bonus = argmax at its end.
    `ancestors`: the tree's [T, T] ancestor mask when the caller has it (made from `parents` if not).
    `enabled` [T] bool: nodes the draft budget kept (budget.py); a disabled node is never accepted."""
    par = parents.clamp(min=0)
    accept = (tokens == argmax[par]) & (parents >= 0)                       # [T]
    if enabled is not None:
        accept = accept & enabled
    nodes, length = _path(parents, _first_accepted_child(accept, par), ancestors)
    return DevicePath(nodes, length, argmax.gather(0, _last(nodes, length)))


def sample_path(tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor,
                generator: torch.Generator | None, ancestors: torch.Tensor | None = None,
                enabled: torch.Tensor | None = None) -> DevicePath:
    """Multi-candidate rejection at every node at once; p [T, V] are the target's warped probabilities.
    A node not `enabled` (pruned by the draft budget) is as if absent: never tried, removes no mass."""
    t, dev = tokens.shape[0], tokens.device
    idx = torch.arange(t, device=dev)
    par = parents.clamp(min=0)
    child = parents >= 0
    if enabled is not None:
        child = child & enabled
    # p_n(x) of each child x at its parent n; a token repeated among siblings counts once (the
    # first copy's rejection already removed its mass)
    px = p[par, tokens] * child                                              # [T]
    sib = (parents[:, None] == parents[None, :]) & child[None, :] & (idx[None, :] < idx[:, None])  # [T, T]
    dup = (sib & (tokens[:, None] == tokens[None, :])).any(1)
    px = px.masked_fill(dup, 0.0)
    before = (sib * px[None, :]).sum(1)                                      # mass removed by earlier siblings
    left = p.sum(-1)[par] - before
    u = torch.rand(t + 1, generator=generator, device=dev)
    accept = child & (u[:t] * left < px)
    nodes, length = _path(parents, _first_accepted_child(accept, par), ancestors)
    last = _last(nodes, length)
    # bonus: a draw from p at the last node without its children's tokens (all were rejected)
    p_last = p.index_select(0, last)                                         # [1, V]
    tried = torch.zeros(p.shape[-1], device=dev).index_add_(0, tokens, ((parents == last) & child).float()) > 0
    rest = p_last.masked_fill(tried, 0.0)
    rest = torch.where(rest.sum() > 0, rest, p_last)  # an empty remainder only comes from round-off
    return DevicePath(nodes, length, sample_token(rest, u[t:]))


def _first_accepted_child(accept: torch.Tensor, par: torch.Tensor) -> torch.Tensor:
    """[T]: for each node, the lowest-index accepted child, or T when none is."""
    t = accept.shape[0]
    idx = torch.arange(t, device=accept.device)
    first = torch.full((t,), t, dtype=torch.long, device=accept.device)
    return first.scatter_reduce(0, par, torch.where(accept, idx, t), reduce="amin")


def _path(parents: torch.Tensor, chosen: torch.Tensor,
          ancestors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes whose every ancestor (and themselves) was chosen by its parent: one chain from the root."""
    t = parents.shape[0]
    idx = torch.arange(t, device=parents.device)
    ok = (parents < 0) | (chosen[parents.clamp(min=0)] == idx)             # [T]
    anc = ancestors if ancestors is not None else ancestor_mask(parents)    # [T, T]
    on_path = ~(anc & ~ok[None, :]).any(1)                                  # [T]
    # parents come before children, so index order along the chain is root-to-leaf order
    nodes = torch.sort((~on_path).to(torch.int8), stable=True).indices
    return nodes, on_path.sum().reshape(1)


def _last(nodes: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    return nodes.gather(0, length - 1)                                       # [1]
