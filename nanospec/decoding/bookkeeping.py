"""A decoding step's bookkeeping: the acceptance decision with the step's one device->host read,
and the `StepEvent` each step reports.

`accept_step` runs the acceptance rule (`accept.py`) on the device, then reads back in one
transfer everything the host needs: the accepted path, the bonus token and whether it was in the
active set, the vocabulary's Ext count and the tree for the event. `spec_event` and
`single_node_event` build the events of speculative steps and of prefill / autoregressive steps.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict

import torch

from nanospec import transfer
from nanospec.decoding.accept import greedy_path, sample_path
from nanospec.config import SamplingConfig
from nanospec.decoding.copy_branch import PAD, SOURCE_NAMES, drop_padding
from nanospec.events import StepEvent
from nanospec.decoding.tree import DraftTree
from nanospec.decoding.verify import Acceptance, HostTree, warp_probs
from nanospec.vocab import VocabPolicy


def accept_step(tree: DraftTree, logits: torch.Tensor, argmax: torch.Tensor, candidates: torch.Tensor,
                vocab: VocabPolicy, sampling: SamplingConfig, gen: torch.Generator | None,
                figures=None) -> Acceptance:
    """Acceptance on the device, the vocabulary's proposal (Ext: the `candidates` plus the bonus
    token, which sampling may draw from outside them), then the step's one device->host transfer:
    the path, the bonus token and its membership, the Ext count, the tree (for the event) and the
    tensor fields of `figures` (a dataclass, e.g. the draft budget's `BudgetFigures`; one value each),
    returned with those fields read as `Acceptance.figures`."""
    if sampling.greedy:
        dp = greedy_path(tree.tokens, tree.parents, argmax, tree.ancestors, tree.enabled)
    else:
        probs = warp_probs(logits, sampling.temperature, sampling.top_p)
        dp = sample_path(tree.tokens, tree.parents, probs, gen, tree.ancestors, tree.enabled)
    proposal = vocab.propose(torch.cat([candidates, dp.bonus]))
    n_new = proposal.n_new.reshape(1) if proposal is not None else torch.zeros_like(dp.length)
    sources = tree.sources if tree.sources is not None else torch.ones_like(tree.tokens)
    if tree.enabled is not None:  # pruned by the budget: shown as PAD, i.e. not at all
        sources = torch.where(tree.enabled, sources, PAD)
    on_device = {} if figures is None else {f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)
                                            if isinstance(getattr(figures, f.name), torch.Tensor)}
    nodes, (n,), (bonus,), (bonus_in,), (n_new,), tokens, parents, depths, scores, in_active, src, *more = \
        transfer.to_host(dp.nodes, dp.length, dp.bonus, vocab.contains(dp.bonus), n_new,
                         tree.tokens, tree.parents, tree.depths, tree.scores, tree.in_active, sources,
                         *(x.reshape(1) for x in on_device.values()))
    if figures is not None:
        figures = dataclasses.replace(figures, **{name: x[0] for name, x in zip(on_device, more)})
    host = HostTree(tokens=tokens, parents=parents, depths=depths, scores=[round(s, 4) for s in scores],
                    in_active=in_active, sources=[0] + src[1:])
    return Acceptance(path=nodes[:n], bonus=bonus, bonus_in_active=bonus_in, n_new=n_new, tree=host,
                      keep=dp.nodes[:n], bonus_dev=dp.bonus, proposal=proposal, figures=figures)


def spec_event(step: int, method: str, acc: Acceptance, accepted: list[int], tokens: list[int], active_size: int,
               added: int, vocab_size: int, t0: float, phases: dict[str, float]) -> StepEvent:
    """A speculative step's event (`t0`: when the step began). It shows no PAD slots of the copy chain;
    the miss kind says why the path ended: `none` (a leaf), `draft` (the target's token was in the
    active set but not drafted) or `vocab` (it was outside the active set)."""
    shown, path = drop_padding(asdict(acc.tree), acc.path)
    host = HostTree(**shown)
    kids_of_last = [i for i, p in enumerate(host.parents) if p == path[-1]]
    miss = "none" if not kids_of_last else ("draft" if acc.bonus_in_active else "vocab")
    return StepEvent(
        step=step, method=method, root_token=host.tokens[0], tree_tokens=host.tokens,
        tree_parents=host.parents, tree_depths=host.depths, tree_logprobs=host.scores,
        tree_in_active=host.in_active, accepted_path=path, accepted_tokens=accepted,
        bonus_token=acc.bonus, tokens=tokens, active_size=active_size, added_ids=added,
        vocab_size=vocab_size, coverage=acc.bonus_in_active, miss_kind=miss,
        wall_ms=(time.perf_counter() - t0) * 1e3, phases=phases,
        tree_sources=[SOURCE_NAMES[s] for s in host.sources])


def single_node_event(step: int, method: str, root: int, token: int, tokens: list[int], active_size: int,
                      added: int, vocab_size: int, t0: float, phases: dict[str, float],
                      tree_sources: list[str] | None = None) -> StepEvent:
    """The event of a step without a draft tree (prefill, autoregressive): the root alone, then `token`."""
    return StepEvent(
        step=step, method=method, root_token=root, tree_tokens=[root], tree_parents=[-1], tree_depths=[0],
        tree_logprobs=[0.0], tree_in_active=[True], accepted_path=[0], accepted_tokens=[],
        bonus_token=token, tokens=tokens, active_size=active_size, added_ids=added, vocab_size=vocab_size,
        coverage=None, miss_kind="none", wall_ms=(time.perf_counter() - t0) * 1e3, phases=phases,
        tree_sources=[] if tree_sources is None else tree_sources)
