"""A lesson recording is kept only if its timings are steady: figures a class is taught must not be
noise of a busy machine.

The recorder runs the methods interleaved per prompt, `repeats` times, and keeps for each run the
repeat with the median tokens/s. It measures, around every run, the share of the wall time this
process actually computed (`cpu_share`: process CPU time / (wall time x torch threads); another job
on the machine lowers it), and it times a short plain-decoding calibration before and after the
whole recording. `problems()` lists every reason not to trust the result; the recorder refuses to
write a recording that has any.
"""

from __future__ import annotations

import statistics

from nanospec.timing import MIN_CPU_SHARE

MAX_SPREAD = 0.25      # `spread` of a run's tokens/s, or of its speedup, across repeats
MAX_DRIFT = 0.15       # calibration speed after the recording vs before


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
    """Why a recording cannot be trusted (empty: it can). `runs` maps "prompt/run" to the repeats'
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
        if low < MIN_CPU_SHARE:
            found.append(f"{name}: the process computed only {low:.0%} of the wall time (the machine was busy)")
    if calibration:
        before, after = calibration["before"], calibration["after"]
        drift = abs(after - before) / before if before > 0 else float("inf")
        if drift > MAX_DRIFT:
            found.append(f"plain decoding ran at {before:.1f} tok/s before the recording and {after:.1f} after "
                         f"({drift:.0%} apart): the machine's load changed")
    return found
