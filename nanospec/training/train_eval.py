"""Held-out evaluation of a trained head with the real engine (stage 4)."""

from __future__ import annotations

from pathlib import Path

import torch

from nanospec import metrics
from nanospec.training.train_data import Sample, teacher_forced_samples
from nanospec.training.train_model import full_vocab_accuracy


def evaluate_tau(head_dir: Path, settings: list[tuple[int, int, int]], max_new_tokens: int = 128,
                 limit: int | None = None, progress: bool = True) -> list[dict]:
    """Mean held-out τ of `method="full"` per (depth, top_k, total_tokens), and how many outputs equal `ar`.

    Each result also carries `answer_top1`: the head's teacher-forced top-1 agreement with the target on
    the target's own answers to the held-out prompts (the validation number of `train`, but on prompts
    written by hand rather than by the instruction generator)."""
    from tqdm import tqdm

    from nanospec.pair import load_pair
    from nanospec.data.prompts import load_prompts, prompt_messages

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
        res["tau"] = metrics.mean_tau(res["taus"])  # each held-out prompt weighs the same
        res["prompts"] = len(res["taus"])
        res["answer_top1"] = top1
    return results or [{"answer_top1": top1, "prompts": len(items)}]
