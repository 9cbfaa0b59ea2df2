"""Test helpers over the app's answer: what an `answer_html` value shows, and (text, origin) pairs."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import pandas as pd

from app.charts import token_origins


def answer_tokens(answer: str) -> list[str]:
    """The token texts an `answer_html` value shows, in order (what a reader of the API gets back)."""
    found = re.findall(r'<span class="tok"[^>]*>(.*?)</span>', answer, flags=re.S)
    return [html.unescape(t) for t in found]


def answer_spans(frame: pd.DataFrame, pieces: Sequence[str], origins: Sequence[str] | None = None
                 ) -> list[tuple[str, str]]:
    """(text, origin label) pairs; `pieces` is the text of each emitted token."""
    origins = token_origins(frame) if origins is None else origins
    return [(piece, origin) for piece, origin in zip(pieces, origins) if piece]
