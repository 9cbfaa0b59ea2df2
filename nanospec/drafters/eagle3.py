"""EAGLE-3 dynamic-tree drafting: the EAGLE-2 tree search with an EAGLE-3 head.

Two differences from :class:`~nanospec.drafters.eagle.EagleDrafter`, both inside the head's own
calls: the features it receives from the engine are the target's three fused states [m, 3H]
(``fc`` maps them to H), while deeper tree levels feed back the head's own output [.., H]; and
the head scores tokens with its own ``norm`` + ``lm_head`` rows (the vocabulary policy holds rows
of ``head.lm_head``, indexed by draft id; :class:`~nanospec.heads.draft_vocab.DraftVocab` maps them to
target ids when the draft vocabulary is pruned).
"""

from __future__ import annotations

import torch

from nanospec.heads.head3 import Eagle3Head
from nanospec.timing import PhaseTimer
from nanospec.drafters.eagle import EagleDrafter


class Eagle3Drafter(EagleDrafter):
    def __init__(self, head: Eagle3Head, embed: torch.nn.Module):
        super().__init__(head, embed)

    def _score(self, h: torch.Tensor, vocab, k: int, timer: PhaseTimer) -> tuple[torch.Tensor, torch.Tensor]:
        with timer.phase("lm_head"):
            normed = self.head.norm(h)
        return super()._score(normed, vocab, k, timer)
