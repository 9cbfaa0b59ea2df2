"""EAGLE-1/2 training data: the target's own answers with its features, and teacher-forced text (stage 1-2)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch


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
    from nanospec.data.freq_table import stdlib_source

    buffer: list[int] = []
    for doc in stdlib_source().documents():
        buffer += tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(buffer) >= n_tokens:
            break
    buffer = buffer[:n_tokens - n_tokens % seq_len]
    return [torch.tensor(buffer[i:i + seq_len]) for i in range(0, len(buffer), seq_len)]


def frequent_ids(n: int, vocab: int) -> torch.Tensor:
    """The `n` most frequent ids of the default frequency table when it fits `vocab`; else ids 0..n-1."""
    from nanospec.data.freq_table import load_frequency_table, top_ids
    from nanospec.pair import DEFAULT_FREQ

    if DEFAULT_FREQ.exists():
        counts = load_frequency_table(DEFAULT_FREQ)
        if counts.shape[0] == vocab:
            return top_ids(counts, n)
    return torch.arange(min(n, vocab))
