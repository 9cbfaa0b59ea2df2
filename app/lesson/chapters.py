"""The lesson's chapters: each one object carrying its run, idea, figure, narration, token view and start step.

    c = chapter(3)
    c.figure(lesson, run, step, size)        # go.Figure, its text `size` px
    c.narrate(lesson, run, step)             # Markdown: what the chart shows at this step
    c.tokens(run, step)                      # HTML: the answer with the step's tokens highlighted
    c.start(run)                             # the step worth opening the chapter on

The module functions below (`chapter_text`, `chapter_figure`, ...) take (lesson, number, prompt id,
step) and look up the chapter's run; the Gradio tab (app/lesson/tab.py) calls only those.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from app import race
from app.inputs import DEFAULTS
from app.lesson import figures, narration, views, when_pays
from app.lesson import questions as q
from app.lesson.data import BUDGETED, SAMPLED, Lesson, LessonRun, budget_start, busiest_early_step, decode_events

FigureFn = Callable[[Lesson, LessonRun, int, int], go.Figure]   # (..., step, text size px)
NarrateFn = Callable[[Lesson, LessonRun, int], str]
TokensFn = Callable[[LessonRun, int], str]
StartFn = Callable[[LessonRun], int]
QuestionFn = Callable[[Lesson, LessonRun], "q.Question"]
RaceFn = Callable[[Lesson, str], str]


# -- where a chapter opens -------------------------------------------------------------------------
def first_decode_step(run: LessonRun) -> int:
    return 1 if decode_events(run) else 0


def eighth_step(run: LessonRun) -> int:
    return min(run.last_step, 8) if decode_events(run) else 0


def first_rejection(run: LessonRun) -> int:
    """The first sampled step where a drafted candidate was rejected before another was accepted (else the
    first step with any rejection, else the first decode step)."""
    trials = run.meta.get("trials") or []
    # a step that verified the root alone (the draft budget's plain step) tried nothing
    tried = [(t["step"], t["levels"][0]["tried"]) for t in trials if t.get("levels") and t["levels"][0].get("tried")]
    for step, tries in tried:
        if len(tries) > 1 and tries[-1]["accepted"]:
            return step
    return next((step for step, tries in tried if not tries[-1]["accepted"]), first_decode_step(run))


def race_lanes(lesson: Lesson, prompt_id: str) -> str:
    """The race of the recorded `ar`, `full` and `nanospec` runs of a prompt."""
    lanes = [race.lane(key, r.events, r.summary, r.pieces) for key in figures.RACE_RUNS
             if (r := lesson.runs.get((prompt_id, key))) is not None]
    label = lesson.info.get("machine") or {}
    machine, threads = html.escape(str(label.get("text"))), label.get("torch_threads")
    threads_text = f", {threads} torch thread{'s' if threads != 1 else ''}" if threads else ""
    return race.race_html(lanes, f"Recorded {lesson.info.get('recorded_at')} on {machine}{threads_text}, the "
                          "median-speed run of each method's repeats; each token appears when its step finished "
                          "in the recording.")


def first_vocab_miss(run: LessonRun) -> int:
    """The first step whose bonus token was a vocabulary miss (else the first decode step)."""
    miss = next((e.step for e in decode_events(run) if e.miss_kind == "vocab"), None)
    return miss if miss is not None else first_decode_step(run)


# -- the chapters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chapter:
    number: int
    title: str
    run: str     # the recorded run the step controls walk through
    idea: str    # a few plain sentences, one idea
    live: dict   # settings for "Try it live" (names match the app's controls)
    figure: FigureFn
    narrate: NarrateFn
    tokens: TokensFn
    start: StartFn
    question: QuestionFn | None = None   # predict, then reveal
    race: RaceFn | None = None           # race lanes shown above the chart
    timed: bool = False                  # the chart shows recorded times: it says so when the engine changed


# the engine's default tree, fixed (every drafted node verified) until the draft budget's chapter
_TREE = {**{k: DEFAULTS[k] for k in ("depth", "top_k", "total_tokens")}, "budget": False}
CHAPTERS = (
    Chapter(1, "Autoregressive decoding", "ar",
            "A language model writes **one token at a time**. For each token the big **target** model runs one "
            "full forward pass (earlier tokens are cached) and picks its most likely next token. So there are as "
            "many target forwards as tokens, and every forward costs about the same: the speed limit is **one "
            "token per forward**.",
            {"method": "ar", **_TREE},
            figures.ar_figure, narration.ar_now, views.target_view, first_decode_step, timed=True),
    Chapter(2, "Draft and verify", "greedy",
            "A small, cheap **drafter** guesses the next few tokens as a chain. The target then checks all guesses "
            "**in a single forward**: it keeps the longest prefix that matches what it would have written itself "
            "(**accepted**, green) and adds one token of its own after it (the **bonus** token, blue). Every kept "
            "token is exactly the target's own choice, so the text is **identical** to plain decoding (lossless) — "
            "only fewer forwards are needed.",
            {"method": "full", "depth": 5, "top_k": 1, "total_tokens": 6, "budget": False},
            figures.chain_figure, narration.chain_now, views.origin_view, busiest_early_step,
            q.chain_question),
    Chapter(3, "Draft trees", "full",
            "A chain is lost at its first wrong guess. A **draft tree** keeps several candidates at every level "
            f"(here the best {_TREE['top_k']} per level, {_TREE['depth']} levels, {_TREE['total_tokens'] - 1} drafted "
            "tokens) and the target verifies the **whole tree in "
            "one forward**: an attention mask lets each node see only its own ancestors. The longest branch the "
            "target agrees with is accepted (green path), so more tokens survive per forward.",
            {"method": "full", **_TREE},
            figures.tree_chapter_figure, narration.tree_now, views.origin_view, busiest_early_step,
            q.tree_question),
    Chapter(4, "The vocabulary bottleneck", "full",
            "To score its guesses the drafter multiplies its output by the **LM head**: one row for **every** "
            "token of the vocabulary (V = 49,152 here). That one matmul is a large share of the drafter's time, "
            "and it grows in step with V — and modern tokenizers have 128k to 256k tokens.",
            {"method": "full", **_TREE},
            figures.bottleneck_figure, narration.bottleneck_now, views.origin_view, first_decode_step,
            q.bottleneck_question, timed=True),
    Chapter(5, "Temporal locality", "ar",
            "The tokens a model writes are **rarely new**. Most already appeared in the prompt or earlier in the "
            "answer, or were among the target's own **top-3 guesses** at an earlier position. So the drafter "
            "does not need the whole vocabulary: the recent context already holds the likely candidates.",
            {"method": "nanospec", **_TREE},
            figures.locality_figure, narration.locality_now, views.locality_view, eighth_step,
            q.locality_question),
    Chapter(6, "NanoSpec's active vocabulary", "nanospec",
            "NanoSpec lets the drafter score only an **active set** of tokens. At prefill (**Ctx**) it adds every "
            "prompt token plus the target's top-3 guesses at every prompt position. After each verification "
            "(**Ext**) it adds every token of the draft tree plus the target's top-3 at every tree node. The set "
            f"only grows during a request (up to a capacity of {DEFAULTS['capacity']:,}, oldest out first) and starts "
            "fresh for the "
            "next request.",
            {"method": "nanospec", **_TREE},
            figures.active_set_figure, narration.active_now, views.origin_view, first_decode_step,
            q.active_question),
    Chapter(7, "Coverage misses", "nanospec",
            "If the token the target wants is **not** in the active set, the drafter cannot propose it: a **vocab "
            "miss** (red). The target still verifies over the full vocabulary, so it simply writes that token as "
            "the bonus — the output stays **exact**; we only lose the tokens that could have been accepted after "
            "it (a lower τ). A **draft miss** (yellow) is different: the token was in the set, the drafter just "
            "ranked it too low — that also happens with the full vocabulary.",
            {"method": "nanospec", **_TREE},
            figures.misses_figure, narration.misses_now, views.origin_view, first_vocab_miss,
            q.misses_question),
    Chapter(8, "The system side", "nanospec",
            "Scoring fewer rows helps only if keeping the set up to date is cheap. NanoSpec keeps the active LM-head "
            "rows in **one contiguous buffer** and copies in **only the new rows** each step. On a GPU that copy runs "
            "on a **side stream**, overlapping the draft layer, and the membership mask and id buffer **stay on "
            "the device**, so the loop never waits for the CPU.",
            {"method": "nanospec", **_TREE},
            figures.system_figure, narration.system_now, views.origin_view, first_decode_step,
            q.system_question, timed=True),
    Chapter(9, "The draft budget", BUDGETED,
            "A fixed tree verifies every drafted node, even one the target will almost surely reject, and on a "
            "CPU each verified token costs time. The **draft budget** weighs each node's p, its chance of being "
            "accepted (the drafter's confidence, corrected by how often this request accepted drafts at that "
            "depth), against its **price**: the tokens its share of the verification time would earn at the "
            "request's speed λ, read off the target's **measured** cost curve. It verifies the likeliest nodes, "
            "as many as make their summed p exceed their summed price by the most.",
            {"method": "nanospec", **_TREE, "budget": True},
            figures.budget_figure, narration.budget_now, views.origin_view, budget_start, q.budget_question,
            timed=True),
    Chapter(10, "Try it", "nanospec",
            "Now run it yourself. **Try it live ↗** (under the chart) opens the Live tab with this chapter's prompt and NanoSpec's "
            "settings. Switch the method to `full` or `ar` and compare: every method writes the **same text**; "
            "they differ in how many target forwards and how much draft time it takes.",
            {"method": "nanospec", **_TREE, "budget": DEFAULTS["budget"]},
            figures.try_figure, narration.try_now, views.origin_view, first_decode_step, timed=True),
    Chapter(11, "Sampling at temperature > 0", SAMPLED,
            "With temperature > 0 the target **samples** instead of taking its top token, so \"the same token\" "
            "no longer makes sense: speculative sampling must leave the **distribution** unchanged. The drafter "
            "still proposes its top candidates. The target tries them in order and accepts a candidate x with "
            "probability **p(x)**, its own probability for x. On rejection x is removed, the rest of p is "
            "renormalised and the next candidate is tried; if all are rejected, the token is drawn from what is "
            "left. Each token is therefore an exact draw from p.",
            {"method": "nanospec", **_TREE, "temperature": 0.8},
            figures.sampling_figure, narration.sampling_now, views.origin_view, first_rejection),
    Chapter(12, "The race", "nanospec",
            "The same prompt, three recorded runs, replayed **in the time they took**: plain autoregressive "
            "decoding (`ar`), the EAGLE-2 tree over the full vocabulary (`full`) and NanoSpec. Each token appears "
            "when the step that wrote it finished in the recording; no model runs here. Speculative runs write "
            "in bursts (one burst per target forward), and each lane shows its τ and tokens/s at the finish.",
            {"method": "nanospec", **_TREE},
            figures.race_figure, narration.race_now, views.origin_view, first_decode_step, race=race_lanes,
            timed=True),
    Chapter(13, "When does speculation pay?", "full",
            "A speculative step writes **τ tokens** in the time of one verification forward plus drafting; plain "
            "decoding writes **one token per plain step**. So speculation pays only when τ is larger than the "
            "step's cost counted in plain steps: the **break-even τ**. On a CPU verifying more tokens costs "
            "more (the measured curve, left); on a GPU it is nearly flat. The same head can lose on one machine "
            "and win on another.",
            {"method": "full", **_TREE},
            when_pays.when_pays_figure, when_pays.when_pays_now, views.origin_view, first_decode_step,
            when_pays.when_pays_question, timed=True),
)


def chapter(number: int) -> Chapter:
    if not isinstance(number, int) or not 1 <= number <= len(CHAPTERS):
        raise ValueError(f"chapter must be an integer in [1, {len(CHAPTERS)}]; got {number!r}")
    return CHAPTERS[number - 1]


def chapter_run(lesson: Lesson, number: int, prompt_id: str) -> LessonRun:
    """The run the chapter steps through (bundles recorded before the sampling or the budgeted run: the greedy
    nanospec run)."""
    key = chapter(number).run
    if key in (SAMPLED, BUDGETED) and not lesson.has(prompt_id, key):
        key = "nanospec"
    return lesson.run(prompt_id, key)


def chapter_text(lesson: Lesson, number: int, prompt_id: str, step: int) -> str:
    """Markdown: chapter heading, the idea, what the chart shows at this step, and where the trace came from."""
    c, run = chapter(number), chapter_run(lesson, number, prompt_id)
    return (f"## Chapter {c.number} · {c.title}\n\n{c.idea}\n\n{c.narrate(lesson, run, step)}\n\n"
            + narration.provenance(lesson, run))


def chapter_figure(lesson: Lesson, number: int, prompt_id: str, step: int, presenter: bool = False,
                   height: int | None = None, screen: int | None = None) -> go.Figure:
    """The chapter's chart at a step; `height` (px) fits it to the screen in lesson-first mode; in
    presenter mode its text grows with `screen`, the page height (px), see `figures.text_size`."""
    size = figures.text_size(presenter, screen)
    c = chapter(number)
    fig = c.figure(lesson, chapter_run(lesson, number, prompt_id), step, size)
    tag = lesson.info.get("engine_tag")
    if c.timed and tag:   # recorded times from another engine than this repository's: said on the chart
        # a second title line: plotly lifts a two-line title by half a line, so pad it down, and give the
        # margin above the plot that line's room (subplot titles sit right above the plot)
        fig.update_layout(title_text=f"{fig.layout.title.text}<br><span style='color:#b45309'>"
                                     f"{html.escape(tag)}</span>", title_pad_t=round(size * 1.0),
                          margin_t=(fig.layout.margin.t or 0) + round(size * 1.2))
    if height:
        # the title keeps ~5 px from the top edge whatever the height (0.99 of a short chart is 2 px: cut)
        fig.update_layout(height=height, title_y=min(0.99, 1 - 5 / height))
    return figures.fit_text(fig, size)


def predict_text(lesson: Lesson, number: int, prompt_id: str) -> str:
    """Markdown while the chapter's question is open: the idea, and a nudge to answer first."""
    c = chapter(number)
    return (f"## Chapter {c.number} · {c.title}\n\n{c.idea}\n\n<div class='predict'><b>Predict first:</b> answer "
            "the question below with one click; the chart and the numbers from the recorded run follow.</div>")


def chapter_tokens(lesson: Lesson, number: int, prompt_id: str, step: int) -> str:
    return chapter(number).tokens(chapter_run(lesson, number, prompt_id), step)


def chapter_steps(lesson: Lesson, number: int, prompt_id: str) -> int:
    """The last step of the chapter's run (the step slider's maximum)."""
    return chapter_run(lesson, number, prompt_id).last_step


def start_step(lesson: Lesson, number: int, prompt_id: str) -> int:
    """A step worth opening a chapter on: a multi-token step, or a vocab miss in chapter 7."""
    return chapter(number).start(chapter_run(lesson, number, prompt_id))


def live_settings(lesson: Lesson, number: int, prompt_id: str) -> dict:
    """What "Try it live" puts into the app's controls: the chapter's prompt and decoding settings."""
    settings = (lesson.info.get("settings") or {})
    return {"prompt": lesson.prompt(prompt_id)["text"], "max_new_tokens": settings.get("max_new_tokens", 96),
            "temperature": 0.0, "top_p": 1.0, "seed": 0, "capacity": DEFAULTS["capacity"],
            "copy_branch": recorded_copy_branch(lesson), **chapter(number).live}


def recorded_copy_branch(lesson: Lesson) -> int:
    """The copy-branch length the lesson's tree runs used (traces from before the option: 0), so a
    live run repeats what the chapter showed."""
    runs = ((lesson.info.get("settings") or {}).get("runs") or {})
    return int(runs.get("nanospec", {}).get("copy_branch", 0))
