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
  both         the larger of the two.
A node is "tried" when its parent was accepted; only tried nodes teach the statistics.

On a CPU the engine drops the nodes it does not keep (and the drafter stops early when no frontier
node could pay); with a fixed shape (every GPU) the tree keeps its shape and the pruned nodes are
disabled for acceptance instead, so deciding never reads a value on the host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nanospec.decoding.copy_branch import BOTH, COPY, HEAD, PAD
from nanospec.decoding.tree import DraftTree
from nanospec.loaders.cpu_linear import packed_kernel
from nanospec.timing import MIN_CPU_SHARE, metered

log = logging.getLogger("nanospec.decoding.budget")

MATCH_ROWS = 4  # rows of the copy statistics, by the copy chain's match length: <= 1, 2, 3-4, 5+ tokens
CURVE_VERSION = 4  # 4: several rows on MKL packed sgemm, tree attention without KV copies, buffered KV cache; 3: one-row linears on MKL (cpu_linear.py); 2: every size from 1 to the largest tree; 1: powers of two
CONTEXT = 256          # cached positions before the verified tokens when the curve is measured
REPEATS = 5
BUSY_CHECK_S = 0.2     # a measurement shorter than this is too short to judge the machine's load by


@dataclass
class CostCurve:
    """Median ms of one target forward over n tokens (after `CONTEXT` cached ones), per size."""

    sizes: list[int]
    ms: list[float]
    key: dict

    @property
    def per_token_ms(self) -> float:
        """The marginal cost of one more verified token: the least-squares slope of ms against
        size (noise in single medians would make differences of neighbours meaningless), >= 0."""
        n, x, y = len(self.sizes), self.sizes, self.ms
        mx, my = sum(x) / n, sum(y) / n
        var = sum((a - mx) ** 2 for a in x)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / var if var else 0.0
        return max(slope, 0.0)

    @property
    def one_token_ms(self) -> float:
        return self.ms_at(1)

    def ms_at(self, n: int) -> float:
        """The forward's ms over n tokens: the measured median at a measured size, linear between two
        measured sizes, and past the largest one the slope `per_token_ms` on from there."""
        pts = sorted(zip(self.sizes, self.ms))
        if n <= pts[0][0]:
            return pts[0][1]
        for (s0, m0), (s1, m1) in zip(pts, pts[1:]):
            if n <= s1:
                return m0 + (m1 - m0) * (n - s0) / (s1 - s0)
        return pts[-1][1] + self.per_token_ms * (n - pts[-1][0])

    def extra_ms(self, t: int) -> list[float]:
        """[t]: how much longer than a plain step (one token) a verification of 1 + k tokens takes, k = 0..t-1,
        from the closest curve that never falls (isotonic least squares over every measured size):
        neighbouring medians differ by noise, and more tokens never take less time."""
        times = monotone([self.ms_at(n) for n in range(1, max(t, max(self.sizes)) + 1)])
        return [m - times[0] for m in times[:t]]

    def describe(self) -> str:
        points = ", ".join(f"{s}: {m:.1f}" for s, m in zip(self.sizes, self.ms))
        return (f"target forward ms by verified tokens ({points}); {self.per_token_ms:.2f} ms per extra "
                f"token on {self.key.get('device', '?')}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        sizes, ms, key = d["sizes"], d["ms"], d["key"]
        if (not isinstance(sizes, list) or not isinstance(ms, list) or len(sizes) != len(ms) or len(sizes) < 2
                or not all(isinstance(s, int) and s >= 1 for s in sizes)
                or not all(isinstance(m, (int, float)) and m > 0 for m in ms) or not isinstance(key, dict)):
            raise ValueError("sizes and ms must be lists of the same length (>= 2) of positive numbers")
        return cls([int(s) for s in sizes], [float(m) for m in ms], key)


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent violators)."""
    pools: list[list[float]] = []   # [sum, count] per pool
    for v in values:
        pools.append([v, 1])   # (a count: a Python int)
        while len(pools) > 1 and pools[-2][0] / pools[-2][1] > pools[-1][0] / pools[-1][1]:
            s, c = pools.pop()
            pools[-1][0] += s
            pools[-1][1] += c
    return [s / c for s, c in pools for _ in range(c)]


def curve_key(model, device: torch.device, packed: bool) -> dict:
    """What a cost curve was measured for: another pair, dtype, device, thread count or torch makes it stale."""
    cfg = model.config
    conf = cfg.to_json_string(use_diff=False) if hasattr(cfg, "to_json_string") else repr(cfg)
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"version": CURVE_VERSION, "model": str(getattr(cfg, "_name_or_path", "") or type(model).__name__),
            "config": hashlib.sha256(conf.encode()).hexdigest()[:16], "dtype": str(next(model.parameters()).dtype),
            "device": f"{dev.type}:{name}", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "packed": packed_kernel() if packed else False,
            "attention": str(getattr(model.config, "_attn_implementation", ""))}


def curve_sizes(max_nodes: int) -> list[int]:
    """Sizes measured: every size from 1 to the largest tree (at least 16, so the slope has a range).
    Every size, because the curve is not a line on every device (see the module docstring)."""
    return list(range(1, max(16, max_nodes) + 1))


@torch.inference_mode()
def measure_cost_curve(model, device, sizes: list[int], key: dict, context: int = CONTEXT,
                       repeats: int = REPEATS) -> CostCurve:
    """Time the target's forward over each size, interleaved across sizes, median of `repeats`."""
    from nanospec.decoding.kv import crop_cache, new_cache
    from nanospec.timing import sync
    from nanospec.decoding.verify import target_forward

    context = max(1, min(context, int(getattr(model.config, "max_position_embeddings", 1 << 30)) - max(sizes) - 1))
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = new_cache()
    target_forward(model, prefix, torch.arange(context, device=device)[None], cache, with_logits=False)
    top = max(sizes)
    tokens = torch.randint(0, vocab, (1, top), generator=gen).to(device)
    causal = torch.ones(top, top, dtype=torch.bool, device=device).tril()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(repeats + 1):  # the first round warms up
        for n in sizes:
            mask = torch.cat([torch.ones(n, context, dtype=torch.bool, device=device), causal[:n, :n]], 1)[None, None]
            pos = torch.arange(context, context + n, device=device)[None]
            sync(device)
            t0 = time.perf_counter()
            target_forward(model, tokens[:, :n], pos, cache, mask)
            sync(device)
            if rep:
                times[n].append((time.perf_counter() - t0) * 1e3)
            crop_cache(cache, context)
    return CostCurve(list(sizes), [statistics.median(times[n]) for n in sizes], key)


def curve_path(key: dict, root: Path | None = None) -> Path:
    """One file per pair (model and its config) and device kind; the rest of the key is checked inside."""
    if root is None:
        from nanospec.loaders.default_model import cache_root
        root = cache_root()
    ident = hashlib.sha256(f"{key['model']}|{key['config']}|{key['device']}".encode()).hexdigest()[:16]
    return Path(root) / "cost" / f"{ident}.json"


def load_or_measure(model, device, packed: bool, max_nodes: int, root: Path | None = None) -> CostCurve:
    """The cached curve when it matches this pair, device and settings; otherwise measure it (a few
    seconds), say why in a log line, and cache it. A missing, stale or malformed file is never trusted,
    and a curve measured while the machine was busy (on a CPU: this process computed less than
    `MIN_CPU_SHARE` of the time) is used but not cached."""
    key = curve_key(model, device, packed)
    sizes = curve_sizes(max_nodes)
    path = curve_path(key, root)
    why = "none cached"
    if path.exists():
        try:
            curve = CostCurve.from_dict(json.loads(path.read_text()))
            if curve.key != key:
                changed = sorted(k for k in key if curve.key.get(k) != key[k])
                why = f"the cached one is stale ({', '.join(changed)} changed)"
            elif max(curve.sizes) < max(sizes):
                why = f"the cached one stops at {max(curve.sizes)} tokens; trees here reach {max(sizes)}"
            else:
                return curve
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"the cached file {path.name} is unreadable ({exc})"
    log.warning("nanospec: measuring the target's cost curve for the draft budget (%s)", why)
    with metered() as meter:
        curve = measure_cost_curve(model, device, sizes, key)
    if torch.device(device).type == "cpu" and meter.wall_s >= BUSY_CHECK_S and meter.cpu_share < MIN_CPU_SHARE:
        # another job shared the cores: its times are too slow for this machine, so use it for this run only
        log.warning("nanospec: the machine was busy while the cost curve was measured (this process computed "
                    "%.0f%% of the time): used for now, not cached", 100 * meter.cpu_share)
        return curve
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(curve.to_dict(), indent=1))
    except OSError as exc:
        log.warning("nanospec: could not cache the cost curve in %s (%s); it will be measured again", path, exc)
    return curve


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
        self._depths = d
        if earlier is not None and earlier.head_pred.shape == self.head_pred.shape:
            head = (self.CARRY / earlier.head_pred.clamp(min=self.CARRY)).clamp(max=1.0)
            copy = (self.CARRY / earlier.copy_tried.clamp(min=self.CARRY)).clamp(max=1.0)
            self.head_pred, self.head_acc = earlier.head_pred * head, earlier.head_acc * head
            self.copy_tried, self.copy_acc = earlier.copy_tried * copy, earlier.copy_acc * copy
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

    def node_probs(self, tree: DraftTree) -> torch.Tensor:
        """[T] chance that each node is accepted (1 for the root, 0 for PAD nodes)."""
        d = tree.depths.clamp(max=self.max_depth)
        head_q = (self._ratio()[d] * self._raw_q(tree)).clamp(max=1.0)
        copy_q = self._copy_rate()[self._copy_index(tree, d)]
        src = tree.sources if tree.sources is not None else torch.where(tree.depths > 0, HEAD, 0)
        q = torch.where(src == COPY, copy_q, torch.where(src == BOTH, torch.maximum(head_q, copy_q), head_q))
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
