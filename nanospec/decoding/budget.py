"""Cost-aware speculation: each step verifies only the draft nodes whose expected gain pays for them.

A tree method verifies every node it drafted, whatever the drafter's confidence. Where the head
is unsure, a 22-node verification costs more than the tokens it returns. The budget keeps, per
step, the nodes worth verifying on this device:

    p_i   the chance that node i is accepted (its whole root path is): the product of calibrated
          conditional acceptance along the path (below);
    c(n)  the target's forward time over n verified tokens, from its measured cost curve
          (`CostCurve`, every size from 1 to the largest tree, calibrated once per pair and device
          and cached);
    λ     this request's throughput so far, tokens per ms.

Maximising long-run tokens per ms means verifying the node set S that maximises
Σ_{i∈S} p_i − λ·(c(1 + |S|) − c(1)) (Dinkelbach's rule for a ratio objective: a set pays when its
expected tokens exceed what its extra time would earn at the current rate). For a set of k nodes
the best is the k likeliest, and nodes sorted by p form an ancestor-closed prefix (a child's p
never exceeds its parent's), so the budget takes the prefix length k with the largest net gain.
The curve is measured at every size, not assumed to be a line: where a few more tokens cost less
(or more) than the average, the budget prices them as measured (the closest non-decreasing fit to
the medians, since neighbouring sizes differ by noise). Node k's price is λ·(c(1 + k) − c(k)), the
tokens its share of the time would earn; the kept prefix is where the summed p most exceeds the
summed prices. The kept set may be the root alone: a plain step; after `EXPLORE_AFTER` plain steps in
a row the likeliest node is verified anyway, since the statistics learn only from verified nodes.

Calibrated acceptance, per request, by tree depth d (device tensors, no host reads):
  head nodes   q = min(1, r_d · exp(score_i − score_parent)), r_d = (accepted_d + 2) / (predicted_d + 2):
               the head's softmax corrected by how often its drafts at that depth were accepted;
  copy nodes   q = (accepted_{m,d} + 1) / (tried_{m,d} + 2): how often a copied token at that depth was,
               counted apart by how long the copy's match was (m: 1, 2, 3-4 or 5+ context tokens,
               `copy_branch.match_length`; a copy after a long match goes on as the context did more often);
  both         the larger of the two;
  retrieved    q = min(1, r_{m,d} · prob_i), r = (accepted_{m,d} + 2) / (predicted_{m,d} + 2): the store's
               count / parent's count (retrieved_branch.py) corrected by how often nodes that retrieval
               proposed alone were accepted at that depth, apart by the lookup's match length (m: <= 2, 3-4,
               5+ tokens); a node that retrieval proposed beside the head or the copy chain takes the larger
               chance, and teaches only its other source's statistics (counting those nodes, which the
               head or the copy chain also chose and which are accepted far more often, made retrieved
               nodes look likelier than they were: the budget then verified too many).
A node is "tried" when its parent was accepted; only tried nodes teach the statistics.

On a CPU the engine drops the nodes it does not keep (and the drafter stops early when no frontier
node could pay); with a fixed shape (every GPU) the tree keeps its shape and the pruned nodes are
disabled for acceptance instead, so deciding never reads a value on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanospec.decoding.copy_branch import BOTH, COPY, HEAD, PAD, RETRIEVED
from nanospec.decoding.cost_curve import CostCurve
from nanospec.decoding.tree import DraftTree

MATCH_ROWS = 4  # rows of the copy statistics, by the copy chain's match length: <= 1, 2, 3-4, 5+ tokens
RETRIEVAL_ROWS = 3  # rows of the retrieval statistics, by the lookup's match length: <= 2, 3-4, 5+ tokens


@dataclass
class BudgetFigures:
    """One step's draft-budget figures, as its `StepEvent` reports them. While the step runs the first
    two may be device tensors; the step's one host read turns them into numbers."""

    expected_tokens: float | torch.Tensor  # tokens the kept tree is expected to bring, the bonus included
    drafted_nodes: int | torch.Tensor      # nodes drafted before pruning (the copy chain's PAD slots excluded)
    price: float                           # λ times the curve's mean slope: a node's mean price (`threshold`)


class DraftBudget:
    """One request's budget: acceptance statistics on the device and its throughput on the host."""

    PRIOR_STEPS = 2.0  # weight of the curve's one-token rate in λ before the request has a history
    CARRY = 20.0  # at most this many tried nodes per depth carried over from the pair's earlier requests
    EXPLORE_AFTER = 4  # plain steps in a row after which the likeliest node is verified anyway

    def __init__(self, curve: CostCurve, max_depth: int, device: torch.device, earlier: "DraftBudget | None" = None,
                 max_nodes: int = 0):
        """`earlier`: the same engine's last budget for this method, if any: its statistics start
        this request's, scaled down to `CARRY` observations per depth so that this request's own
        acceptance soon outweighs them (how good the head and the copy chain are is the pair's,
        how well they suit this prompt is the request's). `max_nodes`: the largest tree it will see
        (its prices are copied to the device here, before any step)."""
        self.curve = curve
        self.per_token_ms = curve.per_token_ms
        d = max_depth + 1
        self.head_pred, self.head_acc = torch.zeros(d, device=device), torch.zeros(d, device=device)
        # by the copy's match length (rows) and depth, flattened: row * d + depth
        self.copy_tried = torch.zeros(MATCH_ROWS * d, device=device)
        self.copy_acc = torch.zeros(MATCH_ROWS * d, device=device)
        self.retr_pred = torch.zeros(RETRIEVAL_ROWS * d, device=device)  # summed retrieval probs of tried nodes
        self.retr_acc = torch.zeros(RETRIEVAL_ROWS * d, device=device)
        self._depths = d
        if earlier is not None and earlier.head_pred.shape == self.head_pred.shape:
            head = (self.CARRY / earlier.head_pred.clamp(min=self.CARRY)).clamp(max=1.0)
            copy = (self.CARRY / earlier.copy_tried.clamp(min=self.CARRY)).clamp(max=1.0)
            retr = (self.CARRY / earlier.retr_pred.clamp(min=self.CARRY)).clamp(max=1.0)
            self.head_pred, self.head_acc = earlier.head_pred * head, earlier.head_acc * head
            self.copy_tried, self.copy_acc = earlier.copy_tried * copy, earlier.copy_acc * copy
            self.retr_pred, self.retr_acc = earlier.retr_pred * retr, earlier.retr_acc * retr
        self.tokens = 0
        self.ms = 0.0
        self.plain_steps = 0
        self.max_depth = max_depth
        self._extra = torch.tensor(curve.extra_ms(max(max_nodes, max(curve.sizes))), device=device)

    # -- host: the request's throughput -------------------------------------------------
    @property
    def rate(self) -> float:
        """λ, tokens per ms: this request's so far, starting from one token per one-token forward."""
        w = self.PRIOR_STEPS
        return (self.tokens + w) / (self.ms + w * self.curve.one_token_ms)

    @property
    def threshold(self) -> float:
        """λ·Δc with Δc the curve's mean slope: the acceptance chance a node needs to pay for an average
        token's verification (what the drafter's early stop uses; `select` prices each size exactly)."""
        return self.rate * self.per_token_ms

    def observe(self, n_tokens: int, wall_ms: float, n_verified: int) -> None:
        """After a step: its tokens, its wall time and the tree nodes it verified (1: a plain step)."""
        self.tokens += n_tokens
        self.ms += wall_ms
        self.plain_steps = self.plain_steps + 1 if n_verified <= 1 else 0

    # -- device: acceptance chances ------------------------------------------------------
    def _ratio(self) -> torch.Tensor:
        return (self.head_acc + 2.0) / (self.head_pred + 2.0)

    def _copy_rate(self) -> torch.Tensor:
        return (self.copy_acc + 1.0) / (self.copy_tried + 2.0)

    def _raw_q(self, tree: DraftTree) -> torch.Tensor:
        par = tree.parents.clamp(min=0)
        return torch.exp((tree.scores - tree.scores[par]).clamp(max=0.0))

    def _copy_index(self, tree: DraftTree, d: torch.Tensor) -> torch.Tensor:
        """[T] each node's entry in the copy statistics: its depth in the row of the chain's match length."""
        if tree.copy_match is None:
            return d
        m = tree.copy_match
        row = (m >= 2).long() + (m >= 3).long() + (m >= 5).long()           # <= 1, 2, 3-4, 5+ tokens
        return row * self._depths + d

    def _retrieved_index(self, tree: DraftTree, d: torch.Tensor) -> torch.Tensor:
        """[T] each node's entry in the retrieval statistics: its depth in the row of the lookup's match length."""
        m = tree.retrieved_match if tree.retrieved_match is not None else torch.zeros_like(d[0])
        return ((m >= 3).long() + (m >= 5).long()) * self._depths + d

    def _retrieved_q(self, tree: DraftTree, q: torch.Tensor, src: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """`q` with the retrieved nodes' chances: their own, or the larger of both where retrieval also proposed it."""
        if tree.retrieved_prob is None:
            return q
        rp = tree.retrieved_prob.to(q.dtype)
        retr_q = ((self.retr_acc + 2.0) / (self.retr_pred + 2.0))[self._retrieved_index(tree, d)] * rp
        retr_q = retr_q.clamp(max=1.0)
        return torch.where(src == RETRIEVED, retr_q, torch.where(rp > 0, torch.maximum(q, retr_q), q))

    def node_probs(self, tree: DraftTree) -> torch.Tensor:
        """[T] chance that each node is accepted (1 for the root, 0 for PAD nodes)."""
        d = tree.depths.clamp(max=self.max_depth)
        head_q = (self._ratio()[d] * self._raw_q(tree)).clamp(max=1.0)
        copy_q = self._copy_rate()[self._copy_index(tree, d)]
        src = tree.sources if tree.sources is not None else torch.where(tree.depths > 0, HEAD, 0)
        q = torch.where(src == COPY, copy_q, torch.where(src == BOTH, torch.maximum(head_q, copy_q), head_q))
        q = self._retrieved_q(tree, q, src, d)
        q = torch.where(src == PAD, torch.zeros_like(q), q)
        q = torch.where(tree.depths == 0, torch.ones_like(q), q)
        logq = torch.log(q.clamp(min=1e-6))
        return torch.exp(tree.ancestors.to(logq.dtype) @ logq)

    def frontier_worth_drafting(self, front_scores: torch.Tensor, level: int) -> torch.Tensor:
        """Whether any frontier node (cumulative head log-probs at depth `level`) could still be worth
        verifying, i.e. its children could: their chance is at most the parent's (a device bool)."""
        boost = self._ratio()[1: level + 1].clamp(min=1.0).prod()
        best = (torch.exp(front_scores.max()) * boost).clamp(max=1.0)
        return best > self.threshold

    def keep_drafting(self, front_scores: torch.Tensor, level: int) -> bool:
        """The drafter's early stop, on a CPU only (it reads the answer on the host): draft the next
        level only while some frontier node could still pay."""
        return bool(self.frontier_worth_drafting(front_scores, level))

    def extra_cost(self, t: int) -> torch.Tensor:
        """[t] ms on top of a plain step for verifying k drafted nodes, k = 0..t-1 (the curve's
        c(1 + k) - c(1), on the device, made once per request)."""
        if t > self._extra.shape[0]:
            raise ValueError(f"a tree of {t} nodes; this budget was made for at most {self._extra.shape[0]} (max_nodes)")
        return self._extra[:t]

    def select(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """([T] bool kept nodes, [] expected tokens of the kept tree incl. the bonus): the k likeliest
        drafted nodes, k maximising their summed p minus λ times their extra verification time."""
        p = self.node_probs(tree)
        t = p.shape[0]
        order = torch.sort(p, descending=True, stable=True).indices  # the root first (p = 1, index 0)
        ps = p[order]
        cost = self.rate * self.extra_cost(t)                           # [t], λ·(c(1 + k) - c(1))
        if self.plain_steps >= self.EXPLORE_AFTER:
            # after a run of plain steps, verify the likeliest node anyway (its cost waived): the
            # statistics learn only from verified nodes, and the head may have become right again
            cost = torch.where(torch.arange(t, device=p.device) > 0, cost - cost[1:2].sum(), cost)
        gain = torch.cat([torch.zeros(1, device=p.device, dtype=ps.dtype), torch.cumsum(ps[1:], 0)]) - cost
        best = torch.argmax(gain)   # the first of equal gains: the fewest nodes
        rank_kept = torch.arange(t, device=p.device) <= best
        keep = torch.zeros(t, dtype=torch.bool, device=p.device).scatter(0, order, rank_kept)
        keep = keep & (tree.sources != PAD if tree.sources is not None else True)
        expected = (ps * rank_kept).sum()
        return keep, expected

    def learn(self, tree: DraftTree, enabled: torch.Tensor, on_path: torch.Tensor) -> None:
        """After acceptance: every enabled node whose parent was accepted was tried; count by depth."""
        par = tree.parents.clamp(min=0)
        tried = enabled & on_path[par] & (tree.depths > 0)
        d = tree.depths.clamp(max=self.max_depth)
        src = tree.sources if tree.sources is not None else torch.where(tree.depths > 0, HEAD, 0)
        head = tried & ((src == HEAD) | (src == BOTH))
        copy = tried & ((src == COPY) | (src == BOTH))
        acc = on_path.to(self.head_acc.dtype)
        self.head_pred.index_add_(0, d, self._raw_q(tree) * head)
        self.head_acc.index_add_(0, d, acc * head)
        c = self._copy_index(tree, d)
        self.copy_tried.index_add_(0, c, copy.to(acc.dtype))
        self.copy_acc.index_add_(0, c, acc * copy)
        if tree.retrieved_prob is not None:  # retrieval proposed it alone (module doc)
            rp = tree.retrieved_prob.to(acc.dtype)
            retr = tried & (src == RETRIEVED) & (rp > 0)
            r = self._retrieved_index(tree, d)
            self.retr_pred.index_add_(0, r, rp * retr)
            self.retr_acc.index_add_(0, r, acc * retr)
