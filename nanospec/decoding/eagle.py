"""EAGLE-2 dynamic-tree drafting, scoring only the active vocabulary, with an EAGLE-1/2 head
(`EagleDrafter`) or an EAGLE-3 head (`Eagle3Drafter`).

The EAGLE-3 drafter differs in two places, both inside the head's own calls: the features it
receives from the engine are the target's three fused states [m, 3H] (``fc`` maps them to H),
while deeper tree levels feed back the head's own output [.., H]; and the head scores tokens with
its own ``norm`` + ``lm_head`` rows (the vocabulary policy holds rows of ``head.lm_head``, indexed
by draft id; :class:`~nanospec.heads.draft_vocab.DraftVocab` maps them to target ids when the
draft vocabulary is pruned).
"""

from __future__ import annotations

import torch

from nanospec.config import TreeConfig
from nanospec.heads.head import EagleHead
from nanospec.heads.head3 import Eagle3Head
from nanospec.decoding.kv import crop_cache, new_cache
from nanospec.timing import PhaseTimer
from nanospec.decoding.tree import DraftTree, select_tree
from nanospec.vocab import VocabPolicy


class EagleDrafter:
    """Head state: its own KV cache over accepted positions, and `h_last`, the head's output at
    the root's input position (its prediction of the root's feature)."""

    def __init__(self, head: EagleHead, embed: torch.nn.Module):
        self.head = head
        self.embed = head.embed_tokens if head.embed_tokens is not None else embed
        self.cache = None
        self.length = 0
        self.h_last: torch.Tensor | None = None  # [H]
        # the engine's early stop (the draft budget's, CPU only): (frontier scores, level) -> draft that level?
        self.keep_drafting = None

    # -- Drafter interface ---------------------------------------------------------
    @torch.inference_mode()
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor, next_token: int) -> None:
        self.cache = new_cache()
        self.length = 0
        nxt = torch.tensor([next_token], device=prompt_ids.device)
        self._extend(features, torch.cat([prompt_ids.reshape(-1)[1:], nxt]))

    @torch.inference_mode()
    def update(self, features: torch.Tensor, next_tokens: torch.Tensor, timer: PhaseTimer) -> None:
        with timer.phase("kv_compact"):
            crop_cache(self.cache, self.length)  # drop this step's speculative tree entries
        with timer.phase("draft_layers"):
            self._extend(features, next_tokens)

    @torch.inference_mode()
    def draft(self, root: torch.Tensor, vocab: VocabPolicy, tree: TreeConfig, timer: PhaseTimer) -> DraftTree:
        k, dev = tree.top_k, self.h_last.device
        # Level 0: the root's children come from h_last (already computed by update/begin).
        vocab.wait_ready(timer)
        logp, ids = self._score(self.h_last[None], vocab, k, timer)          # [1, k0]
        cand_tokens, cand_scores = [ids[0]], [logp[0]]
        cand_parents = [torch.full_like(ids[0], -1)]
        n_cand = ids.shape[1]
        front_tok, front_score = ids[0], logp[0]                             # [kf]
        front_idx = torch.arange(n_cand, device=dev)
        front_h = self.h_last[None].expand(n_cand, -1)                       # [kf, H]
        anc = torch.eye(n_cand, dtype=torch.bool, device=dev)                # [kf, fed + kf]
        fed = 0
        for level in range(1, tree.depth):
            if self.keep_drafting is not None and not self.keep_drafting(front_score, level):
                break
            kf = front_tok.shape[0]
            with timer.phase("draft_layers"):
                # a node at depth d is fed at position length + d - 1; the frontier has d = level
                pos = torch.full((1, kf), self.length + level - 1, device=dev)
                prefix = torch.ones(kf, self.length, dtype=torch.bool, device=dev)
                mask = torch.cat([prefix, anc], dim=1)[None, None]           # [1, 1, kf, kv]
                out = self.head(self.embed(front_tok)[None], front_h[None], pos, self.cache, mask)[0]
            fed += kf
            logp, ids = self._score(out, vocab, k, timer)                    # [kf, kc]
            with timer.phase("topk"):
                kc = ids.shape[1]
                cum = (front_score[:, None] + logp).reshape(-1)              # [kf * kc]
                cand_tokens.append(ids.reshape(-1))
                cand_scores.append(cum)
                cand_parents.append(front_idx[:, None].expand(kf, kc).reshape(-1))
                best = torch.topk(cum, min(k, cum.shape[0])).indices
                rows = best // kc
                front_tok, front_score = ids.reshape(-1)[best], cum[best]
                front_idx = n_cand + best
                front_h = out[rows]
                anc = torch.cat([anc[rows], torch.eye(best.shape[0], dtype=torch.bool, device=dev)], dim=1)
                n_cand += kf * kc
        with timer.phase("tree_build"):
            tokens = torch.cat(cand_tokens)
            return select_tree(tokens, torch.cat(cand_parents), torch.cat(cand_scores),
                               torch.ones_like(tokens, dtype=torch.bool), root,
                               vocab.contains(root), tree.total_tokens - 1)

    # -- internals -------------------------------------------------------------------
    def _score(self, h: torch.Tensor, vocab: VocabPolicy, k: int, timer: PhaseTimer) -> tuple[torch.Tensor, torch.Tensor]:
        """[q, H] -> top-k draft log-probs and vocabulary ids [q, k'] over the active rows."""
        with timer.phase("lm_head"):
            logits = vocab.logits(h)                                         # [q, A]
        with timer.phase("topk"):
            logp = torch.log_softmax(logits.float(), dim=-1)
            vals, slots = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
            return vals, vocab.slot_ids(slots)

    def _extend(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Run the head over accepted positions: input t is (embed(x[t+1]), f[t])."""
        m, dev = next_tokens.shape[0], next_tokens.device
        pos = torch.arange(self.length, self.length + m, device=dev)[None]
        mask = None
        if m > 1:
            # causal over the new entries, full view of the cached prefix
            causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril()
            mask = torch.cat([torch.ones(m, self.length, dtype=torch.bool, device=dev), causal], 1)[None, None]
        feats = features.to(self.head.fc.weight.dtype)[None]
        out = self.head(self.embed(next_tokens)[None], feats, pos, self.cache, mask)[0]
        self.h_last = out[-1]
        self.length += m


class Eagle3Drafter(EagleDrafter):
    def __init__(self, head: Eagle3Head, embed: torch.nn.Module):
        super().__init__(head, embed)

    def _score(self, h: torch.Tensor, vocab, k: int, timer: PhaseTimer) -> tuple[torch.Tensor, torch.Tensor]:
        with timer.phase("lm_head"):
            normed = self.head.norm(h)
        return super()._score(normed, vocab, k, timer)
