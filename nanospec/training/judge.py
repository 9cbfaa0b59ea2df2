"""Judging a training round's head against the shipped one, in one run: per prompt `ar`, then `nanospec` with
each head (their order alternating from prompt to prompt), on the same target, with the engine's defaults
(on a CPU: the draft budget and the copy chain on), greedy. Every output must equal `ar`'s.

    python -m nanospec.training.judge --candidate train_runs/smollm2-135m/round-002/head \\
        [--shipped assets/heads/smollm2-135m-eagle] [--sets heldout,assets/prompts/outside.jsonl] \\
        [--max-new-tokens 128] [--budget on|off] [--repeat 1] [--out train_runs/smollm2-135m/round-002/JUDGED.md]

A round ships only if its head is faster than the shipped one on every set (the median over prompts of
tokens/s over `ar`'s on the same prompt, both heads measured against the same `ar` run); τ is reported
beside it. `--budget off` judges both heads on the device's fixed default tree instead (the draft budget
off, everything else the defaults): τ there is the head's own acceptance, not the budget's choice of tree.
Nothing is copied or shipped by this command: it prints (and with `--out` writes) the table
and the verdict.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanospec import metrics

DEFAULT_SETS = "heldout,assets/prompts/outside.jsonl"


@dataclass
class HeadRun:
    """One head on one prompt set: per prompt speed-up over `ar`, tokens per step, and what a step cost."""

    speedups: list[float] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)   # tokens per target forward, every step pooled
    verified: list[int] = field(default_factory=list)  # tokens the target verified per step (root included)
    step_ms: list[float] = field(default_factory=list)  # wall ms per decode step, every step pooled
    tps: list[list[float]] = field(default_factory=list)  # per prompt: tokens/s of each of its runs
    accepted: list[int] = field(default_factory=list)   # drafted tokens accepted per step, every step pooled
    identical: int = 0
    by_category: dict[str, list[float]] = field(default_factory=dict)  # per prompt category: each run's τ

    @property
    def speedup(self) -> float:
        return statistics.median(self.speedups) if self.speedups else float("nan")

    @property
    def tau(self) -> float:
        return metrics.tau(self.emitted)

    @property
    def verified_per_step(self) -> float:
        return metrics.mean(self.verified)

    @property
    def ms_per_step(self) -> float:
        return metrics.mean(self.step_ms)

    def reach(self, depths: int) -> list[float]:
        """Entry d - 1 (d = 1..depths): the share of steps that accepted at least d drafted tokens."""
        counts = metrics.accepted_depth_counts(self.accepted, max_depth=depths)
        return [c / counts[0] if counts[0] else float("nan") for c in counts[1:]]

    def category_tau(self, category: str) -> float:
        """The mean of the category's per-prompt τ (each prompt weighing the same), as `compare`'s rows."""
        return metrics.mean_tau(self.by_category.get(category, []))


def judge_set(engines: dict, prompts: list, max_new_tokens: int, progress=None, budget: bool = True,
              categories: list[str] | None = None, repeat: int = 1) -> tuple[float, dict[str, HeadRun]]:
    """`engines`: name -> SpecEngine (the same target, one head each; the first also runs `ar`). Returns
    the median `ar` tokens/s and each head's run; `budget=False` drafts the fixed default tree.
    `categories` (one per prompt) also keeps each run's τ by category. With `repeat` > 1 every
    prompt runs that many times (the heads' order alternating between them too); a prompt's speed-up is
    the median of its runs', and it counts as identical only if every run's output was."""
    ar_engine = next(iter(engines.values()))
    runs = {name: HeadRun() for name in engines}
    ar_tps = []
    ids = [ar_engine.encode_prompt(p) for p in prompts]
    for engine in engines.values():  # warm-up (allocators, kernels, each head's budget statistics start)
        engine.generate(ids[0], method="nanospec", max_new_tokens=4, budget=budget)
    speedups = {name: [[] for _ in ids] for name in engines}    # per head, per prompt: one per run
    tps = {name: [[] for _ in ids] for name in engines}         # the same, tokens/s
    identical = {name: [True] * len(ids) for name in engines}   # per head, per prompt: every run so far
    for r in range(repeat):
        for i, p in enumerate(ids):
            ar = ar_engine.generate(p, method="ar", max_new_tokens=max_new_tokens)
            ar_tps.append(ar.summary.tokens_per_s)
            order = list(engines.items()) if (i + r) % 2 == 0 else list(engines.items())[::-1]
            for name, engine in order:
                result = engine.generate(p, method="nanospec", max_new_tokens=max_new_tokens, budget=budget)
                speedups[name][i].append(metrics.speedup(result.summary.tokens_per_s, ar.summary.tokens_per_s))
                tps[name][i].append(result.summary.tokens_per_s)
                identical[name][i] &= result.token_ids == ar.token_ids
                decode = [e for e in result.events if not e.is_prefill]
                emitted = [e.n_emitted for e in decode]
                runs[name].emitted += emitted
                runs[name].verified += [len(e.tree_tokens) for e in decode]
                runs[name].step_ms += [e.wall_ms for e in decode]
                runs[name].accepted += [len(e.accepted_tokens) for e in decode]
                if categories is not None:
                    runs[name].by_category.setdefault(categories[i], []).append(metrics.tau(emitted))
            if progress:
                progress(r * len(ids) + i + 1, repeat * len(ids))
    for name, run in runs.items():
        run.speedups = [statistics.median(runs_of_prompt) for runs_of_prompt in speedups[name]]
        run.tps = tps[name]
        run.identical = sum(identical[name])
    return statistics.median(ar_tps), runs


def paired(shipped: HeadRun, candidate: HeadRun) -> list[float]:
    """Per prompt: the median over its runs of candidate ÷ shipped tokens/s, the two heads' runs of one prompt
    side by side (no `ar` run in the ratio, so less noise than comparing two speed-ups)."""
    return [statistics.median(c / s for c, s in zip(c_runs, s_runs))
            for c_runs, s_runs in zip(candidate.tps, shipped.tps)]


def verdict(results: dict[str, tuple[float, dict[str, HeadRun]]]) -> tuple[bool, str]:
    """Ships only if the candidate is faster than the shipped head on every set, every output identical."""
    faster = [runs["candidate"].speedup > runs["shipped"].speedup for _, runs in results.values()]
    exact = all(r.identical == len(r.speedups) for _, runs in results.values() for r in runs.values())
    if not exact:
        return False, "not shipped: an output differs from ar (a bug to fix before any judgement)"
    if all(faster):
        return True, "ships: faster than the shipped head on every set"
    slower = [name for name, ok in zip(results, faster) if not ok]
    return False, f"not shipped: not faster than the shipped head on {', '.join(slower)}"


def report(results: dict, heads: dict[str, str], command: str, machine: str, max_new_tokens: int,
           budget: bool = True, repeat: int = 1) -> str:
    setting = "defaults" if budget else "defaults but a fixed tree (draft budget off)"
    runs = "one run" if repeat == 1 else f"{repeat} runs per prompt (a prompt's speed-up: the median of its runs')"
    lines = [f"Judged {time.strftime('%Y-%m-%d')} on {machine}, greedy, {max_new_tokens} new tokens, the engine's "
             f"{setting}, {runs}, both heads against the same `ar` run of each prompt:", "", "```bash", command, "```", "",
             "| prompts | head | `ar` tok/s | speedup vs `ar` | τ | verified per step | ms per step | identical to `ar` |",
             "|---|---|---|---|---|---|---|---|"]
    for name, (ar_tps, runs) in results.items():
        for head, run in runs.items():
            lines.append(f"| {name} ({len(run.speedups)}) | {head} (`{heads[head]}`) | {ar_tps:.2f} | "
                         f"{run.speedup:.2f}× | {run.tau:.2f} | {run.verified_per_step:.1f} | {run.ms_per_step:.1f} | "
                         f"{run.identical}/{len(run.speedups)} |")
    lines += ["", "Verified per step: the tokens each target forward checked (the root included); ms per step: a decode "
                  "step's mean wall time (drafting, verification and bookkeeping). Speed-up follows τ ÷ ms per step."]
    _, why = verdict(results)
    return "\n".join(lines + paired_lines(results) + depth_lines(results) + category_lines(results)
                     + ["", f"Verdict: **{why}**.", ""])


def paired_lines(results: dict) -> list[str]:
    """Per set, the two heads prompt by prompt: the median of `paired` and on how many prompts the candidate won."""
    lines = []
    for name, (_, runs) in results.items():
        ratios = paired(runs["shipped"], runs["candidate"])
        if ratios:
            lines += ["", f"{name}, prompt by prompt (candidate ÷ shipped tokens/s, the two heads' runs of a prompt side "
                          f"by side): median {statistics.median(ratios):.3f}×, candidate faster on "
                          f"{sum(r > 1 for r in ratios)} of {len(ratios)} prompts."]
    return lines


REACH_DEPTHS = 4  # the CPU's default tree drafts 3 levels; the copy chain goes deeper


def depth_lines(results: dict) -> list[str]:
    """Where τ is lost: for each head, the share of steps that accepted at least d drafted tokens, and of
    those that reached depth d - 1, the share that went on (where the head's own predicted features start)."""
    rows = []
    for name, (_, runs) in results.items():
        for head, run in runs.items():
            if not run.accepted:
                continue
            reach = run.reach(REACH_DEPTHS)
            went_on = [reach[0], *(b / a if a else None for a, b in zip(reach, reach[1:]))]
            cells = (f"{r:.2f} ({g:.2f})" if g is not None else f"{r:.2f} (–)" for r, g in zip(reach, went_on))
            rows.append(f"| {name} | {head} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    header = " | ".join(f"≥ {d}" for d in range(1, REACH_DEPTHS + 1))
    return ["", "Acceptance by depth: the share of steps that accepted at least d drafted tokens (in brackets: of "
                "the steps that reached d - 1, the share that went on to d):", "",
            f"| prompts | head | {header} |", "|---|---|" + "---|" * REACH_DEPTHS, *rows]


def category_lines(results: dict) -> list[str]:
    """τ by prompt category for each head (the mean of its prompts' τ), where known."""
    rows = []
    for name, (_, runs) in results.items():
        shipped, candidate = runs["shipped"], runs["candidate"]
        for category in sorted(shipped.by_category):
            rows.append(f"| {name} | {category} | {shipped.category_tau(category):.2f} | "
                        f"{candidate.category_tau(category):.2f} |")
    if not rows:
        return []
    return ["", "τ by category (the mean of the category's per-prompt τ, each prompt weighing the same, as "
                "`compare`'s category rows):", "",
            "| prompts | category | shipped τ | candidate τ |", "|---|---|---|---|", *rows]


def load_sets(spec: str) -> dict[str, list[dict]]:
    """'heldout' (the project's split) or a JSONL path, comma-separated -> name -> prompt items, as
    `load_prompts` gives them (`category` may be absent in a user's file); `prompt_input(item)` is what the
    engine reads."""
    from nanospec.data.prompts import load_prompts
    sets = {}
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        items = load_prompts(item) if item.endswith(".jsonl") else load_prompts(split=item)
        if not items:
            raise ValueError(f"--sets: {item!r} holds no prompts (a split of the project's set or a JSONL file)")
        sets[Path(item).stem if item.endswith(".jsonl") else item] = items
    return sets


def engines_for(shipped: str, candidate: str):
    """The default target with the shipped head, and a second engine on the same target with the candidate."""
    from nanospec.decoding.engine import SpecEngine
    from nanospec.heads.head import load_head
    from nanospec.pair import load_pair

    engine, info = load_pair(head=shipped)
    dtype = engine.model.get_input_embeddings().weight.dtype
    head = load_head(candidate, target=engine.model, device=engine.device, dtype=dtype)
    other = SpecEngine(engine.model, engine.tokenizer, head, frequent_ids=engine.frequent_ids,
                       eos_token_ids=sorted(engine.eos_token_ids))
    return {"shipped": engine, "candidate": other}, info


def main(argv: list[str] | None = None) -> int:
    from nanospec.data.prompts import prompt_input
    from nanospec.lesson.record import machine_label

    ap = argparse.ArgumentParser(prog="python -m nanospec.training.judge", description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", required=True, help="the round's head folder (EAGLE-1/2 layout)")
    ap.add_argument("--shipped", default="assets/heads/smollm2-135m-eagle", help="the head it must beat")
    ap.add_argument("--sets", default=DEFAULT_SETS, help="prompt sets: a split name or a JSONL file, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", choices=("on", "off"), default="on",
                    help="off: both heads on the fixed default tree (τ = the head's own acceptance)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per prompt (the heads' order alternating); a prompt's speed-up is their median")
    ap.add_argument("--out", default=None, help="also write the table and verdict to this Markdown file")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {a.repeat}")
    for flag, folder in (("--candidate", a.candidate), ("--shipped", a.shipped)):
        if not (Path(folder) / "config.json").exists():
            raise SystemExit(f"{flag}: {folder} is not a head folder (no config.json)")
    sets = load_sets(a.sets)
    engines, _ = engines_for(a.shipped, a.candidate)
    results, budget = {}, a.budget == "on"
    for name, items in sets.items():
        print(f"{name}: {len(items)} prompts", file=sys.stderr)
        results[name] = judge_set(engines, [prompt_input(x) for x in items], a.max_new_tokens,
                                  lambda i, n: print(f"  prompt {i}/{n}", file=sys.stderr), budget=budget,
                                  categories=[str(x.get("category") or "-") for x in items], repeat=a.repeat)
    label = machine_label()
    command = "python -m nanospec.training.judge " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, {"shipped": a.shipped, "candidate": a.candidate}, command,
                  f"{label['cpu']} ({label['cpu_count']} cores, {label['torch_threads']} threads)", a.max_new_tokens,
                  budget=budget, repeat=a.repeat)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
