"""Train the EAGLE-1/2 head in resumable rounds on the accumulated answer chunks.

    python -m nanospec.training.rounds --data train_data/smollm2-135m --run-dir RUN --epochs 3 --minutes 60
    (the same command again resumes from RUN/checkpoint.pt; a finished round only rewrites its card)

A round fixes its data when it starts (the chunks are recorded in the checkpoint; chunks written later
belong to the next round). Each step pads a batch of token sequences, takes the target's features and
top-k distribution from one teacher-forced forward (:mod:`.round_data`; answers seen in an earlier epoch
or round are read back from the local teacher cache instead, :mod:`.teacher_cache`), and trains the head on
SmoothL1(feature) + ``token_weight`` x CE over a sampled vocabulary (the batch's tokens, the frequent core
and the target's top-k) + ``distill_weight`` x KL(target top-k || head on those ids). Every
``checkpoint_minutes`` (and on SIGTERM/Ctrl-C or at the end of ``minutes``) the head, optimizer,
scheduler, RNG and data position are written atomically to ``RUN/checkpoint.pt``. After the last epoch
the head goes to ``RUN/head`` (EAGLE layout, fp16) and ``RUN/MODEL_CARD.md`` is written
(:mod:`.round_card`); a stopped round writes its card too, marked in progress.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from nanospec.training.background import Deadline, StopFlag, config_from_args, lower_priority, parser_from_dataclass
from nanospec.training.round_data import (RoundData, TeacherBatch, load_round_data, pad_batch, parse_repeat,
                                          plan_epoch)

CHECKPOINT = "checkpoint.pt"
RUNTIME_FIELDS = ("minutes", "checkpoint_minutes", "threads", "max_steps", "teacher_cache")   # may change when resuming


@dataclass
class RoundConfig:
    run_dir: str = field(default="", metadata={"help": "checkpoint, head and model card folder", "required": True})
    data: str = field(default="train_data/smollm2-135m", metadata={"help": "answer folders, comma-separated"})
    round: int = field(default=1, metadata={"help": "round number (for the model card)"})
    init_head: str = field(default="", metadata={"help": "start from this head folder ('' = target-initialised)"})
    model: str = field(default="", metadata={"help": "target ('' = the offline SmolLM2-135M-Instruct)"})
    epochs: int = field(default=3, metadata={"help": "passes over the round's data"})
    lr: float = field(default=6e-4, metadata={"help": "peak AdamW learning rate (warm-up, then cosine)"})
    batch_tokens: int = field(default=2048, metadata={"help": "padded tokens per step"})
    noise: float = field(default=0.1, metadata={"help": "uniform input-feature noise, x feature std"})
    token_weight: float = field(default=0.5, metadata={"help": "weight of the sampled-vocabulary CE"})
    distill_weight: float = field(default=0.5, metadata={"help": "weight of the top-k distillation KL"})
    distill_k: int = field(default=8, metadata={"help": "target top-k kept per position"})
    frequent: int = field(default=2048, metadata={"help": "frequent ids always in the sampled vocabulary"})
    unroll: int = field(default=1, metadata={"help": "drafting steps trained (2, 3: the head's own features)"})
    repeat: str = field(default="", metadata={
        "help": "weight prompt sources by repeating their training answers each pass, e.g. 'templated=3' "
                "(names from the data's manifest; '' = every answer once)"})
    prompt_loss: bool = field(default=True, metadata={"help": "also train on prompt positions"})
    max_val: int = field(default=128, metadata={"help": "held-out greedy answers for agreement"})
    minutes: float = field(default=0.0, metadata={"help": "stop (with a checkpoint) after this many minutes; 0 = none"})
    max_steps: int = field(default=0, metadata={"help": "stop after this many steps in this run; 0 = none"})
    checkpoint_minutes: float = field(default=5.0, metadata={"help": "checkpoint at least this often"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads"})
    seed: int = field(default=0, metadata={"help": "data order, noise and init seed"})
    teacher_cache: str = field(default="auto", metadata={
        "help": "folder that keeps the target's features of each answer after its first forward, so later "
                "epochs and rounds skip it (~1.2 KB per token; 'auto' = the model cache's teacher/, '' = off)"})

    def __post_init__(self):
        if self.epochs < 1 or self.batch_tokens < 16 or self.distill_k < 1 or self.unroll < 1 or self.threads < 1:
            raise ValueError("epochs, distill_k, unroll and threads must be >= 1 and batch_tokens >= 16")
        if min(self.lr, self.token_weight, self.distill_weight, self.noise, self.checkpoint_minutes) < 0:
            raise ValueError("lr, token_weight, distill_weight, noise and checkpoint_minutes must be >= 0")
        parse_repeat(self.repeat)

    def folders(self) -> list[Path]:
        return [Path(p.strip()) for p in self.data.split(",") if p.strip()]


# ---- the loss -------------------------------------------------------------------------------------


def step_loss(p: torch.Tensor, target: torch.Tensor, top_ids: torch.Tensor, top_logits: torch.Tensor,
              lm_weight: torch.Tensor, vocab: torch.Tensor, cfg: RoundConfig) -> tuple[torch.Tensor, dict]:
    """p, target [N, H] (head's and target's next features); top_ids/top_logits [N, k] (target's top-k)."""
    reg = F.smooth_l1_loss(p, target)
    w = lm_weight[vocab].float()                                         # [S, H] sampled LM-head rows
    with torch.no_grad():
        target_p = (target @ w.T).softmax(-1)                            # [N, S]
    head_logits = p @ w.T
    tok = -(target_p * head_logits.log_softmax(-1)).sum(-1).mean()
    head_top = torch.einsum("nh,nkh->nk", p, lm_weight[top_ids].float())  # [N, k] head logits on target's top-k
    teacher = top_logits.softmax(-1)
    kd = (teacher * (teacher.clamp_min(1e-9).log() - head_top.log_softmax(-1))).sum(-1).mean()
    top1 = (head_top.argmax(-1) == 0).float().mean()                     # target's top-1 is column 0
    loss = reg + cfg.token_weight * tok + cfg.distill_weight * kd
    return loss, {"reg": reg.item(), "tok": tok.item(), "kd": kd.item(), "top1_in_topk": top1.item(), "n": p.shape[0]}


def round_loss(head, embed, lm_weight, ids: torch.Tensor, teacher: TeacherBatch, mask: torch.Tensor,
               frequent: torch.Tensor, noise_scale: float, cfg: RoundConfig) -> tuple[torch.Tensor, dict]:
    """Position t reads (x[t+1], f[t] + noise) and predicts f[t+1]; step j of the unrolled forward reads
    the head's own step j-1 prediction and predicts f[t+j]. Each step's loss counts once."""
    from nanospec.training.train_model import unrolled_forward

    f = teacher.feats                                                    # [B, L, H]
    f_in = f[:, :-1]
    if noise_scale > 0:
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * noise_scale
    steps = max(1, min(cfg.unroll, f_in.shape[1] - 1))
    with torch.no_grad():
        embs = [embed(ids[:, j:]).float() for j in range(1, steps + 1)]  # step j reads x[t+j]
    preds = unrolled_forward(head, embs, f_in)                           # pred_j: [B, L-j, H]
    vocab = torch.unique(torch.cat([ids.reshape(-1), frequent, teacher.topk_ids.reshape(-1)]))
    total, stats = 0.0, {}
    for j, pred in enumerate(preds, start=1):
        m = mask[:, j - 1:]                                              # rows whose f[t+j] is trained
        if not m.any():
            break
        loss, s = step_loss(pred[m], f[:, j:][m], teacher.topk_ids[:, j:][m], teacher.topk_logits[:, j:][m],
                            lm_weight, vocab, cfg)
        total = total + loss
        stats.update(s if j == 1 else {f"top1_in_topk{j}": s["top1_in_topk"]})
    return total, stats


# ---- checkpoints ----------------------------------------------------------------------------------


def save_checkpoint(run: Path, head, opt, sched, state: dict) -> None:
    """Atomic: a temporary file, then os.replace (a kill mid-write leaves the previous checkpoint)."""
    path = run / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"head": head.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng": torch.get_rng_state(), "state": state}, tmp)
    os.replace(tmp, path)


def check_resume(saved: dict, cfg: RoundConfig) -> None:
    """A resumed round must keep the settings that shape it (only the RUNTIME_FIELDS may change)."""
    mine = dataclasses.asdict(cfg)
    differ = {k: (mine[k], v) for k, v in saved.items() if k not in RUNTIME_FIELDS and mine.get(k) != v}
    if differ:
        raise ValueError(f"{cfg.run_dir} holds a round with other settings (yours, the checkpoint's): {differ}; "
                         "resume with the checkpoint's settings or use another --run-dir")


def new_head(cfg: RoundConfig, target):
    from nanospec.heads.head import load_head
    from nanospec.training.train_model import init_head_from_target

    if cfg.init_head:
        return load_head(cfg.init_head, target=target, dtype=torch.float32).train().requires_grad_(True)
    return init_head_from_target(target, cfg.seed)


def make_optimizer(head, cfg: RoundConfig, total_steps: int):
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, min(100, total_steps // 20))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    return opt, sched


# ---- the round ------------------------------------------------------------------------------------


def start_or_resume(cfg: RoundConfig, target, tokenizer_hash: str, log) -> tuple:
    """-> (head, opt, sched, state, data): a fresh round, or the checkpoint's, with the same data."""
    run = Path(cfg.run_dir)
    path = run / CHECKPOINT
    ckpt = torch.load(path, weights_only=False) if path.exists() else None
    if ckpt is not None:
        check_resume(ckpt["state"]["config"], cfg)
    data = load_round_data(cfg.folders(), tokenizer_hash, ckpt["state"]["chunks"] if ckpt else None,
                           cfg.max_val, warn=log, repeat=parse_repeat(cfg.repeat))
    if not data.train:
        raise ValueError(f"no usable answer chunks in {cfg.data}: generate some first "
                         "(python -m nanospec.training.answers generate --out FOLDER)")
    lengths = [len(s.ids) for s in data.train]
    total = sum(len(plan_epoch(lengths, cfg.batch_tokens, cfg.seed, e)) for e in range(cfg.epochs))
    head = new_head(cfg, target)
    opt, sched = make_optimizer(head, cfg, total)
    state = {"config": dataclasses.asdict(cfg), "chunks": data.chunks, "epoch": 0, "batch": 0, "step": 0,
             "total_steps": total, "noise_scale": None, "history": [], "elapsed_s": 0.0, "done": False}
    if ckpt is not None:
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng"])
        state = {**ckpt["state"], "config": state["config"]}
        log(f"resumed {path}: epoch {state['epoch'] + 1}, batch {state['batch']}, step {state['step']}/{total}")
    return head, opt, sched, state, data


def open_teacher_cache(cfg: RoundConfig, target, data: RoundData):
    """The round's `TeacherCache` with every chunk of its data attached; None when `teacher_cache` is ''."""
    if not cfg.teacher_cache:
        return None
    from nanospec.loaders.default_model import cache_root
    from nanospec.training.answer_chunks import target_fingerprint
    from nanospec.training.teacher_cache import TeacherCache

    root = cache_root() / "teacher" if cfg.teacher_cache == "auto" else Path(cfg.teacher_cache)
    cache = TeacherCache(root, target_fingerprint(target), target.config.hidden_size, cfg.distill_k)
    for name, (tokens, offsets) in data.arrays.items():
        cache.attach(name, tokens, offsets)
    return cache


def train_step(cfg: RoundConfig, target, head, opt, sched, state: dict, seqs: list, frequent: torch.Tensor,
               cache=None) -> dict:
    """One optimizer step on one batch: pad, the target's teacher-forced view (read back from `cache` where
    it holds an answer's), the loss, AdamW."""
    from nanospec.training.teacher_cache import cached_teacher

    ids, attention, mask = pad_batch(seqs, cfg.prompt_loss)
    teacher = cached_teacher(target, seqs, ids, attention, cfg.distill_k, cache)
    if state["noise_scale"] is None:      # fixed at the round's first batch, kept in the checkpoint
        state["noise_scale"] = cfg.noise * float(teacher.feats[attention.bool()].std())
    loss, stats = round_loss(head, target.get_input_embeddings(), target.get_output_embeddings().weight.detach(),
                             ids, teacher, mask, frequent, state["noise_scale"], cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
    opt.step()
    sched.step()
    return stats


def train_steps(cfg: RoundConfig, target, head, opt, sched, state: dict, data: RoundData, frequent: torch.Tensor,
                stop: StopFlag, log) -> None:
    """Run steps from the state's (epoch, batch) until the round ends, the budget is spent or `stop` is set,
    checkpointing every ``checkpoint_minutes``; epoch ends append validation agreement to the history."""
    from nanospec.training.round_card import agreement

    run = Path(cfg.run_dir)
    lengths = [len(s.ids) for s in data.train]
    cache = open_teacher_cache(cfg, target, data)
    if not state["history"] and state["step"] == 0:   # the initial head, to judge the round against
        top1, top3, n = agreement(head, target, data.val)
        state["history"].append({"epoch": 0, "step": 0, "val_top1": top1, "val_top3": top3, "val_positions": n})
        log(f"initial head: held-out top-1 {top1:.3f}, top-3 {top3:.3f} ({n} positions)")
    deadline, t_ckpt, t_run, steps_run = Deadline(cfg.minutes), time.monotonic(), time.monotonic(), 0
    while state["epoch"] < cfg.epochs:
        plan = plan_epoch(lengths, cfg.batch_tokens, cfg.seed, state["epoch"])
        while state["batch"] < len(plan):
            if stop.set or deadline.passed() or (cfg.max_steps and steps_run >= cfg.max_steps):
                state["elapsed_s"] += time.monotonic() - t_run
                save_checkpoint(run, head, opt, sched, state)
                return
            stats = train_step(cfg, target, head, opt, sched, state, [data.train[j] for j in plan[state["batch"]]],
                               frequent, cache)
            state["batch"], state["step"], steps_run = state["batch"] + 1, state["step"] + 1, steps_run + 1
            if state["step"] % 10 == 0 or steps_run == 1:
                log(f"step {state['step']}/{state['total_steps']} epoch {state['epoch'] + 1}: "
                    + " ".join(f"{k} {v:.3f}" for k, v in stats.items() if k != "n"))
            if time.monotonic() - t_ckpt >= cfg.checkpoint_minutes * 60:
                state["elapsed_s"] += time.monotonic() - t_run
                t_run = t_ckpt = time.monotonic()
                save_checkpoint(run, head, opt, sched, state)
                log(f"checkpoint {run / CHECKPOINT} at step {state['step']}")
        top1, top3, n = agreement(head, target, data.val)
        state["history"].append({"epoch": state["epoch"] + 1, "step": state["step"], "val_top1": top1,
                                 "val_top3": top3, "val_positions": n})
        log(f"epoch {state['epoch'] + 1} done: held-out top-1 {top1:.3f}, top-3 {top3:.3f} ({n} positions)")
        state["epoch"], state["batch"] = state["epoch"] + 1, 0
    state["elapsed_s"] += time.monotonic() - t_run
    state["done"] = True
    save_checkpoint(run, head, opt, sched, state)


def run_round(cfg: RoundConfig, target, tokenizer_hash: str, log=print, stop: StopFlag | None = None) -> dict:
    """Start or resume the round in ``cfg.run_dir``; returns its state. Writes the head when it is done
    and the model card either way."""
    from nanospec.heads.head import save_head
    from nanospec.training.round_card import write_card
    from nanospec.training.train_data import frequent_ids

    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    head, opt, sched, state, data = start_or_resume(cfg, target, tokenizer_hash, log)
    if not state["done"]:
        frequent = frequent_ids(cfg.frequent, target.config.vocab_size)
        train_steps(cfg, target, head.train(), opt, sched, state, data, frequent, stop or StopFlag(), log)
    if state["done"]:
        save_head(head.eval(), run / "head", dtype=torch.float16)
    write_card(run, cfg, state, data)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_dataclass(RoundConfig, "python -m nanospec.training.rounds", __doc__.split("\n")[0])
    try:
        return train_round(config_from_args(RoundConfig, parser.parse_args(argv)))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def train_round(cfg: RoundConfig) -> int:
    nice = lower_priority(cfg.threads)
    from nanospec.loaders.loading import load_target
    from nanospec.training.answer_chunks import tokenizer_fingerprint

    loaded = load_target(cfg.model or None, device="cpu", dtype="float32")
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)
    log(f"round {cfg.round} in {cfg.run_dir} (niceness {nice}, {cfg.threads} threads)")
    with StopFlag() as stop:
        state = run_round(cfg, loaded.model, tokenizer_fingerprint(loaded.tokenizer), log, stop)
    log(json.dumps({k: state[k] for k in ("epoch", "batch", "step", "total_steps", "done")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
