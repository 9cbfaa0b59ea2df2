"""Predict, then reveal: one question per chapter (2-9) about its recorded run, answered with one click.

Each `*_question(lesson, run) -> Question` reads the question, its options, the right answer and a
sentence of why off the trace itself (nothing is typed in by hand), so a re-recording changes them
with the data. `run` is the chapter's recorded run; `Question.step` is the step the chapter shows
once the question is answered (the one the question is about).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from nanospec.timing import DRAFT_PHASES

from app.charts import token_label
from app.lesson.data import Lesson, LessonRun, budget_start, budget_step, busiest_early_step, decode_events, price, \
    run_locality

PHASE_WORDS = {"draft_layers": "the draft layers (the small transformer)",
               "lm_head": "the LM head (scoring the vocabulary)",
               "gather_wait": "waiting for LM-head rows to be gathered",
               "topk": "picking the top-k candidates"}
QUESTION_PHASES = tuple(p for p in DRAFT_PHASES if p in PHASE_WORDS)
MISS_WORDS = {"none": "no miss: the accepted path ran to a leaf of the tree",
              "draft": "a draft miss: the token was in the active set but ranked too low",
              "vocab": "a vocab miss: the token was not in the active set"}
# half-open bins [previous upper, upper): the labels say where each boundary belongs (48 of 64 is
# "three quarters or more", not "more than three quarters")
SHARE_BINS = ((0.25, "under a quarter"), (0.5, "a quarter up to a half"), (0.75, "a half up to three quarters"),
              (1.01, "three quarters or more"))
ACTIVE_BINS = ((0.01, "under 1% of V"), (0.05, "1% up to 5% of V"), (0.25, "5% up to 25% of V"),
               (1.01, "25% of V or more"))


@dataclass(frozen=True)
class Question:
    text: str             # plain text (it is a radio button's label)
    options: list[str]
    answer: int           # index into options
    why: str              # Markdown: one sentence from the trace
    step: int             # the step this question is about

    def verdict(self, choice: str | None) -> str:
        """Markdown shown after a click: right or not, the answer and why."""
        right = self.options[self.answer]
        said = f"You said “{html.escape(str(choice))}”: "
        head = "<b>✓ right.</b>" if choice == right else f"<b>✗ the answer is “{html.escape(right)}”.</b>"
        return f"<div class='reveal'>{said}{head} {self.why}</div>"


def _q(run: LessonRun, token_id: int) -> str:
    return f"«{token_label(token_id, run.token_text)}»"


def _bin(value: float, bins) -> int:
    return next(i for i, (upper, _) in enumerate(bins) if value < upper)


def chain_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 2: how many of this step's drafted tokens will the target accept?"""
    e = run.event(busiest_early_step(run))
    drafted = e.tree_tokens[1:]
    n = len(e.accepted_tokens)
    own = " ".join(_q(run, t) for t in [*e.accepted_tokens, e.bonus_token])
    return Question(f"At step {e.step} the drafter proposes {' '.join(_q(run, t) for t in drafted)}. "
                    "How many of these will the target accept?",
                    [str(i) for i in range(len(drafted) + 1)], n,
                    f"The target's own next tokens were {html.escape(own)}: it agrees up to the first mismatch, "
                    f"so {n} drafted token{'s' if n != 1 else ''} survive and its own "
                    f"{html.escape(_q(run, e.bonus_token))} follows.", e.step)


def tree_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 3: how many tokens will one forward over this step's tree write?"""
    e = run.event(busiest_early_step(run))
    depth = max(e.tree_depths) if e.tree_depths else 0
    path = " → ".join(_q(run, t) for t in e.accepted_tokens) or "no drafted token"
    return Question(f"At step {e.step} the tree holds {len(e.tree_tokens) - 1} drafted tokens on {depth} levels. "
                    "How many tokens will this single target forward write?",
                    [str(i) for i in range(1, depth + 2)], len(e.accepted_tokens),
                    f"The longest branch the target agreed with was {html.escape(path)}, and the target adds "
                    f"its own {html.escape(_q(run, e.bonus_token))}: {len(e.accepted_tokens) + 1} tokens "
                    "from one forward.", e.step)


def _phase_totals(run: LessonRun) -> dict[str, float]:
    decode = run.frame[run.frame["step"] > 0]
    # the drafter phases the question names (a trace recorded without the copy branch has no copy_lookup)
    return {p: float(decode[f"phase_{p}"].sum()) if f"phase_{p}" in decode else 0.0 for p in QUESTION_PHASES}


def _phase_question(run: LessonRun, text: str, step: int) -> Question:
    totals = _phase_totals(run)
    top = max(totals, key=totals.get)
    draft = sum(totals.values())
    steps = max(1, len(decode_events(run)))
    why = (f"In this recording {PHASE_WORDS[top].split(' (')[0]} took {totals[top] / steps:.1f} ms of the "
           f"drafter's {draft / steps:.1f} ms per step ({totals[top] / draft:.0%}), measured by the engine's "
           "phase timer." if draft > 0 else "No draft time was recorded.")
    return Question(text, [PHASE_WORDS[p] for p in QUESTION_PHASES], list(QUESTION_PHASES).index(top), why, step)


def bottleneck_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 4: which phase takes most of the drafter's time with the full vocabulary?"""
    return _phase_question(run, f"The drafter scores all {run.summary.vocab_size:,} tokens of the vocabulary. "
                           "Which phase takes most of its time?", 1 if decode_events(run) else 0)


def system_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 8: and with NanoSpec's small active set?"""
    return _phase_question(run, f"NanoSpec's drafter scores only about {run.summary.mean_active:,.0f} rows. "
                           "Which phase takes most of its time now?", 1 if decode_events(run) else 0)


def locality_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 5: what share of the answer's tokens had been seen before they were written?"""
    kinds = run_locality(run)
    seen = sum(k != "new" for k in kinds) / max(1, len(kinds))
    return Question(f"This answer has {len(kinds)} tokens. How many of them had already appeared before they "
                    "were written (in the prompt, earlier in the answer, or among the target's earlier top-3 "
                    "guesses)?", [label for _, label in SHARE_BINS], _bin(seen, SHARE_BINS),
                    f"{sum(k != 'new' for k in kinds)} of {len(kinds)} ({seen:.0%}) had been seen before; only "
                    f"{sum(k == 'new' for k in kinds)} were new.", min(run.last_step, 8))


def active_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 6: how large is the active set, as a share of the vocabulary?"""
    frac = run.summary.active_frac
    return Question(f"The vocabulary has V = {run.summary.vocab_size:,} tokens. On average, how many rows does "
                    "NanoSpec's drafter score per step?", [label for _, label in ACTIVE_BINS],
                    _bin(frac, ACTIVE_BINS),
                    f"{run.summary.mean_active:,.0f} rows on average = {frac:.1%} of V: the prompt's tokens, the "
                    "tree's tokens and the target's top-3 guesses are enough.", 1 if decode_events(run) else 0)


def misses_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 7: at the first step that was not a clean run to a leaf, what kind of miss was it?"""
    decode = decode_events(run)
    e = next((x for x in decode if x.miss_kind != "none"), decode[0] if decode else run.events[0])
    options = list(MISS_WORDS)
    where = "in" if e.coverage else "not in"
    return Question(f"At step {e.step} the target accepted {len(e.accepted_tokens)} drafted token(s) and then "
                    f"wrote {_q(run, e.bonus_token)} itself. What kind of step was it?",
                    [MISS_WORDS[k] for k in options], options.index(e.miss_kind),
                    f"{html.escape(_q(run, e.bonus_token))} was {where} the active set when the tree was drafted "
                    f"({e.active_size:,} ids), so this step was {MISS_WORDS[e.miss_kind].split(':')[0]}.", e.step)


def budget_options(drafted: int) -> list[str]:
    """How many of `drafted` nodes the budget verifies, in four bins (half-open at half)."""
    return ["none: a plain step", "fewer than half", "half or more, but not all", f"all {drafted}"]


def budget_bin(kept: int, drafted: int) -> int:
    return 0 if kept == 0 else 3 if kept >= drafted else 1 if kept < drafted / 2 else 2


def budget_question(lesson: Lesson, run: LessonRun) -> Question:
    """Ch. 9: how many of this step's drafted nodes pay for their verification?"""
    step = budget_start(run)
    bs = budget_step(run, step)
    if bs is None:   # traces without a budgeted run: nothing to ask about
        return Question("Does this recording hold a run with the draft budget?", ["yes", "no"], 1,
                        "It does not: re-record the lesson.", step)
    best = bs.nodes[0].p if bs.nodes else 0.0
    above = ", ".join(f"{n.p:.2f}" for n in bs.kept)
    every = sum(bs.prices)
    return Question(f"At step {bs.step} the drafter drafted {len(bs.nodes)} nodes; the likeliest is accepted with "
                    f"chance p = {best:.2f}. This request writes {bs.rate * 1e3:.1f} tokens/s, and verifying all "
                    f"{len(bs.nodes)} would cost time worth {price(every)} tokens at that speed. How many drafted "
                    "nodes will the budget verify?",
                    budget_options(len(bs.nodes)), budget_bin(len(bs.kept), len(bs.nodes)),
                    f"{len(bs.kept)} of {len(bs.nodes)}{f' (p {above})' if above else ''}: their summed chance "
                    f"{bs.kept_chance:.2f} exceeds the {price(bs.kept_price)} tokens their time would earn by the most; "
                    "more nodes would have cost more time than the tokens they were likely to bring.", bs.step)

