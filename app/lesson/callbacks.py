"""The Lesson tab's callbacks: open a chapter, step through it, answer its question, play.

Every callback takes the tab's plain values (chapter number, prompt id, step, presenter flag, `fit`
= the page height the lesson may fill in lesson-first mode, 0 otherwise, and `pending` = the
chapter's question is still open) and returns values or `gr.update`s; none loads a model.
"""

from __future__ import annotations

import functools

import gradio as gr

from app.lesson import chapters as lc
from app.lesson import figures
from app.lesson.data import Lesson, load_lesson

SPEEDS = (0.5, 4.0)  # Play speed bounds, steps per second
PLAY_SPEEDS = (0.5, 1.0, 2.0, 4.0)  # the speeds offered beside ▶ Play
# lesson-first layout, measured in Chromium at 1280x720 and 1920x1080 (desk and presenter): what sits around
# the chart, in px, as a function of the UI type size `ui` (the CSS variable --lesson-ui, see `ui_px`)
TOP_PX = 150         # tab bar, lesson bar and the gap above the chart
GAP_PX = 16          # between the chart, the step controls, the answer so far and the race
SLACK_PX = 8         # below the last block, so rounding never pushes it off the screen
MIN_CHART_PX = 200


def ui_px(fit: int, presenter: bool) -> float:
    """The lesson's UI type size at a page `fit` px high, as style.py's CSS computes it (clamp of a vh share)."""
    lo, share, hi = (14, 0.018, 24) if presenter else (13, 0.0175, 22)
    return min(max(share * fit, lo), hi)


def controls_px(ui: float) -> float:
    """Step buttons, play speed and the step slider (its label on one line)."""
    return 2.5 * ui + 42


def tokens_px(ui: float) -> float:
    """"The answer so far" under the controls: its head and two lines of token chips."""
    return 7.5 * ui


def race_px(ui: float) -> float:
    """The race lanes above the chart: clock, three lanes of two lines, the caption."""
    return 12.5 * ui + 61


PLAY, PAUSE = "▶ Play", "Pause"   # no ⏸: Debian's fonts (and others) draw it as an empty box


@functools.lru_cache(maxsize=1)
def lesson_data() -> Lesson:
    """The recorded traces, read once per process (read-only, shared by every session)."""
    return load_lesson()


def _clamp_chapter(number) -> int:
    try:
        number = int(number)
    except (TypeError, ValueError):
        return 1
    return min(max(number, 1), len(lc.CHAPTERS))


def _prompt(lesson: Lesson, prompt_id) -> str:
    return prompt_id if prompt_id in lesson.prompt_ids else lesson.prompt_ids[0]


def _fit(fit) -> int:
    """The page height the lesson may fill (px); 0 when not lesson-first or unreadable."""
    try:
        return max(0, int(fit or 0))
    except (TypeError, ValueError):
        return 0


def chart_height(fit, number: int = 1, presenter: bool = False) -> int | None:
    """The chart's height in px when the lesson fills a page `fit` px high; None = the chart's own. What sits
    around the chart grows with the UI type (larger in presenter mode), so the chart takes what is left."""
    fit = _fit(fit)
    if fit <= 0:
        return None
    ui = ui_px(fit, bool(presenter))
    race = lc.chapter(_clamp_chapter(number)).race is not None
    # the answer so far stays on the first screen, under the controls; in the race chapter the lanes above the
    # chart show the answers as they are written, and the answer so far may fall below the screen
    around = TOP_PX + 2 * GAP_PX + controls_px(ui) + SLACK_PX + (race_px(ui) if race else tokens_px(ui))
    return max(MIN_CHART_PX, round(fit - around))


def question(number: int, prompt_id: str):
    lesson = lesson_data()
    c = lc.chapter(number)
    return c.question(lesson, lc.chapter_run(lesson, number, prompt_id)) if c.question else None


def render(number, prompt_id, step, presenter, fit=0, pending=False) -> tuple:
    """Text, figure and token view of one chapter at one step (a "predict first" card while pending)."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    height = chart_height(fit, number, presenter)
    if pending and lc.chapter(number).question:
        size = figures.text_size(bool(presenter), _fit(fit))
        return (lc.predict_text(lesson, number, prompt_id), figures.predict_figure(size, height), "")
    step = max(0, min(int(step or 0), lc.chapter_steps(lesson, number, prompt_id)))
    return (lc.chapter_text(lesson, number, prompt_id, step),
            lc.chapter_figure(lesson, number, prompt_id, step, bool(presenter), height, _fit(fit)),
            lc.chapter_tokens(lesson, number, prompt_id, step))


def chapter_start(number, prompt_id) -> tuple[int, str, int, int]:
    """(chapter, prompt id, first step shown, last step) for opening a chapter."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    q = question(number, prompt_id)
    step = q.step if q else lc.start_step(lesson, number, prompt_id)
    return number, prompt_id, step, lc.chapter_steps(lesson, number, prompt_id)


def open_chapter(number, prompt_id, presenter, fit=0) -> tuple:
    """Chapter value, step slider, text, figure, tokens, question, reveal, pending, race lanes."""
    number, prompt_id, step, last = chapter_start(number, prompt_id)
    q = question(number, prompt_id)
    slider = gr.Slider(minimum=0, maximum=max(1, last), value=step, label=step_label(number, last))
    quiz = (gr.Radio(choices=q.options, value=None, label=q.text, visible=True) if q
            else gr.Radio(choices=[], value=None, visible=False))
    return (number, slider, *render(number, prompt_id, step, presenter, fit, q is not None), quiz, "",
            q is not None, race_update(number, prompt_id))


def race_update(number: int, prompt_id: str):
    """The race lanes: shown (with this prompt's recorded runs) only in the race chapter."""
    if lc.chapter(number).race is None:
        return gr.HTML(visible=False)
    return gr.HTML(value=lc.chapter(number).race(lesson_data(), prompt_id), visible=True)


def step_label(number: int, last: int) -> str:
    """The step slider's label: one short line, so it fits beside the step buttons at 1280 px and in presenter
    mode (the slider's ends show 0 and `last`; the chart's title and the provenance line name the run)."""
    return "Step (0 = prefill)"


def shift_chapter(number, prompt_id, presenter, delta: int, fit=0) -> tuple:
    return open_chapter(_clamp_chapter(number) + delta, prompt_id, presenter, fit)


def answer(number, prompt_id, choice, presenter, fit=0) -> tuple:
    """A click on an option: the step the question is about, the full chapter view, the question folded
    away and the verdict in its place."""
    number = _clamp_chapter(number)
    q = question(number, _prompt(lesson_data(), prompt_id))
    if q is None:
        return (gr.skip(),) * 6 + (False,)
    return (q.step, *render(number, prompt_id, q.step, presenter, fit), gr.Radio(visible=False),
            q.verdict(choice), False)


def move(number, prompt_id, step, presenter, delta: int, fit=0) -> tuple:
    """One step back or forward: the slider's new value, then text, figure, tokens, pending (now False)."""
    lesson = lesson_data()
    number, prompt_id = _clamp_chapter(number), _prompt(lesson, prompt_id)
    step = max(0, min(int(step or 0) + delta, lc.chapter_steps(lesson, number, prompt_id)))
    return (step, *render(number, prompt_id, step, presenter, fit), False)


def tick(number, prompt_id, step, presenter, fit=0) -> tuple:
    """Play: advance one step; at the last step stop the timer."""
    lesson = lesson_data()
    last = lc.chapter_steps(lesson, _clamp_chapter(number), _prompt(lesson, prompt_id))
    out = move(number, prompt_id, step, presenter, +1, fit)
    done = out[0] >= last
    return (*out, gr.Timer(active=not done), gr.Button(value=PLAY if done else PAUSE), not done)


def toggle_play(playing: bool, number, prompt_id, step) -> tuple:
    """Play / Pause. Playing from the last step starts again at step 0."""
    lesson = lesson_data()
    last = lc.chapter_steps(lesson, _clamp_chapter(number), _prompt(lesson, prompt_id))
    playing = not playing
    restart = playing and int(step or 0) >= last
    return (playing, gr.Timer(active=playing), gr.Button(value=PAUSE if playing else PLAY),
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
    """`?chapter=N` (1..len(CHAPTERS)) and `?presenter=1` from the page URL; (None, False) when absent or bad."""
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
