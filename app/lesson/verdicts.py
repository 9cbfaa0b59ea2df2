"""Who is faster, and why, in sentences computed from the recording (never written by hand).

`pays(lesson, prompt, key)` measures one run against `ar`: its measured speed-up, the τ it reached, what a
step of it cost (verification, drafting, the rest) and the break-even τ those costs set
(`nanospec.metrics.break_even_tau`). `verdict` turns that into a sentence that says "faster" or "slower
than plain decoding" with the numbers, so a recording where a method loses is narrated as losing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nanospec import metrics

from app.lesson.data import RUN_LABELS, Lesson, LessonRun


@dataclass(frozen=True)
class Pays:
    key: str
    speedup: float        # measured: tokens/s over ar's
    tau: float
    plain_ms: float       # ar's mean decode step
    verify_ms: float      # mean verification forward per step
    draft_ms: float       # mean drafting per step
    other_ms: float       # the rest of a step (tree building, acceptance, cache, vocabulary upkeep)
    break_even: float     # τ above which the step's costs pay

    @property
    def step_ms(self) -> float:
        return metrics.speculative_step_ms(self.verify_ms, self.draft_ms, self.other_ms)

    @property
    def wins(self) -> bool:
        return self.speedup > 1.0


def step_costs(run: LessonRun) -> tuple[float, float, float]:
    """Mean ms per decode step: (verification forward, drafting, the rest)."""
    decode = run.frame[run.frame["step"] > 0]
    if decode.empty:
        return math.nan, math.nan, math.nan
    verify = float(decode["phase_verify_forward"].mean()) if "phase_verify_forward" in decode else 0.0
    draft = float(decode["draft_ms"].mean())
    return verify, draft, max(0.0, float(decode["wall_ms"].mean()) - verify - draft)


def plain_ms(run: LessonRun) -> float:
    decode = run.frame[run.frame["step"] > 0]
    return float(decode["wall_ms"].mean()) if not decode.empty else math.nan


def pays(lesson: Lesson, prompt_id: str, key: str) -> Pays | None:
    """One recorded run against the same prompt's `ar` run (None: either is missing)."""
    if not (lesson.has(prompt_id, key) and lesson.has(prompt_id, "ar")):
        return None
    run, ar = lesson.run(prompt_id, key), lesson.run(prompt_id, "ar")
    verify, draft, other = step_costs(run)
    plain = plain_ms(ar)
    return Pays(key, metrics.speedup(run.summary.tokens_per_s, ar.summary.tokens_per_s), run.summary.tau, plain,
                verify, draft, other, metrics.break_even_tau(plain, verify, draft, other))


def verdict(p: Pays) -> str:
    """Markdown: faster or slower than plain decoding, by how much, and why (τ against break-even)."""
    name = f"`{RUN_LABELS.get(p.key, p.key)}`"
    costs = (f"a step of it took {p.step_ms:.0f} ms (verification {p.verify_ms:.0f}, drafting {p.draft_ms:.0f}, "
             f"the rest {p.other_ms:.0f}) against {p.plain_ms:.0f} ms for a plain step, so it pays only above "
             f"τ = {p.break_even:.2f}")
    if p.wins:
        return f"{name} is **{p.speedup:.2f}× faster** than `ar` here: {costs}, and it reached τ = {p.tau:.2f}."
    return (f"{name} is **slower than plain decoding** here ({p.speedup:.2f}× `ar`): {costs}, and it reached only "
            f"τ = {p.tau:.2f}. Its output is still identical; on this machine its draft and verification cost "
            "more time than the extra tokens save.")


def verdicts(lesson: Lesson, prompt_id: str, keys: tuple[str, ...]) -> str:
    """One `verdict` per recorded run of `keys` (those recorded), as one paragraph."""
    found = [p for k in keys if (p := pays(lesson, prompt_id, k)) is not None]
    return " ".join(verdict(p) for p in found)
