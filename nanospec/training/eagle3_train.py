"""EAGLE-3 head training: initialisation, the training-time-test loss, and a resumable, checkpointing loop.

The head at position t reads (embed(x[t+1]), fc(f3[t])) and predicts the target's next-token
distribution at position t+1. Training-time test (EAGLE-3): steps 2..K feed the head its *own*
previous output instead of fc(f3), exactly as it drafts at tree depth 2..K
(:func:`nanospec.training.train_model.unrolled_forward` computes every position's steps at once).
Loss per step: cross-entropy of the head's token distribution against the target's (soft labels:
the target's final-norm output through the same LM-head rows), over a sampled vocabulary (the
batch's tokens, the target's greedy tokens and the most frequent ids) because a 49k-row softmax
would dominate a CPU step; steps are weighted 0.8^(j-1) as in EAGLE-3. The head's ``lm_head`` is
the target's, frozen, so its draft vocabulary is the full one (``d2t`` = 0).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanospec.heads.head3 import Eagle3Head, eagle3_config_from_target, load_eagle3, save_eagle3
from nanospec.training.eagle3_data import Sample3
from nanospec.training.train_model import make_batches, unrolled_forward


def init_eagle3_from_target(target, seed: int = 0) -> Eagle3Head:
    """Full-vocabulary head that starts close to "pass the high feature through": fc = [0 | 0 | I],
    the layer's hidden half of q/k/v and its MLP copied from the target's last layer with o_proj and
    down_proj zeroed (residual branches silent), norm and lm_head copied from the target."""
    torch.manual_seed(seed)
    cfg = eagle3_config_from_target(target.config)
    cfg.num_target_layers = target.config.num_hidden_layers
    head = Eagle3Head(cfg)
    h = head.hidden_size
    last = target.model.layers[-1]
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * h:] = torch.eye(h)
        attn, src = head.midlayer.self_attn, last.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            mine, theirs = getattr(attn, name).weight, getattr(src, name).weight
            mine.normal_(0, 0.02 / math.sqrt(2))
            mine[:, h:] = theirs
        attn.o_proj.weight.zero_()
        head.midlayer.mlp.load_state_dict(last.mlp.state_dict())
        head.midlayer.mlp.down_proj.weight.zero_()
        head.midlayer.hidden_norm.weight.copy_(last.input_layernorm.weight)
        head.midlayer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight)
    head.lm_head.weight.requires_grad_(False)
    return head.float().train()


def collate3(samples: list[Sample3]) -> tuple[torch.Tensor, ...]:
    """-> ids [B, T+1], feats [B, T, 3H], last [B, T, H] (fp32), top1 [B, T], valid [B, T] (position < len - 1),
    answer [B, T] (the token predicted from position p, ids[p + 1], is answer text; all True when a
    sample's answer start is not known)."""
    t = max(len(s.ids) for s in samples) - 1
    b = len(samples)
    ids = torch.zeros(b, t + 1, dtype=torch.long)
    feats = torch.zeros(b, t, samples[0].feats.shape[1])
    last = torch.zeros(b, t, samples[0].last.shape[1])
    top1 = torch.zeros(b, t, dtype=torch.long)
    valid = torch.zeros(b, t, dtype=torch.bool)
    answer = torch.zeros(b, t, dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.ids) - 1
        ids[i, :n + 1], feats[i, :n], last[i, :n], top1[i, :n] = s.ids, s.feats.float(), s.last.float(), s.top1
        valid[i, s.start:n] = True
        answer[i, max(s.answer - 1, 0):n] = True
    return ids, feats, last, top1, valid, answer


def ttt_loss(head: Eagle3Head, embed, ids, feats, last, top1, valid, answer, frequent: torch.Tensor, steps: int,
             decay: float = 0.8, prompt_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Training-time-test loss over `steps` drafting steps. Step j (1-based) at row r reads
    embed(x[r+j]) and predicts the target's distribution at position r+j (soft CE, sampled rows).
    Positions whose next token is prompt text weigh `prompt_weight`, answer positions 1."""
    t = feats.shape[1]
    steps = max(1, min(steps, t - 1))
    with torch.no_grad():
        embs = [embed(ids[:, j:j + t - j + 1]).float() for j in range(1, steps + 1)]   # step j: x[r+j]
        vocab = torch.unique(torch.cat([ids.reshape(-1), top1.reshape(-1), frequent]))
    w = head.lm_head.weight[vocab].float()                                           # [S, H] (frozen rows)
    preds = unrolled_forward(head, embs, feats)
    total, stats = 0.0, {}
    for j, pred in enumerate(preds, start=1):
        m = valid[:, j:] if j > 1 else valid[:, 1:]
        m = m & valid[:, :t - j]                                                     # row r and r + j both real
        if not m.any():
            break
        p = head.norm(pred[:, :t - j][m])                                           # [N, H]
        with torch.no_grad():
            target_p = (last[:, j:][m] @ w.T).softmax(-1)
            label = top1[:, j:][m]
            weight = torch.where(answer[:, j:][m], 1.0, prompt_weight)
        logits = p @ w.T
        per_pos = -(target_p * logits.log_softmax(-1)).sum(-1)
        ce = (weight * per_pos).sum() / weight.sum().clamp_min(1e-6)
        total = total + decay ** (j - 1) * ce
        stats[f"ce{j}"] = ce.item()
        stats[f"acc{j}"] = (vocab[logits.argmax(-1)] == label).float().mean().item()
        stats[f"n{j}"] = int(m.sum())
    return total, stats


@torch.no_grad()
def val_accuracy(head: Eagle3Head, embed, samples: list[Sample3], steps: int) -> dict:
    """Full-vocabulary top-1 agreement with the target's greedy token, per drafting step (TTT unrolled):
    ``val_acc{j}`` over every position, ``val_ans_acc{j}`` over answer positions (what the head drafts)."""
    was = head.training
    head.eval()
    hits, total = [0] * steps, [0] * steps
    ans_hits, ans_total = [0] * steps, [0] * steps
    for s in samples:
        ids, feats, _, top1, valid, answer = collate3([s])
        t = feats.shape[1]
        k = max(1, min(steps, t - 1))
        preds = unrolled_forward(head, [embed(ids[:, j:j + t - j + 1]).float() for j in range(1, k + 1)], feats)
        for j, pred in enumerate(preds, start=1):
            guess = head.logits(pred[:, :t - j]).argmax(-1)
            hit, ans = guess == top1[:, j:], answer[:, j:]
            hits[j - 1] += int(hit.sum())
            total[j - 1] += t - j
            ans_hits[j - 1] += int((hit & ans).sum())
            ans_total[j - 1] += int(ans.sum())
    head.train(was)
    out = {f"val_acc{j + 1}": hits[j] / max(total[j], 1) for j in range(steps)}
    out.update({f"val_ans_acc{j + 1}": ans_hits[j] / max(ans_total[j], 1) for j in range(steps)})
    return out


@dataclass
class LoopConfig:
    steps: int = 3                      # TTT drafting steps
    lr: float = 6e-4
    batch_tokens: int = 2048
    epochs: float = 100.0               # upper bound; the time budget usually ends the run first
    time_budget_s: float = 3600.0       # cosine over wall time, so any checkpoint is usable
    warmup: int = 50
    checkpoint_every_s: float = 600.0
    seed: int = 0
    log_every: int = 10
    prompt_weight: float = 1.0          # loss weight of prompt positions (answer positions: 1)
    val: list = field(default_factory=list)


def _lr_factor(step: int, elapsed: float, cfg: LoopConfig) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup)
    frac = min(1.0, elapsed / cfg.time_budget_s)
    return warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_checkpoint(head: Eagle3Head, opt, state: dict, folder: Path) -> None:
    """head/ (EAGLE-3 layout, fp32) + optimizer.pt + state.json, written to a temp folder then renamed."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    save_eagle3(head, tmp / "head")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        folder.rename(old)
        tmp.rename(folder)
        import shutil
        shutil.rmtree(old)
    else:
        tmp.rename(folder)


def resume_head(path: Path, target) -> tuple[Eagle3Head, dict | None, dict]:
    """--init-head: a head folder, or a checkpoint folder (head/ + optimizer.pt + state.json)."""
    path = Path(path)
    folder = path / "head" if (path / "head" / "config.json").is_file() else path
    head = load_eagle3(folder, target=target, dtype=torch.float32).train().requires_grad_(True)
    head.lm_head.weight.requires_grad_(False)
    opt_state = torch.load(path / "optimizer.pt", weights_only=True) if (path / "optimizer.pt").is_file() else None
    state = json.loads((path / "state.json").read_text()) if (path / "state.json").is_file() else {}
    return head, opt_state, state


def train_loop(head: Eagle3Head, target, load_samples, frequent: torch.Tensor, cfg: LoopConfig, out: Path,
               opt_state: dict | None = None, state: dict | None = None, log=print) -> dict:
    """Train until the time budget or `epochs` is spent. `load_samples()` is called at every epoch, so data
    written by a concurrent generation job joins the next epoch. Checkpoints to `out` every
    `checkpoint_every_s` and at the end; `state` (from a checkpoint) continues step count and clock."""
    state = dict(state or {})
    step, spent = int(state.get("step", 0)), float(state.get("elapsed_s", 0.0))
    rng = random.Random(cfg.seed + step)
    torch.manual_seed(cfg.seed + step)
    embed = target.get_input_embeddings()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    t0, last_ckpt, epoch, history = time.perf_counter(), time.perf_counter(), 0, list(state.get("history", []))
    window: dict[str, float] = {}
    while epoch < cfg.epochs:
        samples = None                  # let the previous epoch's list go before loading the next
        samples = load_samples()
        batches = make_batches(samples, cfg.batch_tokens, rng)
        log(f"epoch {epoch + 1}: {len(samples)} sequences, {sum(len(s.ids) for s in samples)} tokens, "
            f"{len(batches)} batches")
        for batch in batches:
            elapsed = spent + time.perf_counter() - t0
            if elapsed >= cfg.time_budget_s:
                epoch = cfg.epochs
                break
            for g in opt.param_groups:
                g["lr"] = cfg.lr * _lr_factor(step, elapsed, cfg)
            loss, stats = ttt_loss(head, embed, *collate3([samples[i] for i in batch]), frequent, cfg.steps,
                                   prompt_weight=cfg.prompt_weight)
            if not torch.is_tensor(loss):
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            step += 1
            for k, v in stats.items():
                window[k] = window.get(k, 0.0) + v
            window["count"] = window.get("count", 0) + 1
            if step % cfg.log_every == 0:
                c = window.pop("count")
                left = cfg.time_budget_s - elapsed
                log(f"step {step} | " + " ".join(f"{k} {v / c:.3f}" for k, v in sorted(window.items())
                                                   if not k.startswith("n")) +
                    f" | lr {opt.param_groups[0]['lr']:.2e} | {elapsed / 60:.1f} min, ETA {left / 60:.1f} min")
                window = {}
            if time.perf_counter() - last_ckpt >= cfg.checkpoint_every_s:
                history.append(_checkpoint(head, embed, opt, cfg, step, spent + time.perf_counter() - t0,
                                           history, out, log))
                last_ckpt = time.perf_counter()
        else:
            epoch += 1
    history.append(_checkpoint(head, embed, opt, cfg, step, spent + time.perf_counter() - t0, history, out, log))
    return {"steps": step, "history": history}


def _checkpoint(head, embed, opt, cfg: LoopConfig, step: int, elapsed: float, history: list, out: Path, log) -> dict:
    row = {"step": step, "elapsed_s": round(elapsed, 1), **val_accuracy(head, embed, cfg.val, cfg.steps)}
    save_checkpoint(head, opt, {"step": step, "elapsed_s": elapsed, "history": history + [row]}, out / "latest")
    key = "val_ans_acc1"                 # answer positions: what the head drafts at inference
    best = max([h.get(key, 0) for h in history] + [0])
    if row[key] >= best:
        save_checkpoint(head, opt, {"step": step, "elapsed_s": elapsed, "history": history + [row]}, out / "best")
    log("checkpoint " + json.dumps(row))
    return row
