"""The classroom lesson over recorded traces (no model runs on these pages).

    data.py       load the bundle `python -m nanospec record-lesson` writes; measurements on it
    figures.py    one Plotly figure per chapter
    narration.py  the sentences under each chapter's idea, read off the trace
    views.py      the answer as coloured token chips
    questions.py  predict, then reveal: one question per chapter 2-9, read off the trace
    chapters.py   the chapters: each one object with its figure, narration, tokens, start step, question
    callbacks.py  the tab's callbacks (open, step, answer, play)
    style.py      its CSS and the few lines of browser JavaScript (lesson-first mode)
    tab.py        the Gradio "Lesson" tab and the `?chapter=N` / `?presenter=1` deep links
"""

from app.lesson.chapters import (CHAPTERS, Chapter, chapter, chapter_figure, chapter_run, chapter_steps, chapter_text,
                       chapter_tokens, live_settings, recorded_copy_branch, start_step)
from app.lesson.data import (COMMAND, LESSON_DIR, RUN_LABELS, RUNS_FILE, SWEEP_FILE, Lesson, LessonRun, load_lesson, locality,
                   run_locality)
from app.lesson.style import LIVE_HEADER
from app.lesson.tab import build_lesson_demo, build_lesson_tab, lesson_data, register_deep_link

__all__ = ["LIVE_HEADER", "CHAPTERS", "COMMAND", "Chapter", "LESSON_DIR", "Lesson", "LessonRun", "RUNS_FILE", "RUN_LABELS",
           "SWEEP_FILE", "build_lesson_demo", "build_lesson_tab", "chapter", "chapter_figure", "chapter_run",
           "chapter_steps", "chapter_text", "chapter_tokens", "lesson_data", "live_settings", "load_lesson",
           "locality", "recorded_copy_branch", "register_deep_link", "run_locality", "start_step"]
