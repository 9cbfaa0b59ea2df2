"""EAGLE-1/2 training loop: AdamW, warm-up + cosine, per-epoch validation (stage 3b)."""

from __future__ import annotations

import json
import math
import random

import torch

from nanospec.heads.head import EagleHead
from nanospec.training.train_data import Sample
from nanospec.training.train_model import collate, full_vocab_accuracy, head_loss, make_batches, sampled_vocab


def train(head: EagleHead, target, samples: list[Sample], val: list[Sample], frequent: torch.Tensor, *,
          epochs: int, lr: float, batch_tokens: int, noise: float, token_weight: float, seed: int,
          progress: bool = True, unroll: int = 1) -> dict:
    from tqdm import tqdm

    rng = random.Random(seed)
    torch.manual_seed(seed)
    embed = target.get_input_embeddings()
    lm_weight = target.get_output_embeddings().weight.detach()
    scale = noise * float(torch.cat([s.feats[:64].float().reshape(-1) for s in samples[:200]]).std())
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    plan = [make_batches(samples, batch_tokens, rng) for _ in range(epochs)]
    total = sum(len(p) for p in plan)
    warmup = max(1, min(100, total // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    history, step = [], 0
    later = range(2, unroll + 1)   # the unrolled steps, whose top-1 is reported as acc2, acc3, ...
    bar = tqdm(total=total, desc=f"train head ({unroll}-step unroll)" if unroll > 1 else "train head", disable=not progress)
    for epoch, batches in enumerate(plan):
        sums = {"reg": 0.0, "tok": 0.0, "acc": 0.0, "n": 0, **{f"{k}{j}": 0 for j in later for k in ("acc", "n")}}
        for batch in batches:
            ids, feats, mask = collate([samples[j] for j in batch])
            if not mask.any():
                bar.update(1)
                continue
            loss, stats = head_loss(head, embed, lm_weight, ids, feats, mask, sampled_vocab(ids, frequent),
                                    scale, token_weight, steps=unroll)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            sched.step()
            step += 1
            for k in ("reg", "tok", "acc"):
                sums[k] += stats[k] * stats["n"]
            sums["n"] += stats["n"]
            for j in later:
                if f"n{j}" in stats:
                    sums[f"acc{j}"] += stats[f"acc{j}"] * stats[f"n{j}"]
                    sums[f"n{j}"] += stats[f"n{j}"]
            bar.update(1)
            bar.set_postfix(reg=f"{stats['reg']:.3f}", tok=f"{stats['tok']:.2f}", acc=f"{stats['acc']:.2f}")
        n = max(sums["n"], 1)
        row = {"epoch": epoch + 1, "reg": sums["reg"] / n, "tok": sums["tok"] / n, "acc": sums["acc"] / n,
               "val_top1": full_vocab_accuracy(head, embed, lm_weight, val) if val else None}
        for j in later:
            if sums[f"n{j}"]:
                row[f"acc{j}"] = sums[f"acc{j}"] / sums[f"n{j}"]  # training top-1 (sampled vocabulary) of step j
        history.append(row)
        bar.write(json.dumps(row))
    bar.close()
    return {"steps": step, "history": history}
