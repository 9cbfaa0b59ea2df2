"""The project's metrics, each defined once (docs/design.md, "Metrics").

Everything that reports a number -- `events.summarize`, the benchmark tables
(`nanospec.bench.compare`), the app's KPIs, compare table and charts, the lesson -- computes it here.
The functions take plain per-step values (ints, flags), so a list of `StepEvent`s and a row of the
events frame (`events_to_frame`) feed them alike.

- **τ (tau)**: tokens emitted per target forward, averaged over decode steps (the bonus token
  counts, so plain decoding has τ = 1).
- **coverage**: share of target-emitted tokens that were in the active set when the tree was
  drafted. An accepted token the head drafted was in the set by construction; one the copy chain
  copied from the context may not be (a static set), so steps pass how many accepted tokens were
  outside (`n_outside`). The bonus token was in the set when the step's `coverage` flag is true.
  Steps that drafted nothing (`coverage` None) don't count.
- **speedup**: tokens/s of a method / tokens/s of autoregressive decoding (same prompt, same run).
- **decode tokens/s** and **time to first token**, as serving engines report them: tokens after the
  first over the time after prefill, and the prefill's own time (tokens/s counts the whole run).
- **identical to ar**: a greedy run's output equals autoregressive decoding's, token for token;
  undefined (None) when sampling, where only the distribution must match.
- **token origins**: which source supplied each emitted token (see `ORIGINS`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# -- token origins ---------------------------------------------------------------------------
# Where each emitted token came from. An accepted drafted token carries the name of the drafter
# that proposed it (`ORIGIN_HEAD` for the draft head; a drafter with another source, e.g. a
# context-copy chain, adds its own name to `ORIGINS` and passes it as `accepted_origins`); the
# token after the accepted path is the target's own (`ORIGIN_BONUS`), or `ORIGIN_VOCAB_MISS` when
# the drafter could not have proposed it because it was outside the active set.
ORIGIN_HEAD = "head"
ORIGIN_BONUS = "bonus"
ORIGIN_VOCAB_MISS = "vocab_miss"
ORIGINS: tuple[str, ...] = (ORIGIN_HEAD, ORIGIN_BONUS, ORIGIN_VOCAB_MISS)


def as_flag(value) -> bool | None:
    """A step's `coverage` as True / False / None; frames turn None into NaN and bools into numpy bools."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def step_origins(n_accepted: int, n_emitted: int, coverage, accepted_origins: Sequence[str] | None = None
                 ) -> list[str]:
    """Origin of each token one step emitted: its `n_accepted` drafted tokens (from `accepted_origins`,
    default all `ORIGIN_HEAD`), then the bonus token; `n_emitted` may be shorter (cut at EOS / budget)."""
    drafted = list(accepted_origins) if accepted_origins is not None else [ORIGIN_HEAD] * n_accepted
    if len(drafted) != n_accepted:
        raise ValueError(f"accepted_origins has {len(drafted)} entries; the step accepted {n_accepted} tokens")
    bonus = ORIGIN_VOCAB_MISS if as_flag(coverage) is False else ORIGIN_BONUS
    return (drafted + [bonus])[:n_emitted]


def token_origins(n_accepted: Iterable[int], n_emitted: Iterable[int], coverage: Iterable) -> list[str]:
    """`step_origins` of every step, concatenated in order (one entry per emitted token)."""
    out: list[str] = []
    for acc, emitted, cov in zip(n_accepted, n_emitted, coverage):
        out.extend(step_origins(int(acc), int(emitted), cov))
    return out


# -- tau --------------------------------------------------------------------------------------
def tau(emitted_per_step: Sequence[int]) -> float:
    """Mean tokens emitted per decode step (per target forward); NaN when there are no steps."""
    return sum(emitted_per_step) / len(emitted_per_step) if len(emitted_per_step) else math.nan


# -- coverage ---------------------------------------------------------------------------------
def step_coverage(n_accepted: int, coverage, n_outside: int = 0) -> tuple[int, int]:
    """(tokens that were in the active set, tokens counted) for one decode step; (0, 0) when the
    step drafted nothing (`coverage` None). `n_outside`: accepted tokens that were not in the set."""
    flag = as_flag(coverage)
    if flag is None:
        return 0, 0
    return int(n_accepted) - int(n_outside) + int(flag), int(n_accepted) + 1


def coverage(n_accepted: Iterable[int], flags: Iterable, n_outside: Iterable[int] | None = None) -> float | None:
    """Coverage over decode steps (`n_accepted[i]`, `flags[i]` = step i's `coverage`, `n_outside[i]`
    its accepted tokens outside the set, default none); None if none drafted."""
    running = running_coverage(n_accepted, flags, n_outside)
    return running[-1] if running else None


def running_coverage(n_accepted: Iterable[int], flags: Iterable, n_outside: Iterable[int] | None = None
                     ) -> list[float | None]:
    """Coverage after each step (None until the first step that drafted)."""
    in_set = counted = 0
    out: list[float | None] = []
    n_accepted = list(n_accepted)
    outside = [0] * len(n_accepted) if n_outside is None else list(n_outside)
    for acc, flag, off in zip(n_accepted, flags, outside):
        i, c = step_coverage(acc, flag, off)
        in_set, counted = in_set + i, counted + c
        out.append(in_set / counted if counted else None)
    return out


# -- speedup and exactness ----------------------------------------------------------------------
def speedup(tokens_per_s: float, ar_tokens_per_s: float | None) -> float:
    """tokens/s of a method over autoregressive tokens/s; NaN when there is no positive `ar` rate."""
    if not ar_tokens_per_s or ar_tokens_per_s <= 0:
        return math.nan
    return tokens_per_s / ar_tokens_per_s


def identical_to_ar(output, ar_output, greedy: bool = True) -> bool | None:
    """Greedy: whether `output` equals `ar_output` exactly (token ids, or a list of such outputs, one
    per prompt, in the same order and number). Sampling: None (only the distribution must match)."""
    if not greedy:
        return None
    return list(output) == list(ar_output)


def decode_tokens_per_s(new_tokens: int, wall_s: float, prefill_s: float) -> float:
    """Tokens emitted after the first one (prefill emits one) per second of decoding after prefill;
    NaN when nothing was decoded."""
    decode_s = wall_s - prefill_s
    return (new_tokens - 1) / decode_s if new_tokens > 1 and decode_s > 0 else math.nan
