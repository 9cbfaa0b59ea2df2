"""EAGLE-1/2 head model and loss: target-based init, batching, the unrolled multi-step forward, the loss (stage 3a)."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from nanospec.heads.head import EagleHead, head_config_from_target
from transformers import DynamicCache
from nanospec.training.train_data import Sample


def init_head_from_target(target, seed: int = 0) -> EagleHead:
    """One-layer head that starts as the identity f[t] -> f[t] with the target's last-layer weights inside:
    fc = [0 | I] (embedding half zero, feature half identity), layer 0 copied from the target's last
    decoder layer but with o_proj and down_proj zeroed. (A plain copy is far worse than a random
    init: that layer expects the pre-norm residual stream, not the normed feature.)"""
    torch.manual_seed(seed)
    head = EagleHead(head_config_from_target(target.config, 1), bias=True)
    h = head.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, h:] = torch.eye(h)
        head.fc.bias.zero_()
        last = target.model.layers[-1].state_dict()
        own = head.layers[0].state_dict()
        head.layers[0].load_state_dict({k: last[k] for k in own if k in last}, strict=False)
        head.layers[0].self_attn.o_proj.weight.zero_()   # residual branches start silent
        head.layers[0].mlp.down_proj.weight.zero_()
    return head.float().train()


def make_batches(samples: list[Sample], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Shuffle, then group length-sorted chunks into batches of about `batch_tokens` padded tokens."""
    order = list(range(len(samples)))
    rng.shuffle(order)
    batches = []
    chunk = 64
    for i in range(0, len(order), chunk):
        part = sorted(order[i:i + chunk], key=lambda j: len(samples[j].ids))
        cur: list[int] = []
        for j in part:
            longest = max([len(samples[k].ids) for k in cur] + [len(samples[j].ids)])
            if cur and longest * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(j)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> ids [B, L], feats [B, L-1, H] fp32, mask [B, L-2] (True where f[t+1] is a training target)."""
    L = max(len(s.ids) for s in samples)
    h = samples[0].feats.shape[1]
    ids = torch.zeros(len(samples), L, dtype=torch.long)
    feats = torch.zeros(len(samples), L - 1, h)
    mask = torch.zeros(len(samples), max(L - 2, 0), dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.ids)
        ids[i, :n] = s.ids
        feats[i, :n - 1] = s.feats.float()
        mask[i, s.start:n - 2] = True
    return ids, feats, mask


def head_loss(head: EagleHead, embed: torch.nn.Module, lm_weight: torch.Tensor, ids: torch.Tensor,
              feats: torch.Tensor, mask: torch.Tensor, vocab_ids: torch.Tensor, noise: float,
              token_weight: float, steps: int = 1) -> tuple[torch.Tensor, dict]:
    """EAGLE loss on one batch. Position t reads (x[t+1], f[t]) and predicts f[t+1].

    `steps` > 1 adds the head's later drafting steps, as it runs at tree depth 2, 3, ...: step j at
    position t+j-1 reads (x[t+j], the head's own step-(j-1) prediction of f[t+j-1]) and predicts
    f[t+j], attending to the first pass's keys at positions <= t (true features, as the head's KV
    cache holds them while drafting), to its own earlier steps' keys on that chain and to itself
    (`unrolled_forward`). The gradient flows through the earlier steps' predictions. Each step's
    loss counts once."""
    b, t = feats.shape[:2]
    x_next = ids[:, 1:]                                                   # [B, T] tokens x[t+1]
    f_in = feats + (torch.rand_like(feats) * 2 - 1) * noise if noise > 0 else feats
    with torch.no_grad():
        emb = embed(x_next).float()
    w = lm_weight[vocab_ids].float()                                      # [S, H] sampled LM-head rows
    steps = min(steps, t - 1)
    if steps <= 1:
        pos = torch.arange(t)[None].expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]   # [1, 1, T, T]
        pred = head(emb, f_in, pos, None, causal)                         # [B, T, H]
        return _feature_token_loss(pred[:, :-1][mask], feats[:, 1:][mask], w, token_weight)
    with torch.no_grad():
        later = [embed(ids[:, j:]).float() for j in range(2, steps + 1)]  # step j reads x[t+j]
    preds = unrolled_forward(head, [emb] + later, f_in)
    loss, stats = _feature_token_loss(preds[0][:, :-1][mask], feats[:, 1:][mask], w, token_weight)
    for j, pred in enumerate(preds[1:], start=2):
        m = mask[:, j - 1:]                                               # where f[t+j] is a training target
        if not m.any():
            break
        loss_j, stats_j = _feature_token_loss(pred[:, :-1][m], feats[:, j:][m], w, token_weight)
        loss = loss + loss_j
        stats[f"acc{j}"], stats[f"n{j}"] = stats_j["acc"], stats_j["n"]
    return loss, stats


def unrolled_forward(head: EagleHead, embs: list[torch.Tensor], features: torch.Tensor) -> list[torch.Tensor]:
    """The head's drafting steps 1..k at every position at once, with one KV cache.

    embs[0] [B, T, H] = embed(x[t+1]) and features [B, T, H] = f[t] feed step 1 at positions 0..T-1;
    embs[j-1] [B, T-j+1, H] = embed(x[t+j]) feeds step j at positions j-1..T-1, whose input feature
    is step j-1's prediction one position earlier. Row r of step j (position p = r+j-1, drafted from
    the true prefix 0..r) sees step 1's keys 0..r, row r of every step between, and itself: exactly
    the keys the head's cache holds when it drafts depth j of a tree rooted after position r.
    Returns [pred_1 [B, T, H] (f^[t+1]), pred_2 [B, T-1, H] (f^[t+2]), ...]."""
    b, t = features.shape[:2]
    dev = features.device
    pos = torch.arange(t, device=dev)[None].expand(b, t)
    # a plain concatenating cache: the engine's buffered one writes in place, which autograd cannot see through
    cache = DynamicCache()
    preds = [head(embs[0], features, pos, cache, torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None, None])]
    for j in range(2, len(embs) + 1):
        rows = t - j + 1
        blocks = [torch.ones(rows, t, dtype=torch.bool, device=dev).tril()]            # step 1: keys 0..r
        blocks += [torch.eye(rows, t - i + 1, dtype=torch.bool, device=dev) for i in range(2, j + 1)]  # steps 2..j
        preds.append(head(embs[j - 1], preds[-1][:, :-1], pos[:, j - 1:], cache, torch.cat(blocks, dim=1)[None, None]))
    return preds


def _feature_token_loss(p: torch.Tensor, target: torch.Tensor, w: torch.Tensor, token_weight: float
                        ) -> tuple[torch.Tensor, dict]:
    """SmoothL1 on the feature + `token_weight` x CE against the target's distribution over the rows `w`."""
    reg = F.smooth_l1_loss(p, target)
    with torch.no_grad():
        target_logits = target @ w.T                                      # [N, S]
        target_p = target_logits.softmax(-1)
    head_logits = p @ w.T
    tok = -(target_p * head_logits.log_softmax(-1)).sum(-1).mean()
    acc = (head_logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return reg + token_weight * tok, {"reg": reg.item(), "tok": tok.item(), "acc": acc.item(), "n": p.shape[0]}


def sampled_vocab(ids: torch.Tensor, frequent: torch.Tensor) -> torch.Tensor:
    """The batch's own tokens (which hold the target's greedy choices) plus the frequent core."""
    return torch.unique(torch.cat([ids.reshape(-1), frequent]))


@torch.no_grad()
def full_vocab_accuracy(head: EagleHead, embed, lm_weight, samples: list[Sample], max_positions: int = 2000) -> float:
    """Top-1 agreement of head and target over the full vocabulary on validation samples.

    Runs where the head lives (samples are moved there) and leaves the head in the mode it found it in,
    so it serves both the training loop and a loaded engine's head."""
    was_training = head.training
    head.eval()
    dev, dtype = head.fc.weight.device, head.fc.weight.dtype
    w = lm_weight.to(dev).float()
    hits = total = 0
    for s in samples:
        ids, feats, mask = (x.to(dev) for x in collate([s]))
        t = feats.shape[1]
        pred = head(embed(ids[:, 1:]).to(dtype), feats.to(dtype), torch.arange(t, device=dev)[None], None,
                    torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None, None])
        p, target = pred[:, :-1][mask].float(), feats[:, 1:][mask].float()
        hits += int(((p @ w.T).argmax(-1) == (target @ w.T).argmax(-1)).sum())
        total += p.shape[0]
        if total >= max_positions:
            break
    head.train(was_training)
    return hits / max(total, 1)
