"""The Lesson tab: a guided walk from autoregressive decoding to NanoSpec over real recorded traces.

    with gr.Blocks() as demo:
        with gr.Tabs() as tabs:
            ...                                    # the Live tab, id="live"
            lesson = build_lesson_tab({"prompt": prompt, "method": method, ...}, tabs)
        register_deep_link(demo, lesson)           # ?chapter=5 and ?presenter=1

Every chapter is drawn from assets/lesson/ (written by `python -m nanospec record-lesson`); nothing
here loads a model. Chapter texts and charts are pure functions in app/lesson/chapters.py.
"""

from __future__ import annotations

import functools
import html
import logging
from dataclasses import dataclass

import gradio as gr

from . import chapters as lc
from .data import RUN_LABELS, Lesson, load_lesson

log = logging.getLogger(__name__)
SPEEDS = (0.5, 4.0)  # Play speed bounds, steps per second

CSS = """
#lesson-root { width: 100%; }
#lesson-style { display: none !important; }
#lesson-root .lesson-text { font-size: 1.05rem; line-height: 1.55; }
#lesson-root .lesson-text h2 { margin-top: 0.2em; }
#lesson-root .provenance { margin-top: 0.8em; padding: 6px 10px; border-left: 4px solid #9b7fc7;
  background: rgba(155,127,199,0.08); font-size: 0.85em; border-radius: 4px; }
#lesson-root .lesson-tokens { font-size: 0.95rem; line-height: 1.9; }
#lesson-root .tokens-head { font-size: 0.85em; opacity: 0.85; margin-bottom: 4px; }
#lesson-root .tokens-body { max-height: 12em; overflow-y: auto; }
#lesson-root .tok { background: color-mix(in srgb, var(--c) 22%, transparent); border-bottom: 3px solid var(--c);
  border-radius: 3px; padding: 1px 1px; white-space: pre-wrap; }
#lesson-root .tok.now { outline: 2.5px solid #111; outline-offset: 1px;
  background: color-mix(in srgb, var(--c) 45%, transparent); }
#lesson-root .tok.later { opacity: 0.25; }
#lesson-root .key { margin-left: 10px; border-bottom: 3px solid var(--c); padding: 0 3px; }
#lesson-root.presenter .lesson-text { font-size: 1.5rem; }
#lesson-root.presenter .lesson-tokens { font-size: 1.35rem; }
#lesson-root.presenter button { font-size: 1.2rem; }
#lesson-root.presenter label, #lesson-root.presenter span { font-size: 1.1rem; }
body:has(#lesson-root.presenter) .gradio-container,
body:has(#lesson-root.presenter) main { max-width: 100% !important; }
"""
PRESENTER_JS = """(on) => {
  const root = document.querySelector('#lesson-root');
  if (root) root.classList.toggle('presenter', !!on);
  return on;
}"""


@dataclass
class LessonHandles:
    """The tab's components (for wiring from outside: deep links, tests)."""

    available: bool
    chapter: gr.Radio | None = None
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
    message: str = ""


@functools.lru_cache(maxsize=1)
def lesson_data() -> Lesson:
    """The recorded traces, read once per process (read-only, shared by every session)."""
    return load_lesson()


# -- callbacks -------------------------------------------------------------------------------------
def _clamp_chapter(number) -> int:
    try:
        number = int(number)
    except (TypeError, ValueError):
        return 1
    return min(max(number, 1), len(lc.CHAPTERS))


def _prompt(lesson: Lesson, prompt_id) -> str:
    return prompt_id if prompt_id in lesson.prompt_ids else lesson.prompt_ids[0]


def render(number, prompt_id, step, presenter) -> tuple:
    """Text, figure and token view of one chapter at one step."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    step = max(0, min(int(step or 0), lc.chapter_steps(lesson, number, prompt_id)))
    return (lc.chapter_text(lesson, number, prompt_id, step),
            lc.chapter_figure(lesson, number, prompt_id, step, bool(presenter)),
            lc.chapter_tokens(lesson, number, prompt_id, step))


def chapter_start(number, prompt_id) -> tuple[int, str, int, int]:
    """(chapter, prompt id, first step shown, last step) for opening a chapter."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    return number, prompt_id, lc.start_step(lesson, number, prompt_id), lc.chapter_steps(lesson, number, prompt_id)


def open_chapter(number, prompt_id, presenter) -> tuple:
    """Chapter radio value, step slider (range + a good first step), text, figure, tokens."""
    number, prompt_id, step, last = chapter_start(number, prompt_id)
    slider = gr.Slider(minimum=0, maximum=max(1, last), value=step, label=_step_label(number, last))
    return (number, slider, *render(number, prompt_id, step, presenter))


def _step_label(number: int, last: int) -> str:
    return f"Step of the recorded {RUN_LABELS[lc.chapter(number).run]} run (0 = prefill, {last} = last)"


def shift_chapter(number, prompt_id, presenter, delta: int) -> tuple:
    return open_chapter(_clamp_chapter(number) + delta, prompt_id, presenter)


def move(number, prompt_id, step, presenter, delta: int) -> tuple:
    """One step back or forward: the slider's new value, then text, figure, tokens."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    step = max(0, min(int(step or 0) + delta, lc.chapter_steps(lesson, number, prompt_id)))
    return (step, *render(number, prompt_id, step, presenter))


def tick(number, prompt_id, step, presenter) -> tuple:
    """Play: advance one step; at the last step stop the timer."""
    lesson = lesson_data()
    last = lc.chapter_steps(lesson, _clamp_chapter(number), _prompt(lesson, prompt_id))
    out = move(number, prompt_id, step, presenter, +1)
    done = out[0] >= last
    return (*out, gr.Timer(active=not done), gr.Button(value="▶ Play" if done else "⏸ Pause"), not done)


def toggle_play(playing: bool, number, prompt_id, step) -> tuple:
    """Play / Pause. Playing from the last step starts again at step 0."""
    lesson = lesson_data()
    last = lc.chapter_steps(lesson, _clamp_chapter(number), _prompt(lesson, prompt_id))
    playing = not playing
    restart = playing and int(step or 0) >= last
    return (playing, gr.Timer(active=playing), gr.Button(value="⏸ Pause" if playing else "▶ Play"),
            0 if restart else gr.skip())


def set_speed(speed) -> gr.Timer:
    speed = min(max(float(speed or 1.0), SPEEDS[0]), SPEEDS[1])
    return gr.Timer(value=1.0 / speed)


def try_it_values(number, prompt_id, keys: list[str], live_tab_id: str) -> tuple:
    """Values for the app's controls (in `keys` order) and the tab switch to Live."""
    lesson = lesson_data()
    settings = lc.live_settings(lesson, _clamp_chapter(number), _prompt(lesson, prompt_id))
    return (*(settings.get(k, gr.skip()) for k in keys), gr.Tabs(selected=live_tab_id))


def deep_link(request: gr.Request | None) -> tuple[int | None, bool]:
    """`?chapter=N` (1..9) and `?presenter=1` from the page URL; (None, False) when absent or bad."""
    params = dict(request.query_params) if request is not None and request.query_params is not None else {}
    number = None
    raw = params.get("chapter")
    if raw is not None:
        try:
            value = int(str(raw).strip())
        except ValueError:
            value = 0
        number = value if 1 <= value <= len(lc.CHAPTERS) else None
    presenter = str(params.get("presenter", "")).lower() in ("1", "true", "yes", "on")
    return number, presenter


# -- layout ------------------------------------------------------------------------------------------
def build_lesson_tab(try_it_targets: dict[str, gr.components.Component] | None = None,
                     tabs: gr.Tabs | None = None, live_tab_id: str = "live") -> LessonHandles:
    """The "Lesson" tab; call inside an open `gr.Blocks()` and `gr.Tabs()`.

    With `try_it_targets` (app control name -> component: prompt, method, max_new_tokens, depth,
    top_k, total_tokens, temperature, top_p, seed, capacity) and `tabs`, "Try it live" fills those
    controls with the chapter's prompt and settings and switches `tabs` to `live_tab_id`.
    """
    with gr.Tab("Lesson", id="lesson", elem_id="lesson-tab"):
        try:
            lesson = lesson_data()
        except (FileNotFoundError, ValueError, KeyError) as exc:
            log.warning("lesson traces unavailable: %s", exc)
            message = f"**The lesson's recorded traces are missing or unreadable.** {html.escape(str(exc))}"
            gr.Markdown(message, elem_id="lesson-missing")
            return LessonHandles(available=False, tabs=tabs, message=message)
        first_prompt = lesson.prompt_ids[0]
        chapter0, _, step0, last0 = chapter_start(1, first_prompt)
        text0, fig0, tokens0 = render(chapter0, first_prompt, step0, False)

        with gr.Column(elem_id="lesson-root"):
            gr.HTML(f"<style>{CSS}</style>", elem_id="lesson-style", js_on_load=None)
            with gr.Row(equal_height=False):
                chapter = gr.Radio([(f"{c.number} · {c.title}", c.number) for c in lc.CHAPTERS], value=chapter0,
                                   label="Chapter", elem_id="lesson-chapter", scale=5)
                with gr.Column(scale=1, min_width=220):
                    prompt = gr.Dropdown([(f"{p['id']} · {p['category'].replace('_', ' ')}", p["id"])
                                          for p in lesson.prompts], value=first_prompt,
                                         label="Recorded prompt", elem_id="lesson-prompt")
                    presenter = gr.Checkbox(False, label="Presenter mode (larger text)", elem_id="lesson-presenter")
            with gr.Row(equal_height=False):
                with gr.Column(scale=2, min_width=320):
                    text = gr.Markdown(text0, elem_id="lesson-text", elem_classes=["lesson-text"])
                with gr.Column(scale=3, min_width=420):
                    plot = gr.Plot(fig0, show_label=False, elem_id="lesson-plot")
                    tokens = gr.HTML(tokens0, elem_id="lesson-tokens", js_on_load=None)
            with gr.Row(equal_height=True):
                back = gr.Button("◀ Step", elem_id="lesson-step-prev", scale=1, min_width=90)
                forward = gr.Button("Step ▶", elem_id="lesson-step-next", scale=1, min_width=90)
                play = gr.Button("▶ Play", elem_id="lesson-play", scale=1, min_width=90)
                speed = gr.Slider(*SPEEDS, value=1.0, step=0.5, label="Play speed (steps per second)",
                                  elem_id="lesson-speed", scale=2)
                step = gr.Slider(0, max(1, last0), value=step0, step=1, label=_step_label(chapter0, last0),
                                 elem_id="lesson-step", scale=4)
            with gr.Row():
                prev_chapter = gr.Button("← Previous chapter", elem_id="lesson-prev-chapter")
                next_chapter = gr.Button("Next chapter →", variant="primary", elem_id="lesson-next-chapter")
                try_it = None
                if try_it_targets and tabs is not None:
                    try_it = gr.Button("Try it live ↗ (opens the Live tab with this prompt and settings)",
                                       variant="secondary", elem_id="lesson-try")
        timer = gr.Timer(1.0, active=False)
        playing = gr.State(False)

    # -- wiring --------------------------------------------------------------------------------------
    quiet = dict(show_progress="hidden", concurrency_limit=None, api_visibility="undocumented", queue=False)
    chapter_out = [chapter, step, text, plot, tokens]
    step_out = [step, text, plot, tokens]
    chapter.input(open_chapter, [chapter, prompt, presenter], chapter_out, **quiet)
    prompt.input(open_chapter, [chapter, prompt, presenter], chapter_out, **quiet)
    prev_chapter.click(functools.partial(shift_chapter, delta=-1), [chapter, prompt, presenter], chapter_out, **quiet)
    next_chapter.click(functools.partial(shift_chapter, delta=+1), [chapter, prompt, presenter], chapter_out, **quiet)
    back.click(functools.partial(move, delta=-1), [chapter, prompt, step, presenter], step_out, **quiet)
    forward.click(functools.partial(move, delta=+1), [chapter, prompt, step, presenter], step_out, **quiet)
    step.input(render, [chapter, prompt, step, presenter], [text, plot, tokens], trigger_mode="always_last", **quiet)
    play.click(toggle_play, [playing, chapter, prompt, step], [playing, timer, play, step], **quiet)
    timer.tick(tick, [chapter, prompt, step, presenter], [*step_out, timer, play, playing], **quiet)
    speed.input(set_speed, speed, timer, **quiet)
    presenter.change(None, presenter, None, js=PRESENTER_JS, api_visibility="undocumented", queue=False)
    presenter.input(render, [chapter, prompt, step, presenter], [text, plot, tokens], **quiet)
    if try_it is not None:
        keys = list(try_it_targets)
        try_it.click(functools.partial(try_it_values, keys=keys, live_tab_id=live_tab_id), [chapter, prompt],
                     [*(try_it_targets[k] for k in keys), tabs], **quiet)
    return LessonHandles(True, chapter, prompt, step, presenter, text, plot, tokens, timer, play, try_it, tabs)


def register_deep_link(demo: gr.Blocks, handles: LessonHandles) -> None:
    """`?chapter=N` opens chapter N (and, with `tabs`, the Lesson tab); `?presenter=1` starts in presenter mode."""
    if not handles.available:
        return
    outputs = [handles.chapter, handles.step, handles.text, handles.plot, handles.tokens, handles.presenter]
    if handles.tabs is not None:
        outputs.append(handles.tabs)

    def on_load(prompt_id, request: gr.Request):
        number, presenter = deep_link(request)
        if number is None and not presenter:
            return tuple(gr.skip() for _ in outputs)
        out = (*open_chapter(number or 1, prompt_id, presenter), presenter)
        if handles.tabs is not None:
            out += (gr.Tabs(selected="lesson") if number is not None else gr.skip(),)
        return out

    demo.load(on_load, [handles.prompt], outputs, api_visibility="undocumented", queue=False,
              show_progress="hidden")
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
