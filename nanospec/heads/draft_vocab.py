"""Vocabulary policies over a pruned EAGLE-3 draft vocabulary (``d2t`` / ``t2d``).

An EAGLE-3 head scores ``draft_vocab_size`` rows of its own ``lm_head``; draft id d stands for
target id ``d + d2t[d]``. :class:`DraftVocab` runs any policy of :mod:`nanospec.vocab` in draft-id
space and speaks target ids to the engine and the drafter: candidates (prompt ids, tree tokens,
the target's top-k) are mapped through ``t2d`` first, so target ids outside the draft vocabulary
become a dummy id that the inner policy never admits (the ``nanospec`` set is then in-context ids
∩ draft vocabulary), and the ids it returns are mapped back through ``d2t``. A full-vocabulary
head (``draft_vocab_size == V``, ``d2t`` all zero) needs no mapping and gets the plain policy.
"""

from __future__ import annotations

import torch

from nanospec.vocab import Proposal


class DraftVocab:
    def __init__(self, inner, d2t: torch.Tensor, t2d: torch.Tensor):
        self.inner = inner
        dev = inner.weight.device
        self.draft_size = int(d2t.shape[0])
        self.d2t = d2t.to(dev, torch.long)
        self.t2d_index = self.index_of(self.d2t, int(t2d.shape[0]))
        self.name = inner.name

    @staticmethod
    def index_of(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[V + 1]: target id -> draft id, or the dummy ``draft_vocab_size`` (also for the dummy id V)."""
        n = int(d2t.shape[0])
        index = torch.full((vocab_size + 1,), n, dtype=torch.long, device=d2t.device)
        index[torch.arange(n, device=d2t.device) + d2t] = torch.arange(n, device=d2t.device)
        return index

    @property
    def size(self) -> int:
        return self.inner.size

    @property
    def rows_gathered(self) -> int:
        return self.inner.rows_gathered

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        return self.t2d_index[target_ids.to(self.t2d_index.device, torch.long)]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def begin_request(self, prompt_ids: torch.Tensor, prompt_top: torch.Tensor) -> int:
        return self.inner.begin_request(self.to_draft(prompt_ids), self.to_draft(prompt_top))

    def propose(self, candidate_ids: torch.Tensor) -> Proposal | None:
        return self.inner.propose(self.to_draft(candidate_ids))

    def commit(self, proposal: Proposal | None, n_new: int) -> int:
        return self.inner.commit(proposal, n_new)

    def wait_ready(self, timer=None) -> None:
        self.inner.wait_ready(timer)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner.logits(h)

    def slot_ids(self, slots: torch.Tensor) -> torch.Tensor:
        return self.to_target(self.inner.slot_ids(slots))

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        d = self.to_draft(ids)
        return (d < self.draft_size) & self.inner.contains(d)

    def active_target_ids(self) -> torch.Tensor:
        """The target ids of the active rows (tests and inspection)."""
        ids = self.inner.ids[: self.inner.size] if hasattr(self.inner, "ids") else torch.arange(
            self.draft_size, device=self.d2t.device)
        return self.to_target(ids)


def needs_mapping(d2t: torch.Tensor, vocab_size: int) -> bool:
    return d2t.shape[0] != vocab_size or bool(d2t.any())
