"""The project's metrics, each defined once (docs/design.md, "Metrics").

Everything that reports a number -- `events.summarize`, the benchmark tables
(`nanospec.bench.compare`), the app's KPIs, compare table and charts, the lesson -- computes it here.
The functions take plain per-step values (ints, flags), so a list of `StepEvent`s and a row of the
events frame (`events_to_frame`) feed them alike.

- **τ (tau)**: tokens emitted per target forward, averaged over decode steps (the bonus token
  counts, so plain decoding has τ = 1). Several runs pool their decode steps (`tau` of the
  concatenation); `mean_tau` is the mean of per-prompt τ, where each prompt should weigh the same
  (per-category rows, the held-out evaluation).
- **tokens/s**: tokens emitted (prefill's included) over the run's wall time; **mean active size**:
  rows the drafter scored, averaged over decode steps (pooled like τ).
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
- **empty runs**: a mean or rate over nothing -- τ, mean active size or per-step times of a run
  without a decode step, tokens/s without measured time, any of them over no runs -- is NaN
  (undefined; never a made-up 0 or 1; tables print it as "-"); coverage with no drafted step is
  None; counts are 0.
- **acceptance by depth**: per depth d, the decode steps that accepted at least d drafted tokens
  (`accepted_depth_counts`); over all steps, the acceptance rate at each draft position.
- **break-even τ**: the τ at which a speculative step emits tokens exactly as fast as plain
  decoding: (the step's verification forward + its drafting + its bookkeeping) / a plain step's
  time. Above it speculation pays. **modelled speed-up** = τ × plain step / speculative step: what
  a method's τ and per-step times predict (the lesson checks it against the measured tokens/s).
- **token origins**: which source supplied each emitted token, one of `ORIGINS` (head, copy, both,
  retrieved, bonus, vocab_miss); `event_origins(event)` gives them for a `StepEvent`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# -- token origins ---------------------------------------------------------------------------
# The one vocabulary of where an emitted token came from. An accepted draft token's origin is the
# source of its tree node (`StepEvent.tree_sources`, `copy_branch.SOURCE_NAMES` less root / pad):
# the draft head, the context-copy chain, or both (the head drafted what the chain proposed), or the
# store of the target's past answers alone (`retrieved`; a node it shares with another keeps that label). The
# token after the accepted path is the target's own: `ORIGIN_BONUS`, or `ORIGIN_VOCAB_MISS` when it
# was outside the active set when the tree was drafted (the step's `coverage` is False; every
# `miss_kind == "vocab"` step is one, and so is a path that ended at a leaf on such a token), so the
# drafter could not have proposed it. Prefill and autoregressive steps emit bonus tokens only.
ORIGIN_HEAD = "head"
ORIGIN_COPY = "copy"
ORIGIN_BOTH = "both"
ORIGIN_RETRIEVED = "retrieved"
ORIGIN_BONUS = "bonus"
ORIGIN_VOCAB_MISS = "vocab_miss"
DRAFT_ORIGINS: tuple[str, ...] = (ORIGIN_HEAD, ORIGIN_COPY, ORIGIN_BOTH, ORIGIN_RETRIEVED)  # accepted draft tokens
ORIGINS: tuple[str, ...] = (*DRAFT_ORIGINS, ORIGIN_BONUS, ORIGIN_VOCAB_MISS)


def as_flag(value) -> bool | None:
    """A step's `coverage` as True / False / None; frames turn None into NaN and bools into numpy bools."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def accepted_origins(accepted_path: Sequence[int], tree_sources: Sequence[str]) -> list[str]:
    """Origin (one of `DRAFT_ORIGINS`) of each accepted draft token: its node's source, for the nodes
    of `accepted_path` after the root; `ORIGIN_HEAD` when `tree_sources` lacks it (traces saved
    before the copy branch existed)."""
    return [tree_sources[i] if i < len(tree_sources) else ORIGIN_HEAD for i in list(accepted_path)[1:]]


def step_origins(n_accepted: int, n_emitted: int, coverage, accepted_origins: Sequence[str] | None = None
                 ) -> list[str]:
    """Origin of each token one step emitted: its `n_accepted` drafted tokens (from `accepted_origins`,
    default all `ORIGIN_HEAD`), then the bonus token; `n_emitted` may be shorter (cut at EOS / budget)."""
    drafted = list(accepted_origins) if accepted_origins is not None else [ORIGIN_HEAD] * n_accepted
    if len(drafted) != n_accepted:
        raise ValueError(f"accepted_origins has {len(drafted)} entries; the step accepted {n_accepted} tokens")
    bonus = ORIGIN_VOCAB_MISS if as_flag(coverage) is False else ORIGIN_BONUS
    return (drafted + [bonus])[:n_emitted]


def event_origins(event) -> list[str]:
    """Origin (one of `ORIGINS`) of each token in a `StepEvent`'s `tokens`, in order: accepted draft
    tokens by their node's source (head / copy / both), then the bonus token (bonus, or vocab_miss
    when the step's `coverage` is False). A step cut at EOS or at the token budget has fewer."""
    return step_origins(len(event.accepted_tokens), len(event.tokens), event.coverage,
                        accepted_origins(event.accepted_path, event.tree_sources))


def token_origins(n_accepted: Iterable[int], n_emitted: Iterable[int], coverage: Iterable,
                  accepted: Iterable[Sequence[str]] | None = None) -> list[str]:
    """`step_origins` of every step, concatenated in order (one entry per emitted token); `accepted`:
    each step's `accepted_origins` (default: every accepted token `ORIGIN_HEAD`)."""
    out: list[str] = []
    n_accepted = list(n_accepted)
    per_step = [None] * len(n_accepted) if accepted is None else list(accepted)
    for acc, emitted, cov, drafted in zip(n_accepted, n_emitted, coverage, per_step):
        out.extend(step_origins(int(acc), int(emitted), cov, drafted))
    return out


# -- means, tau, tokens/s, active size --------------------------------------------------------
def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values (the module's convention for an empty run)."""
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def tau(emitted_per_step: Iterable[int]) -> float:
    """Mean tokens emitted per decode step (per target forward), pooled over every step passed (one
    run's, or several runs' concatenated); NaN when there are no decode steps."""
    return mean(emitted_per_step)


def mean_tau(per_run_tau: Iterable[float]) -> float:
    """Mean of per-run (per-prompt) τ, each run weighing the same whatever its length; runs without
    a decode step (τ NaN) are left out; NaN when none is left."""
    return mean(t for t in per_run_tau if t is not None and not math.isnan(t))


def tokens_per_s(new_tokens: int, wall_s: float) -> float:
    """Tokens emitted (prefill's included) per second of the whole run; NaN when no time was measured."""
    return new_tokens / wall_s if wall_s > 0 else math.nan


def mean_active(active_per_step: Iterable[int]) -> float:
    """Mean active size (rows the drafter scored) per decode step, pooled over every step passed;
    NaN when there are no decode steps."""
    return mean(active_per_step)


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


def accepted_depth_counts(accepted_per_step: Iterable[int], max_depth: int | None = None) -> list[int]:
    """The per-depth acceptance histogram serving engines report: entry d (d = 1, 2, ...) is how many
    decode steps accepted a draft at depth d, i.e. at least d drafted tokens (entry 0: all steps).
    Divided by entry 0 it is the acceptance rate by position."""
    steps = list(accepted_per_step)
    top = max(steps, default=0) if max_depth is None else max_depth
    return [sum(n >= d for n in steps) for d in range(top + 1)]


# -- when speculation pays -------------------------------------------------------------------------
def speculative_step_ms(verify_ms: float, draft_ms: float, other_ms: float = 0.0) -> float:
    """The wall time of one speculative step: its verification forward, its drafting, its bookkeeping."""
    return verify_ms + draft_ms + other_ms


def break_even_tau(plain_step_ms: float, verify_ms: float, draft_ms: float, other_ms: float = 0.0) -> float:
    """τ above which a speculative step beats plain decoding (one token per `plain_step_ms`); NaN
    without a positive plain step time."""
    if not plain_step_ms or plain_step_ms <= 0:
        return math.nan
    return speculative_step_ms(verify_ms, draft_ms, other_ms) / plain_step_ms


def modelled_speedup(tau_value: float, plain_step_ms: float, verify_ms: float, draft_ms: float,
                     other_ms: float = 0.0) -> float:
    """The speed-up over plain decoding that τ and the per-step times predict: τ tokens per speculative
    step against one token per plain step. NaN when a time is not positive."""
    step = speculative_step_ms(verify_ms, draft_ms, other_ms)
    if step <= 0 or not plain_step_ms or plain_step_ms <= 0:
        return math.nan
    return tau_value * plain_step_ms / step
