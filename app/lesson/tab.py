"""The Lesson tab: a guided walk from autoregressive decoding to NanoSpec over real recorded traces.

    with gr.Blocks() as demo:
        with gr.Tabs() as tabs:
            ...                                    # the Live tab, id="live"
            lesson = build_lesson_tab({"prompt": prompt, "method": method, ...}, tabs)
        register_deep_link(demo, lesson)           # ?chapter=5 and ?presenter=1

Every chapter is drawn from assets/lesson/ (written by `python -m nanospec record-lesson`); nothing
here loads a model. Chapter texts and charts are pure functions in app/lesson/chapters.py,
the callbacks are in app/lesson/callbacks.py. In presenter mode and behind a chapter link the lesson
comes first: the app's Live header (class `live-header`) collapses until "Live controls" is clicked.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass

import gradio as gr

from app.race import race_component
from app.lesson import chapters as lc
from app.lesson.callbacks import (PLAY, PLAY_SPEEDS, step_label, answer, chapter_start, deep_link, lesson_data, move, open_chapter,
                        render, set_speed, shift_chapter, tick, toggle_play, try_it_values)
from app.lesson.style import CSS, DEEP_LINK_JS, LIVE_TOGGLE_JS, PRESENTER_FIT_JS, PRESENTER_JS, with_fit
from app.lesson.poll_panel import PollPanel, poll_panel, wire_poll

__all__ = ["LessonHandles", "build_lesson_tab", "register_deep_link", "build_lesson_demo", "lesson_data",
           "open_chapter", "move", "tick", "shift_chapter", "answer", "render", "try_it_values", "deep_link",
           "toggle_play", "set_speed", "chapter_start"]
log = logging.getLogger(__name__)


@dataclass
class LessonHandles:
    """The tab's components (for wiring from outside: deep links, tests)."""

    available: bool
    chapter: gr.Dropdown | None = None
    prompt: gr.Dropdown | None = None
    step: gr.Slider | None = None
    presenter: gr.Checkbox | None = None
    text: gr.Markdown | None = None
    plot: gr.Plot | None = None
    tokens: gr.HTML | None = None
    timer: gr.Timer | None = None
    play: gr.Button | None = None
    try_it: gr.Button | None = None
    tabs: gr.Tabs | None = None
    quiz: gr.Radio | None = None
    reveal: gr.Markdown | None = None
    pending: gr.State | None = None
    fit: gr.Number | None = None
    race: gr.HTML | None = None
    message: str = ""
    poll: PollPanel | None = None   # the class poll (app/lesson/poll_panel.py), under the question
    tab: gr.Tab | None = None

    def chapter_outputs(self) -> list:
        """What `open_chapter` returns, in order."""
        return [self.chapter, self.step, self.text, self.plot, self.tokens, self.quiz, self.reveal, self.pending,
                self.race]


# -- layout ------------------------------------------------------------------------------------------
def build_lesson_tab(try_it_targets: dict[str, gr.components.Component] | None = None,
                     tabs: gr.Tabs | None = None, live_tab_id: str = "live") -> LessonHandles:
    """The "Lesson" tab; call inside an open `gr.Blocks()` and `gr.Tabs()`.

    With `try_it_targets` (app control name -> component: prompt, method, max_new_tokens, depth,
    top_k, total_tokens, temperature, top_p, seed, capacity, copy_branch, budget) and `tabs`, "Try it live" fills those
    controls with the chapter's prompt and settings and switches `tabs` to `live_tab_id`.
    """
    with gr.Tab("Lesson", id="lesson", elem_id="lesson-tab") as lesson_tab:
        try:
            lesson = lesson_data()
        except (FileNotFoundError, ValueError, KeyError) as exc:
            log.warning("lesson traces unavailable: %s", exc)
            message = f"**The lesson's recorded traces are missing or unreadable.** {html.escape(str(exc))}"
            gr.Markdown(message, elem_id="lesson-missing")
            return LessonHandles(available=False, tabs=tabs, message=message, tab=lesson_tab)
        first_prompt = lesson.prompt_ids[0]
        chapter0, _, step0, last0 = chapter_start(1, first_prompt)

        with gr.Column(elem_id="lesson-root"):
            gr.HTML(f"<style>{CSS}</style>", elem_id="lesson-style", js_on_load=None)
            fit = gr.Number(0, elem_id="lesson-fit", visible="hidden", interactive=False)
            prev_chapter, chapter, next_chapter, prompt, presenter, live_toggle = _chapter_bar(lesson, chapter0,
                                                                                               first_prompt)
            text, quiz, reveal, race, plot, back, forward, play, speed, step, try_it, tokens, poll = _stage(
                first_prompt, chapter0, step0, last0, with_try_it=bool(try_it_targets) and tabs is not None)
        timer = gr.Timer(1.0, active=False)
        playing = gr.State(False)
        pending = gr.State(False)

    handles = LessonHandles(True, chapter, prompt, step, presenter, text, plot, tokens, timer, play, try_it, tabs,
                            quiz, reveal, pending, fit, race, tab=lesson_tab, poll=poll)
    _wire(handles, back, forward, prev_chapter, next_chapter, speed, playing, live_toggle, try_it_targets,
          live_tab_id)
    wire_poll(poll, handles)
    return handles


def _chapter_bar(lesson, chapter0: int, first_prompt: str) -> tuple:
    """The top bar: previous/next chapter, the chapter and prompt pickers, presenter mode, the Live toggle."""
    with gr.Row(equal_height=True, elem_id="lesson-bar"):
        prev_chapter = gr.Button("◀ Previous", elem_id="lesson-prev-chapter", scale=0, min_width=110,
                                 interactive=chapter0 > 1)
        chapter = gr.Dropdown([(f"Chapter {c.number} · {c.title}", c.number) for c in lc.CHAPTERS],
                              value=chapter0, label="Chapter", show_label=False, elem_id="lesson-chapter",
                              scale=4, container=False)
        next_chapter = gr.Button("Next chapter ▶", variant="primary", elem_id="lesson-next-chapter", scale=0,
                                 min_width=150, interactive=chapter0 < len(lc.CHAPTERS))
        prompt = gr.Dropdown([(f"Prompt {p['id']} · {p['category'].replace('_', ' ')}", p["id"])
                              for p in lesson.prompts], value=first_prompt, label="Recorded prompt",
                             show_label=False, elem_id="lesson-prompt", scale=2, container=False)
        presenter = gr.Checkbox(False, label="Presenter mode", elem_id="lesson-presenter", scale=0,
                                min_width=170, container=False)
        live_toggle = gr.Button("⚙ Live controls", elem_id="lesson-live-toggle", scale=0, min_width=150)
    return prev_chapter, chapter, next_chapter, prompt, presenter, live_toggle


def _stage(first_prompt: str, chapter0: int, step0: int, last0: int, with_try_it: bool) -> tuple:
    """The chapter's text and quiz beside its figure, step controls and answer tokens, drawn at the first step.
    "Try it live" sits with the step controls, right under the chart, so it is on the first screen whenever
    a chapter asks the class to press it."""
    text0, fig0, tokens0 = render(chapter0, first_prompt, step0, False)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            text = gr.Markdown(text0, elem_id="lesson-text", elem_classes=["lesson-text"])
            quiz = gr.Radio([], value=None, label="", visible=False, elem_id="lesson-quiz")
            reveal = gr.Markdown("", elem_id="lesson-reveal")
            poll = poll_panel()
        with gr.Column(scale=3, min_width=420):
            race = race_component(elem_id="lesson-race", visible=False)
            plot = gr.Plot(fig0, show_label=False, elem_id="lesson-plot")
            with gr.Row(equal_height=True, elem_id="lesson-controls"):
                back = gr.Button("◀ Step", elem_id="lesson-step-prev", scale=0, min_width=80)
                forward = gr.Button("Step ▶", elem_id="lesson-step-next", scale=0, min_width=80)
                play = gr.Button(PLAY, elem_id="lesson-play", scale=0, min_width=90)
                # the play speed beside ▶ Play (steps per second, within SPEEDS)
                speed = gr.Dropdown([(f"{v:g} step/s", v) for v in PLAY_SPEEDS], value=1.0, label="Play speed",
                                    show_label=False, container=False, elem_id="lesson-speed", scale=0,
                                    min_width=130)
                step = gr.Slider(0, max(1, last0), value=step0, step=1, label=step_label(chapter0, last0),
                                 elem_id="lesson-step", scale=4)
                try_it = (gr.Button("Try it live ↗", variant="secondary", elem_id="lesson-try", scale=0,
                                    min_width=120) if with_try_it else None)
            tokens = gr.HTML(tokens0, elem_id="lesson-tokens", js_on_load=None)
    return text, quiz, reveal, race, plot, back, forward, play, speed, step, try_it, tokens, poll


# -- wiring --------------------------------------------------------------------------------------------
def chapter_ends(number) -> tuple:
    """Previous / Next chapter buttons for chapter `number`: each enabled only where it leads somewhere."""
    n = int(number or 1)
    return gr.Button(interactive=n > 1), gr.Button(interactive=n < len(lc.CHAPTERS))


def _wire(h: LessonHandles, back, forward, prev_chapter, next_chapter, speed, playing, live_toggle,
          try_it_targets, live_tab_id) -> None:
    quiet = dict(show_progress="hidden", concurrency_limit=None, api_visibility="undocumented", queue=False)
    view = [h.text, h.plot, h.tokens]
    step_out = [h.step, *view, h.pending]
    opened = h.chapter_outputs()
    base = [h.chapter, h.prompt, h.presenter]
    h.chapter.input(open_chapter, [*base, h.fit], opened, js=with_fit(4), **quiet)
    h.prompt.input(open_chapter, [*base, h.fit], opened, js=with_fit(4), **quiet)
    prev_chapter.click(lambda n, p, pr, f: shift_chapter(n, p, pr, -1, f), [*base, h.fit], opened,
                       js=with_fit(4), **quiet)
    next_chapter.click(lambda n, p, pr, f: shift_chapter(n, p, pr, +1, f), [*base, h.fit], opened,
                       js=with_fit(4), **quiet)
    # the first chapter has no previous one and the last no next one: their buttons say so by greying out
    h.chapter.change(chapter_ends, h.chapter, [prev_chapter, next_chapter], **quiet)
    stepped = [h.chapter, h.prompt, h.step, h.presenter, h.fit]
    back.click(lambda n, p, s, pr, f: move(n, p, s, pr, -1, f), stepped, step_out, js=with_fit(5), **quiet)
    forward.click(lambda n, p, s, pr, f: move(n, p, s, pr, +1, f), stepped, step_out, js=with_fit(5), **quiet)
    h.step.input(lambda n, p, s, pr, f: (*render(n, p, s, pr, f), False), stepped, [*view, h.pending],
                 trigger_mode="always_last", js=with_fit(5), **quiet)
    h.quiz.input(answer, [h.chapter, h.prompt, h.quiz, h.presenter, h.fit],
                 [*step_out[:4], h.quiz, h.reveal, h.pending],
                 js=with_fit(5), **quiet)
    h.play.click(toggle_play, [playing, h.chapter, h.prompt, h.step], [playing, h.timer, h.play, h.step], **quiet)
    h.timer.tick(tick, stepped, [*step_out, h.timer, h.play, playing], **quiet)
    speed.input(set_speed, speed, h.timer, **quiet)
    h.presenter.change(None, h.presenter, None, js=PRESENTER_JS, api_visibility="undocumented", queue=False)
    h.presenter.input(lambda n, p, s, pr, f, pend: (*render(n, p, s, pr, f, pend), f),
                      [*stepped, h.pending], [*view, h.fit], js=PRESENTER_FIT_JS, **quiet)
    live_toggle.click(None, None, None, js=LIVE_TOGGLE_JS, api_visibility="undocumented", queue=False)
    if h.try_it is not None:
        keys = list(try_it_targets)
        h.try_it.click(lambda n, p: try_it_values(n, p, keys, live_tab_id), [h.chapter, h.prompt],
                       [*(try_it_targets[k] for k in keys), h.tabs], **quiet)


def register_deep_link(demo: gr.Blocks, handles: LessonHandles) -> None:
    """`?chapter=N` opens chapter N (and, with `tabs`, the Lesson tab); `?presenter=1` starts in presenter
    mode; either puts the lesson first (the Live header collapses, the chapter fits the screen)."""
    if not handles.available:
        return
    outputs = [*handles.chapter_outputs(), handles.presenter, handles.fit]
    if handles.tabs is not None:
        outputs.append(handles.tabs)

    def on_load(prompt_id, fit, request: gr.Request):
        number, presenter = deep_link(request)
        if number is None and not presenter:
            return tuple(gr.skip() for _ in outputs)
        out = (*open_chapter(number or 1, prompt_id, presenter, fit), presenter, fit)
        if handles.tabs is not None:
            out += (gr.Tabs(selected="lesson"),)
        return out

    demo.load(on_load, [handles.prompt, handles.fit], outputs, js=DEEP_LINK_JS, api_visibility="undocumented",
              queue=False, show_progress="hidden")
    # setting the checkbox fires its .change, whose JS puts the `presenter` class on the lesson


def build_lesson_demo() -> gr.Blocks:
    """A page with only the Lesson tab (development, screenshots, tests)."""
    with gr.Blocks(title="NanoSpec Explorer — Lesson", fill_width=True) as demo:
        with gr.Tabs() as tabs:
            handles = build_lesson_tab(tabs=tabs)
        register_deep_link(demo, handles)
    return demo


if __name__ == "__main__":
    build_lesson_demo().launch()
