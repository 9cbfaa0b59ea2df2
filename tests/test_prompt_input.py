"""Prompt-file items become engine input: plain prompts on a base model (no chat template) are encoded as
text, and on a chat model exactly as the one user turn they always were."""

from __future__ import annotations

import json

import pytest

import nanospec.__main__ as cli
from app.dev.devtools import WordTokenizer, tiny_loader
from nanospec import SpecEngine
from nanospec.data.prompts import prompt_input, prompt_messages

ARGS = ["--max-new-tokens", "4", "--depth", "2", "--top-k", "2", "--total-tokens", "4"]


class BaseTokenizer(WordTokenizer):
    """A base model's tokenizer: no chat template."""

    chat_template = None

    def apply_chat_template(self, *args, **kwargs):
        raise ValueError("this tokenizer has no chat template")


@pytest.fixture(scope="module")
def tiny():
    return tiny_loader(vocab=512, hidden=32, layers=1)(None)


def test_plain_prompts_on_a_base_model_are_encoded_as_text(tiny):
    engine, _ = tiny
    base = SpecEngine(engine.model, BaseTokenizer(512), engine.head, eos_token_ids=[])
    item = {"id": "a", "prompt": "the draft tree accepts a token"}
    assert base.encode_prompt(prompt_input(item)) == BaseTokenizer(512)(item["prompt"])["input_ids"]
    with pytest.raises(ValueError, match="chat template"):
        base.encode_prompt(prompt_messages(item))  # what compare passed before: turns need a template


def test_chat_models_get_the_same_ids_as_before(tiny):
    engine, _ = tiny
    single = {"id": "a", "prompt": "the draft tree accepts a token"}
    assert engine.encode_prompt(prompt_input(single)) == engine.encode_prompt(prompt_messages(single))
    turns = [{"role": "user", "content": "fast small"}, {"role": "assistant", "content": "target"},
             {"role": "user", "content": "again"}]
    multi = {"id": "b", "turns": turns}
    assert prompt_input(multi) == prompt_messages(multi) == turns


def test_compare_on_a_base_model_runs_a_plain_prompt_file(tmp_path, tiny, monkeypatch):
    engine, info = tiny
    base = SpecEngine(engine.model, BaseTokenizer(512), engine.head, eos_token_ids=[])
    monkeypatch.setattr(cli, "_load", lambda a: (base, info))
    prompts = tmp_path / "plain.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("the draft tree", "a fast small model")) + "\n")
    out_json = tmp_path / "table.json"
    rc = cli.main(["compare", "--prompts", str(prompts), "--methods", "full", "--json", str(out_json), *ARGS])
    assert rc == 0
    table = json.loads(out_json.read_text())
    assert [r["method"] for r in table] == ["ar", "full"] and all(r["n_prompts"] == 2 for r in table)
