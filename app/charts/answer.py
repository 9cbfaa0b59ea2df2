"""The answer as readable text: each emitted token underlined in the colour of its origin."""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from nanospec import metrics

from app.charts.words import ACCEPTED, BONUS, ORIGIN_COLORS, ORIGIN_LABELS, ORIGIN_SHORT, VOCAB_MISS
from app.templating import render, text

ANSWER_CSS = text("answer.css")


def token_origins(frame: pd.DataFrame) -> list[str]:
    """Legend label (`ORIGIN_LABELS`) of every emitted token's origin (`nanospec.metrics.token_origins`,
    accepted draft tokens by the source of their tree node)."""
    sources = frame["tree_sources"] if "tree_sources" in frame else [[]] * len(frame)
    accepted = [metrics.accepted_origins(path, list(src) if isinstance(src, (list, tuple)) else [])
                for path, src in zip(frame["accepted_path"], sources)]
    origins = metrics.token_origins(frame["n_accepted"], frame["tokens"].map(len), frame["coverage"], accepted)
    return [ORIGIN_LABELS[o] for o in origins]


def answer_html(pieces: Sequence[str], origins: Sequence[str], special: Sequence[bool] | None = None) -> str:
    """The answer as readable text: the decoded pieces run together (spaces and newlines kept), each token
    underlined in its origin's colour (`ORIGIN_COLORS`; the hover names it). Special tokens (`special[i]`,
    e.g. the end-of-sequence token) are not part of the text: a line under it names them."""
    special = list(special) if special is not None else [False] * len(pieces)
    spans, ended = [], []
    for piece, origin, is_special in zip(pieces, origins, special):
        if not piece:
            continue  # half a character: the next token's piece carries it
        if is_special:
            ended.append(piece)
            continue
        spans.append(render("answer_token.html", color=ORIGIN_COLORS.get(origin, "#888"),
                            origin=html.escape(origin), piece=html.escape(piece)))
    shown = set(origins)
    keys = "".join(render("answer_key.html", color=ORIGIN_COLORS[label], label=html.escape(label),
                          short=html.escape(ORIGIN_SHORT[label]))
                   for label in ORIGIN_COLORS if label in shown or label in (ACCEPTED, BONUS, VOCAB_MISS))
    body = "".join(spans) if spans else '<span class="answer-empty">(no text yet)</span>'
    end = render("answer_end.html", ended=html.escape(" ".join(ended))) if ended else ""
    return render("answer.html", keys=keys, body=body, end=end)
