"""EAGLE-3 training data: the target's own answers with its three fused features and its greedy tokens.

One ``generate`` call per batch (greedy, chat template, left padding). Forward pre-hooks
(:mod:`nanospec.heads.features`) record the states entering layers 2, L//2 and L-3 during generation and
a hook on the final norm records the target's greedy token at every position (prompt positions
included, where it differs from the next prompt token), so no second pass is needed. Each batch
is cached as one file, so an interrupted run resumes and training can start on what exists.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nanospec.heads.features import recording


@dataclass
class Sample3:
    """One sequence: ids [L]; feats [L-1, 3H] fp16 (the target's fused features at positions 0..L-2);
    last [L-1, H] fp16 (its final-norm output there, whose LM-head logits are the target's distribution);
    top1 [L-1] (the target's greedy next token at positions 0..L-2); ``start``: first trained position;
    ``answer``: index in ids of the first answer token (the target's own text; -1: not known, as in
    files written before the field existed, see :func:`answer_start`)."""

    ids: torch.Tensor
    feats: torch.Tensor
    last: torch.Tensor
    top1: torch.Tensor
    start: int = 0
    answer: int = -1

    def __post_init__(self):
        if not (self.feats.shape[0] == self.last.shape[0] == self.top1.shape[0] == self.ids.shape[0] - 1):
            raise ValueError(f"Sample3 shapes disagree: ids {tuple(self.ids.shape)}, feats "
                             f"{tuple(self.feats.shape)}, last {tuple(self.last.shape)}, top1 {tuple(self.top1.shape)}")


def split_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, output_ids: torch.Tensor,
                feats: torch.Tensor, last: torch.Tensor, top1: torch.Tensor, eos_id: int) -> list[Sample3]:
    """One left-padded ``generate`` batch -> samples (pure). feats [B, P+n-1, 3H], last [B, P+n-1, H],
    top1 [B, P+n-1]."""
    b, p = input_ids.shape
    n = output_ids.shape[1] - p
    if feats.shape[:2] != (b, p + n - 1) or top1.shape != (b, p + n - 1):
        raise ValueError(f"recorded features {tuple(feats.shape)} / tokens {tuple(top1.shape)} do not fit "
                         f"a batch of {b} x {p} prompt + {n} new tokens")
    out = []
    for row in range(b):
        prompt = input_ids[row][attention_mask[row].bool()]
        answer = output_ids[row, p:]
        ends = (answer == eos_id).nonzero()
        a = int(ends[0]) + 1 if len(ends) else n
        if a < 2:
            continue
        ids = torch.cat([prompt, answer[:a]])
        lo = p - prompt.shape[0]
        span = slice(lo, p + a - 1)
        out.append(Sample3(ids.clone(), feats[row, span].to(torch.float16).clone(),
                           last[row, span].to(torch.float16).clone(), top1[row, span].clone(), start=0,
                           answer=int(prompt.shape[0])))
    return out


@torch.inference_mode()
def generate_batch(model, tokenizer, texts: list[str], max_new_tokens: int, eos: int) -> list[Sample3]:
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    tops: list[torch.Tensor] = []
    lasts: list[torch.Tensor] = []
    lm_head = model.get_output_embeddings()

    def greedy(module, inp, out):
        flat = out.reshape(-1, out.shape[-1])
        ids = torch.cat([lm_head(flat[i:i + 1024]).argmax(-1) for i in range(0, flat.shape[0], 1024)])
        tops.append(ids.reshape(out.shape[:-1]))
        lasts.append(out.to(torch.float16))

    handle = model.model.norm.register_forward_hook(greedy)
    try:
        with recording(model, keep_history=True) as rec:
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)
            feats = torch.cat(rec.history(), dim=1)
    finally:
        handle.remove()
    top1, last = torch.cat(tops, dim=1), torch.cat(lasts, dim=1)
    m = out.shape[1] - 1                         # the last generated token is never fed back
    return split_batch(enc["input_ids"], enc["attention_mask"], out, feats[:, :m], last[:, :m], top1[:, :m], eos)


def generation_marker(tokenizer) -> list[int]:
    """The token ids the chat template appends to open the assistant's turn (add_generation_prompt)."""
    chat = [{"role": "user", "content": "x"}]
    with_prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    without = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    if not with_prompt.startswith(without) or with_prompt == without:
        raise ValueError("the chat template's generation prompt is not a suffix of the conversation; "
                         "the answer start cannot be found from the ids")
    return tokenizer(with_prompt[len(without):], add_special_tokens=False)["input_ids"]


def answer_start(ids: list[int], marker: list[int]) -> int:
    """Index of the first answer token: just after the last occurrence of `marker` (pure). ValueError
    when the marker does not occur."""
    m = len(marker)
    for i in range(len(ids) - m, -1, -1):
        if ids[i:i + m] == marker:
            return i + m
    raise ValueError(f"the generation marker {marker} does not occur in the sequence")


def plan_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Length-sorted batches inside seeded shuffled groups of 8 batches (little padding, every group a fair mix)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    group = batch_size * 8
    batches = []
    for g in range(0, len(order), group):
        part = sorted(order[g:g + group], key=lambda i: lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    return batches


def generate_data(model, tokenizer, conversations: list[list[dict]], cache_dir: Path, batch_size: int,
                  max_new_tokens: int, max_prompt_tokens: int = 640, seed: int = 0, progress: bool = True,
                  time_budget_s: float | None = None, first_batch: int = 0) -> int:
    """Write ``batch-NNNN.pt`` files under `cache_dir` (existing ones are kept); returns how many exist.
    Prompts longer than `max_prompt_tokens` are dropped. Stops after `time_budget_s` of generation.
    `first_batch` > 0 leaves the batches before it to another job (two jobs can share one plan)."""
    tokenizer.padding_side = "left"
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else 2
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    keep = [i for i, n in enumerate(lengths) if n <= max_prompt_tokens]
    batches = plan_batches([lengths[i] for i in keep], batch_size, seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    t0, done_tokens, done = time.perf_counter(), 0, 0
    for k, batch in enumerate(batches):
        path = cache_dir / f"batch-{k:04d}.pt"
        if k < first_batch or path.exists():
            continue
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
        samples = generate_batch(model, tokenizer, [texts[keep[i]] for i in batch], max_new_tokens, eos)
        torch.save([s.__dict__ for s in samples], path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
        done_tokens += sum(len(s.ids) for s in samples)
        done += 1
        if progress:
            el = time.perf_counter() - t0
            todo = sum(1 for j in range(k + 1, len(batches))
                       if j >= first_batch and not (cache_dir / f"batch-{j:04d}.pt").exists())
            left = todo * el / done
            print(f"data batch {k + 1}/{len(batches)}: {done_tokens} tokens in {el:.0f}s "
                  f"({done_tokens / el:.0f} tok/s), ETA {left / 60:.1f} min", flush=True)
    return len(list(cache_dir.glob("batch-*.pt")))


def load_data_file(path: Path, marker: list[int] | None = None) -> list[Sample3]:
    """One cached batch file; samples written without ``answer`` get it from `marker` when given."""
    out = []
    for s in torch.load(path, weights_only=True):
        if s.get("answer", -1) < 0 and marker is not None:
            s = {**s, "answer": answer_start(s["ids"].tolist(), marker)}
        out.append(Sample3(**s))
    return out


def load_data(cache_dir: Path, limit: int | None = None, marker: list[int] | None = None) -> list[Sample3]:
    """Every cached batch file (sorted), as samples."""
    files = sorted(cache_dir.glob("batch-*.pt"))[:limit]
    return [s for f in files for s in load_data_file(f, marker)]
