"""Judging a training round: the head's agreement with the target on held-out answers, and the round's
model card (``RUN/MODEL_CARD.md`` + ``RUN/card.json``)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from nanospec.training.round_data import TokenSequence, pad_batch, teacher_forward


@torch.no_grad()
def agreement(head, target, val: list[TokenSequence], batch: int = 8, max_positions: int = 4000,
              rows: int = 512) -> tuple[float, float, int]:
    """(top-1, top-3, positions): how often the target's next token (its argmax at f[t+1]) is the head's
    first choice / among its first three, over the full vocabulary, at the answer positions of `val`
    (teacher-forced, the head reading the target's true features: the first drafting step)."""
    if not val:
        return float("nan"), float("nan"), 0
    was_training = head.training
    head.eval()
    w = target.get_output_embeddings().weight.float()
    embed = target.get_input_embeddings()
    hit1 = hit3 = total = 0
    for i in range(0, len(val), batch):
        ids, attention, mask = pad_batch(val[i:i + batch], prompt_loss=False)
        teacher = teacher_forward(target, ids, attention, k=1)
        f = teacher.feats
        t = f.shape[1] - 1
        pred = head(embed(ids[:, 1:]).float(), f[:, :-1], torch.arange(t)[None].expand(f.shape[0], t), None,
                    torch.ones(t, t, dtype=torch.bool).tril()[None, None])           # [B, T, H]
        p, want = pred[mask], teacher.topk_ids[:, 1:, 0][mask]                       # [N, H], [N]
        for j in range(0, p.shape[0], rows):
            top3 = (p[j:j + rows] @ w.T).topk(3, dim=-1).indices                     # [n, 3]
            hit1 += int((top3[:, 0] == want[j:j + rows]).sum())
            hit3 += int((top3 == want[j:j + rows, None]).any(-1).sum())
        total += p.shape[0]
        if total >= max_positions:
            break
    head.train(was_training)
    return hit1 / total, hit3 / total, total


def data_summary(data) -> dict:
    """Distinct answers (a repeated source's copies, appended after them, are counted apart)."""
    copies = data.copies
    train = data.train[:len(data.train) - copies]
    return {"chunks": len(data.chunks), "folders": sorted({c["folder"] for c in data.chunks}),
            "train_answers": len(train), "sampled_answers": sum(s.sampled for s in train),
            "train_tokens": sum(len(s.ids) for s in train),
            "answer_tokens": sum(len(s.ids) - s.answer_start for s in train), "val_answers": len(data.val),
            "repeated_copies": copies}


def command_line(cfg) -> str:
    """The command that runs (or resumes) this round: every setting that differs from its default."""
    flags = [f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
             if getattr(cfg, f.name) != f.default and f.name not in ("minutes", "max_steps", "threads")]
    return " ".join(["python -m nanospec.training.rounds", *flags])


def write_card(run: Path, cfg, state: dict, data) -> Path:
    """RUN/card.json (everything) and RUN/MODEL_CARD.md (the same, for people)."""
    summary = data_summary(data)
    epochs_done = state["epoch"] + state["batch"] / max(1, state["total_steps"] / cfg.epochs)
    card = {"round": cfg.round, "status": "done" if state["done"] else "in progress", "data": summary,
            "epochs_planned": cfg.epochs, "epochs_done": round(epochs_done, 2), "steps": state["step"],
            "total_steps": state["total_steps"], "train_hours": round(state["elapsed_s"] / 3600, 2),
            "history": state["history"], "settings": state["config"], "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (run / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    last = state["history"][-1] if state["history"] else None
    lines = [
        f"# Draft head, training round {cfg.round} ({card['status']})", "",
        f"- Data: {summary['train_answers']:,} training answers ({summary['sampled_answers']:,} sampled), "
        f"{summary['train_tokens']:,} tokens ({summary['answer_tokens']:,} answer tokens) from {summary['chunks']} "
        f"chunks of {', '.join(summary['folders'])}; {summary['val_answers']} held-out greedy answers "
        f"(pool index % 97 == 13, never trained on)"
        + (f"; sources repeated ({cfg.repeat}): {summary['repeated_copies']:,} more answers a pass." if
           summary["repeated_copies"] else "."),
        f"- Training: {card['epochs_done']} of {cfg.epochs} epochs, {state['step']:,} of {state['total_steps']:,} "
        f"steps, {card['train_hours']} h; init: {cfg.init_head or 'target-initialised'}; loss SmoothL1 + "
        f"{cfg.token_weight} x sampled-vocabulary CE + {cfg.distill_weight} x top-{cfg.distill_k} KL; "
        f"unroll {cfg.unroll}; lr {cfg.lr}; {cfg.batch_tokens} padded tokens per step.",
        "- Agreement on the pool's held-out answers (the same kinds of request as the training data; full "
        "vocabulary, first drafting step, answer positions): "
        + (f"top-1 {last['val_top1']:.3f}, top-3 {last['val_top3']:.3f} after epoch {last['epoch']} "
           f"({last['val_positions']} positions)." if last else "not measured yet (no epoch finished)."),
        f"- τ and speed-up under the draft budget, on the held-out and an outside set: not measured by this "
        f"command but by `python -m nanospec.training.judge --candidate {run}/head --out {run}/JUDGED.md` (both "
        "heads beside the same `ar` run; a round ships only if faster than the shipped head on both). A gain on "
        "the pool's answers need not carry over: round 1's did not.", "",
        "| epoch | step | held-out top-1 | held-out top-3 |", "|---|---|---|---|",
        *[f"| {h['epoch']} | {h['step']} | {h['val_top1']:.3f} | {h['val_top3']:.3f} |" for h in state["history"]],
        "", f"Command: `{command_line(cfg)}` (reruns resume; epoch 0 = the initial head).", ""]
    path = run / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path
