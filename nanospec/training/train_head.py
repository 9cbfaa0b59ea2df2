"""Train the EAGLE-1/2 draft head for a target (default: SmolLM2-135M-Instruct), offline and seeded.

Pipeline (each phase a function; the data phases cache under ``$NANOSPEC_CACHE/train_head``):

1. ``generate_answers`` - the target's own greedy answers to the project's instructions
   (templated tasks from :mod:`nanospec.instructions` and open-ended prompts from
   :mod:`nanospec.open_instructions`; never the held-out prompts), batched with left padding and
   the chat template. A hook on the final norm records the target's features f[t] during
   generation, so no second pass is needed.
2. ``text_samples`` - a little Python stdlib source, features from one teacher-forced pass.
3. ``train`` - the head at position t reads (embed(x[t+1]), f[t] + noise) and predicts f[t+1]:
   SmoothL1 on the feature plus cross-entropy against the target's distribution restricted to a
   sampled vocabulary (the batch's tokens + the most frequent ids), the NanoSpec idea applied to
   the loss: a full-vocabulary softmax would cost ~10x the rest of the step on a CPU.
   Then ``--unroll-epochs`` more epochs also train the later drafting steps (``--unroll-steps``:
   2 = depth 2) on the head's own predicted features (``unrolled_forward``), the input it gets
   deeper in the tree, where noise alone prepares it poorly; the one-step head is kept in the
   cache for comparison. ``--init-head`` starts from a saved head instead (e.g. that one-step
   head, with ``--epochs 0``).
4. ``evaluate_tau`` - held-out τ with the real engine (`method="full"`), checked against `ar`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..head import EagleHead, head_config_from_target, load_head, save_head
from ..kv import new_cache
from ..paths import ASSETS

DEFAULT_OUT = ASSETS / "heads" / "smollm2-135m-eagle"
CACHE_VERSION = 2


@dataclass
class Sample:
    """One training sequence: ids [L], the target's features f[0..L-2] [L-1, H] (fp16), and the
    first position t whose prediction f[t+1] is trained (answers: the last prompt position - 1)."""

    ids: torch.Tensor
    feats: torch.Tensor
    start: int

    def __post_init__(self):
        assert self.feats.shape[0] == self.ids.shape[0] - 1, (self.ids.shape, self.feats.shape)


# ---- 1. answers -------------------------------------------------------------------------------


def answer_samples(input_ids: torch.Tensor, attention_mask: torch.Tensor, output_ids: torch.Tensor,
                   feats: torch.Tensor, eos_id: int) -> list[Sample]:
    """Split one left-padded `generate` batch into samples (pure function).

    input_ids/attention_mask: [B, P]; output_ids: [B, P + n]; feats: [B, P + n - 1, H], the
    final-norm outputs recorded during generation (the last token is never fed back).
    """
    b, p = input_ids.shape
    n = output_ids.shape[1] - p
    assert feats.shape[:2] == (b, p + n - 1), (feats.shape, b, p, n)
    samples = []
    for row in range(b):
        keep = attention_mask[row].bool()
        prompt = input_ids[row][keep]
        answer = output_ids[row, p:]
        ends = (answer == eos_id).nonzero()
        a = int(ends[0]) + 1 if len(ends) else n      # keep the eos: the head should predict it
        if a < 2:
            continue
        ids = torch.cat([prompt, answer[:a]])
        f = feats[row, p - prompt.shape[0]: p + a - 1]   # [len(ids) - 1, H]
        samples.append(Sample(ids.clone(), f.to(torch.float16).clone(), start=max(prompt.shape[0] - 2, 0)))
    return samples


@torch.inference_mode()
def generate_answers(model, tokenizer, conversations: list[list[dict]], batch_size: int, max_new_tokens: int,
                     cache_dir: Path | None = None, progress: bool = True, max_batches: int | None = None
                     ) -> list[Sample]:
    """Greedy answers of the target, one cached file per batch (so an interrupted run resumes).
    `max_batches` keeps only the first batches of the (seeded) order: a time budget, not a new data set."""
    from tqdm import tqdm

    tokenizer.padding_side = "left"
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else 2
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    # a seeded shuffle, not a length sort: every batch is then a fair sample of all families
    # (padding costs little here: decoding dominates, and pads only lengthen the prefill)
    order = list(range(len(texts)))
    random.Random(len(texts)).shuffle(order)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)][:max_batches]
    samples: list[Sample] = []
    for k, batch in enumerate(tqdm(batches, desc="answers (target generate)", disable=not progress)):
        path = cache_dir / f"answers-{k:04d}.pt" if cache_dir is not None else None
        if path is not None and path.exists():
            samples += [Sample(**s) for s in torch.load(path, weights_only=True)]
            continue
        enc = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k2: v.to(model.device) for k2, v in enc.items()}
        recorded: list[torch.Tensor] = []
        hook = model.model.norm.register_forward_hook(lambda mod, inp, out: recorded.append(out.to(torch.float16)))
        try:
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)
        finally:
            hook.remove()
        feats = torch.cat(recorded, dim=1).cpu()        # [B, P + n - 1, H]
        part = answer_samples(enc["input_ids"].cpu(), enc["attention_mask"].cpu(), out.cpu(), feats, eos)
        if path is not None:
            torch.save([s.__dict__ for s in part], path)
        samples += part
    return samples


# ---- 2. text ----------------------------------------------------------------------------------


@torch.inference_mode()
def teacher_forced_samples(model, sequences: list[torch.Tensor], batch_size: int = 8,
                           progress: bool = True) -> list[Sample]:
    """Equal-length id sequences -> samples with features from one teacher-forced pass; loss everywhere."""
    from tqdm import tqdm

    out = []
    for i in tqdm(range(0, len(sequences), batch_size), desc="text features", disable=not progress):
        ids = torch.stack(sequences[i:i + batch_size]).to(model.device)   # [B, T]
        hidden = model.model(input_ids=ids).last_hidden_state              # [B, T, H], after the final norm
        for row in range(ids.shape[0]):
            out.append(Sample(ids[row].cpu(), hidden[row, :-1].to(torch.float16).cpu(), start=0))
    return out


def stdlib_sequences(tokenizer, n_tokens: int, seq_len: int) -> list[torch.Tensor]:
    from ..data.freq_table import stdlib_source

    buffer: list[int] = []
    for doc in stdlib_source().documents():
        buffer += tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(buffer) >= n_tokens:
            break
    buffer = buffer[:n_tokens - n_tokens % seq_len]
    return [torch.tensor(buffer[i:i + seq_len]) for i in range(0, len(buffer), seq_len)]


# ---- 3. training --------------------------------------------------------------------------------


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
    cache = new_cache()
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


# ---- 4. evaluation ------------------------------------------------------------------------------


def evaluate_tau(head_dir: Path, settings: list[tuple[int, int, int]], max_new_tokens: int = 128,
                 limit: int | None = None, progress: bool = True) -> list[dict]:
    """Mean held-out τ of `method="full"` per (depth, top_k, total_tokens), and how many outputs equal `ar`.

    Each result also carries `answer_top1`: the head's teacher-forced top-1 agreement with the target on
    the target's own answers to the held-out prompts (the validation number of `train`, but on prompts
    written by hand rather than by the instruction generator)."""
    from tqdm import tqdm

    from ..pair import load_pair
    from ..data.prompts import load_prompts, prompt_messages

    engine, _ = load_pair(head=head_dir)
    items = load_prompts(split="heldout")[:limit]
    results = [{"depth": d, "top_k": k, "total_tokens": n, "taus": [], "equal_ar": 0} for d, k, n in settings]
    answers: list[Sample] = []
    for item in tqdm(items, desc="held-out τ", disable=not progress):
        messages = prompt_messages(item)
        ar = engine.generate(messages, method="ar", max_new_tokens=max_new_tokens)
        prompt_ids = engine.encode_prompt(messages)
        seq = torch.tensor(list(prompt_ids) + list(ar.token_ids), device=engine.device)
        tf = teacher_forced_samples(engine.model, [seq], progress=False)[0]
        answers.append(Sample(tf.ids, tf.feats, start=max(len(prompt_ids) - 2, 0)))
        for res in results:
            run = engine.generate(messages, method="full", max_new_tokens=max_new_tokens, depth=res["depth"],
                                  top_k=res["top_k"], total_tokens=res["total_tokens"])
            res["taus"].append(run.summary.tau)
            res["equal_ar"] += int(run.token_ids == ar.token_ids)
    top1 = full_vocab_accuracy(engine.head, engine.model.get_input_embeddings(),
                               engine.model.get_output_embeddings().weight, answers, max_positions=10**9)
    for res in results:
        res["tau"] = sum(res["taus"]) / max(len(res["taus"]), 1)
        res["prompts"] = len(res["taus"])
        res["answer_top1"] = top1
    return results or [{"answer_top1": top1, "prompts": len(items)}]


# ---- CLI ----------------------------------------------------------------------------------------


def parse_settings(text: str) -> list[tuple[int, int, int]]:
    """'5x8x32,4x6x24' -> [(depth, top_k, total_tokens), ...]"""
    try:
        out = [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ValueError(f"tree settings must look like 5x8x32,4x6x24 (depth x top_k x total_tokens): {text!r}") from err
    if not out or any(len(s) != 3 for s in out):
        raise ValueError(f"tree settings must look like 5x8x32,4x6x24 (depth x top_k x total_tokens): {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanospec train-head", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="target (default: the offline SmolLM2-135M-Instruct)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="head folder to write (EAGLE layout)")
    p.add_argument("--instructions", type=int, default=2400, help="generated instructions (+ the train prompts)")
    p.add_argument("--open-instructions", type=int, default=1920,
                   help="open-ended instructions per round (nanospec/training/open_instructions.py): free-form answers")
    p.add_argument("--open-rounds", type=int, default=2,
                   help="rounds of --open-instructions, each cached alone (round r = the r-th slice of one seeded list)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap")
    p.add_argument("--gen-batch", type=int, default=96, help="generate batch size")
    p.add_argument("--answer-batches", type=int, default=None,
                   help="generate/use only the first N answer batches (a time budget; the order is seeded)")
    p.add_argument("--text-tokens", type=int, default=10240, help="Python stdlib tokens (0 = none)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--unroll-epochs", type=int, default=1,
                   help="then this many epochs that also train a second drafting step on the head's own "
                        "predicted feature (tree depth 2), with their own warm-up and cosine schedule")
    p.add_argument("--unroll-lr", type=float, default=3e-4)
    p.add_argument("--unroll-steps", type=int, default=2,
                   help="drafting steps trained in the unrolled epochs (2 = depth 2, 3 = depth 3)")
    p.add_argument("--init-head", default=None,
                   help="start from this saved head (EAGLE layout) instead of the target-initialised one; "
                        "allows --epochs 0")
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per training step")
    p.add_argument("--prompt-loss", type=int, default=1,
                   help="1: also train on prompt positions (more data; the held-out prompts are never used)")
    p.add_argument("--noise", type=float, default=0.1, help="uniform input-feature noise, x feature std")
    p.add_argument("--token-weight", type=float, default=0.5, help="weight of the sampled-vocabulary CE")
    p.add_argument("--frequent", type=int, default=2048, help="frequent ids always in the sampled vocabulary")
    p.add_argument("--eval", default="5x8x32", help="held-out τ settings, depth x top_k x total_tokens; '' = skip")
    p.add_argument("--eval-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (use 1 if other jobs share a 2-core box)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-only", action="store_true", help="skip data and training; evaluate the head in --out")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N held-out prompts only")
    p.add_argument("--no-progress", action="store_true")
    return p


def _cache_dir(args, target_name: str, part: str = "", round_: int = 0) -> Path:
    """Data cache folder; `part="open"` is the open-instruction answers' own folder (so either set can change alone),
    one per round (round 0 keeps the key it had before rounds existed, so its answers are reused)."""
    from ..default_model import cache_root

    if part == "open":
        key = json.dumps([CACHE_VERSION, target_name, "open", args.open_instructions, args.max_new_tokens,
                          args.gen_batch, args.seed] + ([round_] if round_ else []))
    else:
        key = json.dumps([CACHE_VERSION, target_name, args.instructions, args.max_new_tokens, args.gen_batch,
                          args.text_tokens, args.seed])
    folder = cache_root() / "train_head" / hashlib.sha1(key.encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(key)
    return folder


def _frequent_ids(n: int, vocab: int) -> torch.Tensor:
    from ..data.freq_table import load_frequency_table, top_ids
    from ..pair import DEFAULT_FREQ

    if DEFAULT_FREQ.exists():
        counts = load_frequency_table(DEFAULT_FREQ)
        if counts.shape[0] == vocab:
            return top_ids(counts, n)
    return torch.arange(min(n, vocab))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (min(args.instructions, args.open_instructions, args.open_rounds, args.unroll_epochs) < 0
            or args.epochs < (0 if args.init_head else 1) or args.max_new_tokens < 2 or args.unroll_steps < 2):
        raise ValueError("--instructions, --open-instructions, --open-rounds and --unroll-epochs must be >= 0, "
                         "--epochs >= 1 (>= 0 with --init-head), --unroll-steps >= 2 and --max-new-tokens >= 2")
    if args.init_head and not (Path(args.init_head) / "config.json").is_file():
        raise FileNotFoundError(f"--init-head: no head (config.json) in {args.init_head}")
    settings = parse_settings(args.eval) if args.eval else []
    torch.set_num_threads(args.threads)
    show = not args.no_progress
    if args.eval_only:
        evals = evaluate_tau(Path(args.out), settings, args.eval_tokens, args.eval_limit, show)  # '' = top-1 only
        print(json.dumps([{k: v for k, v in e.items()} for e in evals], indent=2))
        return 0
    from .instructions import make_instructions
    from ..loading import load_target
    from .open_instructions import make_open_instructions
    from ..data.prompts import load_prompts, prompt_messages

    loaded = load_target(args.model, device="cpu", dtype="float32")
    target, tokenizer = loaded.model, loaded.tokenizer
    cache = _cache_dir(args, loaded.name)
    heldout = [prompt_messages(p) for p in load_prompts(split="heldout")]
    convs = [prompt_messages(p) for p in load_prompts(split="train")]
    convs += make_instructions(args.instructions, seed=args.seed, exclude=heldout + convs)
    # one seeded list cut into rounds: make_open_instructions(n) is a prefix of make_open_instructions(2n)
    opens = make_open_instructions(args.open_instructions * args.open_rounds, seed=args.seed, exclude=heldout + convs)
    times = {}

    t0 = time.perf_counter()
    answers = generate_answers(target, tokenizer, convs, args.gen_batch, args.max_new_tokens, cache, show,
                               args.answer_batches)
    times["answers_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in range(args.open_rounds if args.open_instructions else 0):
        part = opens[r * args.open_instructions:(r + 1) * args.open_instructions]
        answers += generate_answers(target, tokenizer, part, args.gen_batch, args.max_new_tokens,
                                    _cache_dir(args, loaded.name, "open", r), show)
    times["open_answers_s"] = time.perf_counter() - t0
    convs += opens

    t0 = time.perf_counter()
    text: list[Sample] = []
    if args.text_tokens > 0:
        text_path = cache / "text.pt"
        if text_path.exists():
            text = [Sample(**s) for s in torch.load(text_path, weights_only=True)]
        else:
            text = teacher_forced_samples(target, stdlib_sequences(tokenizer, args.text_tokens, 256), 8, show)
            torch.save([s.__dict__ for s in text], text_path)
    times["text_features_s"] = time.perf_counter() - t0

    if args.prompt_loss:
        answers = [Sample(s.ids, s.feats, 0) for s in answers]
    rng = random.Random(args.seed)
    rng.shuffle(answers)
    n_val = max(1, len(answers) // 32)
    val, train_set = answers[:n_val], answers[n_val:] + text
    answer_tokens = sum(len(s.ids) - 2 - s.start for s in answers)
    print(f"data: {len(convs)} instructions -> {len(answers)} answers ({answer_tokens} trained positions), "
          f"{len(text)} text chunks ({sum(len(s.ids) for s in text)} tokens); {n_val} answers held for validation")

    t0 = time.perf_counter()
    if args.init_head:
        head = load_head(args.init_head, target=target, dtype=torch.float32).train().requires_grad_(True)
    else:
        head = init_head_from_target(target, args.seed)
    frequent = _frequent_ids(args.frequent, target.config.vocab_size)
    stats = {"steps": 0, "history": []}
    if args.epochs:
        stats = train(head, target, train_set, val, frequent, epochs=args.epochs, lr=args.lr,
                      batch_tokens=args.batch_tokens, noise=args.noise, token_weight=args.token_weight,
                      seed=args.seed, progress=show)
    times["train_s"] = time.perf_counter() - t0
    if args.unroll_epochs and args.epochs:
        # the one-step head too, for comparison (it is what --unroll-epochs 0 would ship)
        save_head(head.eval(), cache / "head-one-step", dtype=torch.float16)
    if args.unroll_epochs:
        t0 = time.perf_counter()
        unrolled = train(head.train(), target, train_set, val, frequent, epochs=args.unroll_epochs, lr=args.unroll_lr,
                         batch_tokens=args.batch_tokens, noise=args.noise, token_weight=args.token_weight,
                         seed=args.seed + 1, progress=show, unroll=args.unroll_steps)
        times["unroll_train_s"] = time.perf_counter() - t0
        stats = {"steps": stats["steps"] + unrolled["steps"], "history": stats["history"] + unrolled["history"]}
    out = save_head(head.eval(), args.out, dtype=torch.float16)
    size = (out / "model.safetensors").stat().st_size

    t0 = time.perf_counter()
    evals = evaluate_tau(out, settings, args.eval_tokens, args.eval_limit, show) if settings else []
    times["eval_s"] = time.perf_counter() - t0
    summary = {"instructions": len(convs), "answer_batches": args.answer_batches, "answers": len(answers), "trained_positions": answer_tokens,
               "text_tokens": sum(len(s.ids) for s in text), "steps": stats["steps"], "history": stats["history"],
               "times": {k: round(v, 1) for k, v in times.items()}, "head_bytes": size,
               "eval": [{k: v for k, v in e.items() if k != "taus"} for e in evals], "argv": argv}
    (cache / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"head saved to {out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
