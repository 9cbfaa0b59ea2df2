"""The soak's answer comparison reads the answer's text, not the markup around it."""

from __future__ import annotations

from app.charts.answer import answer_html
from app.charts.words import ACCEPTED, BONUS
from app.dev.soak import answer_text


def test_answer_text_is_the_tokens_whatever_their_origins():
    pieces = ["def", " f", "(x", "):", "\n", "  return", " x", " <", " 1", " &", " \"ok\""]
    one = answer_html(pieces, [BONUS] * len(pieces))
    other = answer_html(pieces, [ACCEPTED, BONUS] * 5 + [ACCEPTED])
    assert one != other  # the underlines differ, as they do between two budgeted runs of one prompt
    assert answer_text([one]) == answer_text([other]) == "".join(pieces)


def test_answer_text_tells_different_answers_apart():
    a = answer_html(["The", " cat"], [BONUS, BONUS])
    b = answer_html(["The", " dog"], [BONUS, BONUS])
    assert answer_text([a]) != answer_text([b])
    assert answer_text([answer_html([], [])]) == ""
