"""Whether timings can be trusted: one judgement for every tool that shows speeds.

Speeds measured on a shared machine can be noise. Three front ends ask, with the same bounds:
- the lesson recorder (`problems`): it runs the methods interleaved per prompt, `repeats` times,
  keeps for each run the repeat with the median tokens/s (`median_index`), measures around every
  run the share of the wall time this process actually computed (`cpu_share`: process CPU time /
  (wall time x torch threads); another job on the machine lowers it), and times a short
  plain-decoding calibration before and after the whole recording; it refuses to write a
  recording with any problem;
- `nanospec compare` (`assess_trust` per row, `trust_warnings` under the table);
- the app's Compare tab (`busy` with `SERVER_MIN_CPU_SHARE`, and `exceeds_tau`).
"""

from __future__ import annotations

import math
import statistics

from nanospec.timing import MIN_CPU_SHARE

MAX_SPREAD = 0.25      # `spread` of a run's tokens/s, or of its speedup, across repeats
MAX_DRIFT = 0.15       # a speed at the end vs at the start (the recording's calibration, compare's ar runs)
MAX_PROMPT_SPREAD = 1.0  # one repeat: the per-prompt speedups' spread across prompts
# a speculative step runs at least one target forward, as a plain step does, and emits τ tokens on average:
# a speedup well above τ means the ar timing it divides by was slowed by something else
TAU_SLACK = 1.25
# a live server's bound (the app while a run streams): the page's own work and the decode thread's
# single-threaded stretches keep an idle server's share well below a bare benchmark's
SERVER_MIN_CPU_SHARE = MIN_CPU_SHARE / 2


def busy(cpu_share: float | None, minimum: float = MIN_CPU_SHARE) -> bool:
    """The process computed less than `minimum` of the wall time while it was timed: another job
    shared the machine (None: not measured, so not judged)."""
    return cpu_share is not None and cpu_share < minimum


def exceeds_tau(speedup: float, tau: float | None) -> bool:
    """A speculative method's speedup above its τ x `TAU_SLACK`: impossible unless the ar timing it
    divides by was disturbed (NaN or None: nothing to judge)."""
    return (tau is not None and not math.isnan(tau) and not math.isnan(speedup)
            and speedup > tau * TAU_SLACK)


def spread(values: list[float]) -> float:
    """How far the repeats disagree, relative to their median (the value kept): the interquartile
    range / median from 4 repeats on (one outlying repeat does not move the median, so it does not
    count), (max - min) / median below that; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    if mid <= 0:
        return float("inf")
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return (q3 - q1) / mid
    return (max(values) - min(values)) / mid


def median_index(values: list[float]) -> int:
    """Index of the median value (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


def problems(runs: dict[str, dict], calibration: dict | None) -> list[str]:
    """Why a lesson recording cannot be trusted (empty: it can). `runs` maps "prompt/run" to the repeats'
    {"tokens_per_s": [...], "speedup": [...], "cpu_share": [...]}; `calibration` is
    {"before": tok/s, "after": tok/s}."""
    found = []
    for name, r in runs.items():
        if spread(r["tokens_per_s"]) > MAX_SPREAD:
            found.append(f"{name}: tokens/s varied {spread(r['tokens_per_s']):.0%} across repeats "
                         f"({', '.join(f'{v:.1f}' for v in r['tokens_per_s'])})")
        if r.get("speedup") and spread(r["speedup"]) > MAX_SPREAD:
            found.append(f"{name}: its speedup over ar varied {spread(r['speedup']):.0%} across repeats")
        low = min(r["cpu_share"], default=1.0)
        if busy(low):
            found.append(f"{name}: the process computed only {low:.0%} of the wall time (the machine was busy)")
    if calibration:
        before, after = calibration["before"], calibration["after"]
        drift = abs(after - before) / before if before > 0 else float("inf")
        if drift > MAX_DRIFT:
            found.append(f"plain decoding ran at {before:.1f} tok/s before the recording and {after:.1f} after "
                         f"({drift:.0%} apart): the machine's load changed")
    return found


def assess_trust(method: str, per_prompt_speedup: list[float], repeats: int, n_prompts: int, speedup: float,
                 tau: float | None, cpu_share: float | None, ar_drift: float | None) -> dict:
    """Whether a row's speed figures can be read as findings: {"trusted", "reasons" (why not), "notes"
    (what was not measured), "repeats", "speedup_spread", "cpu_share", "ar_drift"}.

    Untrusted when a prompt's speedup varied across repeats by more than `MAX_SPREAD` (with one
    repeat: the per-prompt speedups across prompts by more than `MAX_PROMPT_SPREAD`), when the
    process computed less than `MIN_CPU_SHARE` of the wall time while the row ran (a busy
    machine), when ar's speed drifted more than `MAX_DRIFT` between its first and last run, or
    when the speedup exceeds τ x `TAU_SLACK` (impossible unless the ar timing was disturbed)."""
    reasons, notes = [], []
    n = max(1, n_prompts)
    if repeats >= 2:
        groups = [per_prompt_speedup[i::n] for i in range(n)]
        spreads = [spread(g) for g in groups if len(g) >= 2]
        widest = max(spreads, default=0.0)
        if widest > MAX_SPREAD:
            worst = groups[spreads.index(widest)]
            reasons.append(f"its speedup on one prompt varied {widest:.0%} between repeats "
                           f"({', '.join(f'{v:.2f}x' for v in worst)})")
    else:
        widest = spread(per_prompt_speedup) if n_prompts >= 2 else None
        if widest is not None and widest > MAX_PROMPT_SPREAD:
            reasons.append(f"its per-prompt speedups disagree ({widest:.0%} spread over {n_prompts} prompts, "
                           f"{min(per_prompt_speedup):.2f}x to {max(per_prompt_speedup):.2f}x)")
        notes.append("1 repeat: run-to-run noise not measured (--repeat 3 measures it)")
    if busy(cpu_share):
        reasons.append(f"the process computed only {cpu_share:.0%} of the wall time while it ran (a busy machine)")
    if ar_drift is not None and ar_drift > MAX_DRIFT:
        reasons.append(f"ar's speed changed {ar_drift:.0%} between its first and last run")
    if method != "ar" and exceeds_tau(speedup, tau):
        reasons.append(f"its speedup {speedup:.2f}x exceeds its τ {tau:.2f}: a speculative step is not cheaper "
                       "than a plain one, so the ar timing was disturbed")
    return {"trusted": not reasons, "reasons": reasons, "notes": notes, "repeats": repeats,
            "speedup_spread": widest, "cpu_share": cpu_share, "ar_drift": ar_drift}


def trust_warnings(table: list[dict]) -> list[str]:
    """One warning line per row whose figures are not to be trusted (`assess_trust`); none when all are."""
    lines = []
    for row in table:
        trust = row.get("trust")
        if trust and not trust["trusted"]:
            lines.append(f"WARNING: {row['method']}: do not trust these figures: " + "; ".join(trust["reasons"])
                         + ". Re-run on an idle machine" + (" with --repeat 3" if trust["repeats"] < 2 else "") + ".")
    return lines
