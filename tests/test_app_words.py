"""Issue 47's words: a long prompt is told with its token count and its slow prefill (no browser, no model)."""

from __future__ import annotations

from app.callbacks import LONG_PROMPT_TOKENS, long_prompt_note, prompt_note_html


class _Engine:
    def __init__(self, n: int):
        self.n = n

    def encode_prompt(self, prompt):
        return list(range(self.n))


def test_a_long_prompt_is_told_with_its_length_and_slow_prefill():
    note = long_prompt_note(_Engine(5123), "x" * 20_000)
    assert note is not None and "5,123 tokens" in note and "prefill" in note
    assert "prompt-note" in prompt_note_html(note)
    assert long_prompt_note(_Engine(LONG_PROMPT_TOKENS - 1), "short") is None
