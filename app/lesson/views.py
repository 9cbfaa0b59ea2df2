"""The token view under each lesson chart: the run's answer as coloured chips (HTML)."""

from __future__ import annotations

import html

from app.charts import ACCEPTED, BONUS, ORIGIN_COLORS, VOCAB_MISS, token_origins
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
    return (f"<div class='lesson-tokens'><div class='tokens-head'><b>{html.escape(title)}</b> · "
            f"outlined = written at step {step}, faded = not written yet {keys}</div><div class='tokens-body'>"
            + "".join(chips) + "</div></div>")


def origin_view(run: LessonRun, step: int) -> str:
    origins = token_origins(run.frame)
    return token_view(run, step, [ORIGIN_COLORS[o] for o in origins],
                      {ACCEPTED: ORIGIN_COLORS[ACCEPTED], BONUS: ORIGIN_COLORS[BONUS],
                       VOCAB_MISS: ORIGIN_COLORS[VOCAB_MISS]})


def locality_view(run: LessonRun, step: int) -> str:
    return token_view(run, step, [SEEN[k][1] for k in run_locality(run)], {v[0]: v[1] for v in SEEN.values()},
                      "Each token coloured by where it was seen before")

