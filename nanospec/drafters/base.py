"""The drafter interface: the engine's loop never looks past these three calls."""

from __future__ import annotations

from typing import Protocol

import torch

from nanospec.config import TreeConfig
from nanospec.timing import PhaseTimer
from nanospec.decoding.tree import DraftTree
from nanospec.vocab import VocabPolicy


class Drafter(Protocol):
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor, next_token: int) -> None:
        """Prefill: prompt ids [n], the target's features [n, H] and the first generated token."""

    def draft(self, root: torch.Tensor, vocab: VocabPolicy, tree: TreeConfig, timer: PhaseTimer) -> DraftTree:
        """Propose a tree rooted at the target's last token `root` ([1] long, on the model's device,
        so drafting never waits for the host), scoring only the vocab's active rows."""

    def update(self, features: torch.Tensor, next_tokens: torch.Tensor, timer: PhaseTimer) -> None:
        """After verification: features [m, H] of the accepted path (root first) and the tokens
        that follow each of them (accepted drafts, then the bonus) [m]. Drops speculative state."""
