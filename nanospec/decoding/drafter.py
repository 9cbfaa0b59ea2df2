"""What the decoding loop asks of a drafter, and the one factory that binds a draft head to its target.

The loop sees a drafter only through `Drafter`: `begin` at prefill, `draft` per step, `update`
after verification, and the early-stop hook `keep_drafting` that the draft budget sets. Everything
that depends on the head's family (which states it reads, which LM-head rows a vocabulary policy
holds, how draft ids map to target ids, which drafter runs it) is asked once, in `bind_head`; the
engine holds the `HeadBinding` it returns and never names a head class.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

import torch

from nanospec.config import TreeConfig
from nanospec.decoding.eagle import Eagle3Drafter, EagleDrafter
from nanospec.decoding.tree import DraftTree
from nanospec.heads.draft_vocab import DraftVocab, needs_mapping
from nanospec.heads.features import FeatureRecorder
from nanospec.heads.head import EagleHead, check_head_matches, check_head_placement
from nanospec.heads.head3 import Eagle3Head, check_eagle3_head
from nanospec.timing import PhaseTimer
from nanospec.vocab import VocabPolicy

# (frontier cumulative log-probs [kf], level) -> draft that level? (the draft budget's early stop)
KeepDrafting = Callable[[torch.Tensor, int], bool]


class Drafter(Protocol):
    keep_drafting: KeepDrafting | None
    """Set by the engine before each `draft`: None drafts every level; otherwise the drafter asks it
    before each level past the first and stops when it answers False (a CPU-only host read)."""

    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor, next_token: int) -> None:
        """Prefill: prompt ids [n], the target's features [n, H] and the first generated token."""

    def draft(self, root: torch.Tensor, vocab: VocabPolicy, tree: TreeConfig, timer: PhaseTimer) -> DraftTree:
        """Propose a tree rooted at the target's last token `root` ([1] long, on the model's device,
        so drafting never waits for the host), scoring only the vocab's active rows."""

    def update(self, features: torch.Tensor, next_tokens: torch.Tensor, timer: PhaseTimer) -> None:
        """After verification: features [m, H] of the accepted path (root first) and the tokens
        that follow each of them (accepted drafts, then the bonus) [m]. Drops speculative state."""


class HeadBinding:
    """An EAGLE-1/2 head (or none, with a caller's drafter factory) bound to its target: the drafter
    reads the target's final hidden states and scores rows of the target's own LM head."""

    def __init__(self, model, head: EagleHead | None, factory: Callable[[], Drafter] | None = None):
        self.model, self.head, self.factory = model, head, factory
        if head is not None:
            self.check(head, model)
            check_head_placement(head, model)

    def check(self, head, model) -> None:
        check_head_matches(head.config, model.config)

    @property
    def lm_head(self) -> torch.nn.Module:
        """The module whose rows a vocabulary policy holds and scores."""
        return self.model.get_output_embeddings()

    def draft_ids(self, target_ids: torch.Tensor | None) -> torch.Tensor | None:
        """Target ids (a frequency table's) -> the ids of `lm_head`'s rows that stand for them."""
        return target_ids

    def wrap(self, vocab: VocabPolicy) -> VocabPolicy:
        """A policy over `lm_head`'s rows -> one that speaks target ids to the engine and the drafter."""
        return vocab

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the drafter reads for the positions of the target's last call: its hidden states [q, H]."""
        return hidden

    def new_drafter(self) -> Drafter:
        if self.factory is not None:
            return self.factory()
        return EagleDrafter(self.head, self.model.get_input_embeddings())


class Eagle3Binding(HeadBinding):
    """An EAGLE-3 head: it reads three target states (hooks keep only those, on every target call, and
    go with the binding), scores its own `lm_head` rows, and maps a pruned draft vocabulary's ids."""

    def __init__(self, model, head: Eagle3Head, factory: Callable[[], Drafter] | None = None):
        super().__init__(model, head, factory)
        self.recorder = FeatureRecorder(model).attach()
        weakref.finalize(self, self.recorder.detach)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.mapped = needs_mapping(head.d2t, self.vocab_size)

    def check(self, head, model) -> None:
        check_eagle3_head(head, model.config)

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.head.lm_head

    def draft_ids(self, target_ids: torch.Tensor | None) -> torch.Tensor | None:
        if not self.mapped or target_ids is None:
            return target_ids
        # frequent target ids inside the draft vocabulary, as draft ids
        d2t = self.head.d2t
        d = DraftVocab.index_of(d2t, self.vocab_size)[target_ids.to(d2t.device)]
        return d[d < d2t.shape[0]]

    def wrap(self, vocab: VocabPolicy) -> VocabPolicy:
        return DraftVocab(vocab, self.head.d2t, self.head.t2d) if self.mapped else vocab

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.recorder.take()[0]   # the three fused states [q, 3H]

    def new_drafter(self) -> Drafter:
        if self.factory is not None:
            return self.factory()
        return Eagle3Drafter(self.head, self.model.get_input_embeddings())


def bind_head(model, head: EagleHead | Eagle3Head | None,
              factory: Callable[[], Drafter] | None = None) -> HeadBinding:
    """The one place that asks which family a draft head is: check it against the target and
    return what the engine needs of it. `factory` (tests, custom drafters) replaces the drafter."""
    if isinstance(head, Eagle3Head):
        return Eagle3Binding(model, head, factory)
    return HeadBinding(model, head, factory)
