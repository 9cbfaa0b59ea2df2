"""Train the EAGLE-1/2 draft head for a target (default: SmolLM2-135M-Instruct), offline and seeded.

Pipeline (each stage its own module: ``train_data``, ``train_model``, ``train_loop``, ``train_eval``;
``--arch eagle3`` runs :mod:`nanospec.training.eagle3_cli` instead; the data phases cache under ``$NANOSPEC_CACHE/train_head``):

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
import random
import time
from pathlib import Path

import torch

from nanospec.bench.compare import parse_tree_settings
from nanospec.heads.head import load_head, save_head
from nanospec.paths import ASSETS
from nanospec.training.train_data import (Sample, answer_samples, frequent_ids, generate_answers, stdlib_sequences,
                         teacher_forced_samples)
from nanospec.training.train_eval import evaluate_tau
from nanospec.training.train_loop import train
from nanospec.training.train_model import (collate, full_vocab_accuracy, head_loss, init_head_from_target, make_batches,
                          sampled_vocab, unrolled_forward)

__all__ = ["Sample", "answer_samples", "generate_answers", "stdlib_sequences", "teacher_forced_samples",
           "evaluate_tau", "train", "collate", "full_vocab_accuracy", "head_loss", "init_head_from_target",
           "make_batches", "sampled_vocab", "unrolled_forward", "main", "build_parser"]

DEFAULT_OUT = ASSETS / "heads" / "smollm2-135m-eagle"
CACHE_VERSION = 2


# ---- CLI ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanospec train-head", description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("eagle2", "eagle3"), default="eagle2",
                   help="eagle2: this pipeline (EAGLE-1/2 head); eagle3: see `train-head --arch eagle3 --help`")
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
    from nanospec.loaders.default_model import cache_root

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


def _check_args(args) -> None:
    if (min(args.instructions, args.open_instructions, args.open_rounds, args.unroll_epochs) < 0
            or args.epochs < (0 if args.init_head else 1) or args.max_new_tokens < 2 or args.unroll_steps < 2):
        raise ValueError("--instructions, --open-instructions, --open-rounds and --unroll-epochs must be >= 0, "
                         "--epochs >= 1 (>= 0 with --init-head), --unroll-steps >= 2 and --max-new-tokens >= 2")
    if args.init_head and not (Path(args.init_head) / "config.json").is_file():
        raise FileNotFoundError(f"--init-head: no head (config.json) in {args.init_head}")


def _conversations(args) -> tuple[list, list]:
    """The train prompts plus the templated instructions, and the open-ended instructions (all rounds);
    none of them is a held-out prompt."""
    from nanospec.training.instructions import make_instructions
    from nanospec.training.open_instructions import make_open_instructions
    from nanospec.data.prompts import load_prompts, prompt_messages

    heldout = [prompt_messages(p) for p in load_prompts(split="heldout")]
    convs = [prompt_messages(p) for p in load_prompts(split="train")]
    convs += make_instructions(args.instructions, seed=args.seed, exclude=heldout + convs)
    # one seeded list cut into rounds: make_open_instructions(n) is a prefix of make_open_instructions(2n)
    opens = make_open_instructions(args.open_instructions * args.open_rounds, seed=args.seed, exclude=heldout + convs)
    return convs, opens


def _target_answers(args, loaded, convs, opens, cache: Path, show: bool, times: dict) -> list[Sample]:
    """The target's answers to the templated instructions, then to each round of open instructions."""
    target, tokenizer = loaded.model, loaded.tokenizer
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
    return answers


def _text_samples(args, target, tokenizer, cache: Path, show: bool, times: dict) -> list[Sample]:
    """Teacher-forced Python stdlib chunks (cached in ``text.pt``); none with ``--text-tokens 0``."""
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
    return text


def _split_answers(args, answers: list[Sample]) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """(answers, validation, training answers): seeded shuffle, 1/32 held for validation."""
    if args.prompt_loss:
        answers = [Sample(s.ids, s.feats, 0) for s in answers]
    rng = random.Random(args.seed)
    rng.shuffle(answers)
    n_val = max(1, len(answers) // 32)
    return answers, answers[:n_val], answers[n_val:]


def _train_head(args, target, train_set, val, cache: Path, show: bool, times: dict):
    """The one-step epochs, then the unrolled ones; returns (head, merged training stats)."""
    t0 = time.perf_counter()
    if args.init_head:
        head = load_head(args.init_head, target=target, dtype=torch.float32).train().requires_grad_(True)
    else:
        head = init_head_from_target(target, args.seed)
    frequent = frequent_ids(args.frequent, target.config.vocab_size)
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
    return head, stats


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--arch", choices=("eagle2", "eagle3"), default="eagle2")
    known, rest = pre.parse_known_args(argv)
    if known.arch == "eagle3":
        from nanospec.training.eagle3_cli import main as eagle3_main
        return eagle3_main(rest)
    args = build_parser().parse_args(argv)
    _check_args(args)
    settings = parse_tree_settings(args.eval) if args.eval else []
    torch.set_num_threads(args.threads)
    show = not args.no_progress
    if args.eval_only:
        evals = evaluate_tau(Path(args.out), settings, args.eval_tokens, args.eval_limit, show)  # '' = top-1 only
        print(json.dumps([{k: v for k, v in e.items()} for e in evals], indent=2))
        return 0
    from nanospec.loaders.loading import load_target

    loaded = load_target(args.model, device="cpu", dtype="float32")
    cache = _cache_dir(args, loaded.name)
    convs, opens = _conversations(args)
    times = {}
    answers = _target_answers(args, loaded, convs, opens, cache, show, times)
    convs += opens
    text = _text_samples(args, loaded.model, loaded.tokenizer, cache, show, times)
    answers, val, train_answers = _split_answers(args, answers)
    train_set = train_answers + text
    answer_tokens = sum(len(s.ids) - 2 - s.start for s in answers)
    print(f"data: {len(convs)} instructions -> {len(answers)} answers ({answer_tokens} trained positions), "
          f"{len(text)} text chunks ({sum(len(s.ids) for s in text)} tokens); {len(val)} answers held for validation")

    head, stats = _train_head(args, loaded.model, train_set, val, cache, show, times)
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
