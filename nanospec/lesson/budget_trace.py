"""What the draft budget decided at every step of a recorded run, node by node (the lesson's budget chapter).

Events carry only the nodes a CPU step verified (the budget drops the others) and the step's totals
(`drafted_nodes`, `expected_tokens`, `budget_threshold`). The lesson also shows the dropped nodes and
every node's calibrated acceptance chance, so the recorder listens in on the budget while a run
decodes, through the engine's public `before_step` hook and `DraftBudget.select`:

    before each step (outside its timing)  a copy of the budget's acceptance statistics and threshold
    in `select` (inside the step)           a reference to the drafted tree and the kept mask only:
                                            no copy, no host read, so the step costs what it always does
    after the run                           every node's chance recomputed from the copied statistics
                                            (`DraftBudget.node_probs`), read on the host, checked
                                            against the recorded events

    with BudgetTap(engine) as tap:
        run = engine.stream(messages, cfg)
        for _ in run: pass
    steps = tap.steps(run.events)   # one dict per event (None for prefill)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from nanospec.decoding.budget import DraftBudget
from nanospec.decoding.copy_branch import SOURCE_NAMES


@dataclass
class _Before:
    """The budget as a step starts: what its `select` reads."""

    budget: DraftBudget
    stats: tuple[torch.Tensor, ...]   # the statistics of `BudgetTap.STATS` (copies)
    threshold: float
    rate: float                       # λ, the request's tokens per ms
    explore: bool                     # the likeliest node is verified anyway (after plain steps)


class BudgetTap:
    """Listens to the draft budget of the runs decoded inside its `with` block (one run at a time)."""

    STATS = ("head_pred", "head_acc", "copy_tried", "copy_acc", "retr_pred", "retr_acc")

    def __init__(self, engine):
        self.engine = engine
        self._budget: DraftBudget | None = None
        self._before: dict[int, _Before] = {}
        self._picked: dict[int, tuple] = {}   # step -> (tree, keep), references only
        self._step = 0

    def __enter__(self) -> "BudgetTap":
        tap, init, select = self, DraftBudget.__init__, DraftBudget.select
        self._saved = (self.engine.before_step, init, select)
        earlier_hook = self.engine.before_step

        def tapped_init(budget, *args, **kwargs):
            init(budget, *args, **kwargs)
            tap._budget = budget   # made at prefill: one per request

        def tapped_select(budget, tree):
            keep, expected = select(budget, tree)
            if budget is tap._budget:
                tap._picked[tap._step] = (tree, keep)
            return keep, expected

        def before_step(step, method):
            if earlier_hook is not None:
                earlier_hook(step, method)
            tap._step = step
            b = tap._budget
            if b is not None:
                tap._before[step] = _Before(b, tuple(getattr(b, s).clone() for s in tap.STATS), b.threshold, b.rate,
                                            b.plain_steps >= b.EXPLORE_AFTER)

        DraftBudget.__init__, DraftBudget.select = tapped_init, tapped_select
        self.engine.before_step = before_step
        return self

    def __exit__(self, *exc) -> None:
        self.engine.before_step, DraftBudget.__init__, DraftBudget.select = self._saved

    def steps(self, events) -> list[dict | None]:
        """One entry per event: None for prefill (or a step the budget did not see), else the drafted
        tree with every node's chance `p`, whether the budget `kept` it, the request's rate λ, each
        rank's price (likeliest first), λ·Δc and the explore flag. Raises if the kept nodes are not the ones the event says were verified."""
        out = []
        for e in events:
            before, picked = self._before.get(e.step), self._picked.get(e.step)
            if e.step == 0 or before is None or picked is None:
                out.append(None)
                continue
            out.append(self._one(e, before, *picked))
        return out

    @torch.inference_mode()
    def _one(self, event, before: _Before, tree, keep) -> dict:
        then = copy.copy(before.budget)   # the budget with the statistics its `select` read
        for name, value in zip(self.STATS, before.stats):
            setattr(then, name, value)
        p = then.node_probs(tree).float().cpu().tolist()
        kept = keep.cpu().tolist()
        # each rank's price: the tokens its share of the forward's extra time would earn, λ·(c(1 + k) - c(k))
        extra = then.extra_cost(len(tree)).cpu().tolist()
        prices = [before.rate * (b - a) for a, b in zip(extra, extra[1:])]
        if before.explore and prices:
            prices[0] = 0.0   # waived: after plain steps the likeliest node goes through anyway
        sources = ([SOURCE_NAMES[s] for s in tree.sources.cpu().tolist()] if tree.sources is not None
                   else ["root"] + ["head"] * (len(tree) - 1))
        entry = {"tokens": tree.tokens.cpu().tolist(), "parents": tree.parents.cpu().tolist(),
                 "depths": tree.depths.cpu().tolist(), "sources": sources, "p": [round(x, 5) for x in p],
                 "kept": [bool(k) for k in kept], "threshold": round(before.threshold, 6), "explore": before.explore,
                 "rate": round(before.rate, 9), "prices": [round(x, 6) for x in prices]}
        verified = [t for t, k in zip(entry["tokens"], kept) if k]
        if event.tree_tokens not in (verified, entry["tokens"]):   # a CPU drops; a fixed shape keeps all
            raise RuntimeError(f"step {event.step}: the budget's kept nodes {verified} are not the verified "
                               f"tree {event.tree_tokens}")
        return entry
