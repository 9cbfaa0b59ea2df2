"""The token view under each lesson chart: the run's answer as coloured chips (HTML)."""

from __future__ import annotations

import html

from app.charts import BONUS, ORIGIN_COLORS, ORIGIN_SHORT, token_origins
from app.lesson.data import SEEN, LessonRun, run_locality


def token_view(run: LessonRun, step: int, colors: list[str] | None = None, legend: dict[str, str] | None = None,
               title: str = "The answer so far") -> str:
    """The run's output as coloured token chips; tokens of `step` outlined, later tokens faded."""
    chips = []
    for piece, tok_step, color in zip(run.pieces, run.token_steps, colors or ["#3b6fd8"] * len(run.pieces)):
        if not piece:
            continue
        text = html.escape(piece).replace("\n", "⏎<br>")
        cls = "now" if tok_step == step else ("later" if tok_step > step else "done")
        chips.append(f"<span class='tok {cls}' style='--c:{color}' title='step {tok_step}'>{text}</span>")
    keys = "".join(f"<span class='key' style='--c:{c}'>{html.escape(k)}</span>" for k, c in (legend or {}).items())
    keys = f"<span class='keys'>{keys}</span>" if keys else ""
    return (f"<div class='lesson-tokens'><div class='tokens-head'><b>{html.escape(title)}</b> · "
            f"outlined = written at step {step}, faded = not written yet {keys}</div><div class='tokens-body'>"
            + "".join(chips) + "</div></div>")


def origin_view(run: LessonRun, step: int) -> str:
    """Tokens coloured by origin; the legend names (in the page's short words) only the origins this run has,
    so a chapter never shows a word ("vocab miss") before the lesson introduces it."""
    origins = token_origins(run.frame)
    shown = {ORIGIN_SHORT[o]: ORIGIN_COLORS[o] for o in ORIGIN_COLORS if o in set(origins)}
    return token_view(run, step, [ORIGIN_COLORS[o] for o in origins], shown)


def target_view(run: LessonRun, step: int) -> str:
    """Chapter 1 (plain decoding): every token is the target's own; nothing else to name yet."""
    return token_view(run, step, [ORIGIN_COLORS[BONUS]] * len(run.pieces), {"written by the target": ORIGIN_COLORS[BONUS]})


def locality_view(run: LessonRun, step: int) -> str:
    return token_view(run, step, [SEEN[k][1] for k in run_locality(run)], {v[0]: v[1] for v in SEEN.values()},
                      "Each token coloured by where it was seen before")

