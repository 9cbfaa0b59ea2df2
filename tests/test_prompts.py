"""The shipped prompt set and nanospec.prompts validation."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nanospec.data.prompts import CATEGORIES, load_prompts, prompt_messages


def test_shipped_prompt_set_shape():
    items = load_prompts()
    assert len(items) >= 42
    assert len({item["id"] for item in items}) == len(items)
    assert set(CATEGORIES) == {item["category"] for item in items}
    for category in CATEGORIES:
        in_category = [item for item in items if item["category"] == category]
        heldout = [item for item in in_category if item["split"] == "heldout"]
        assert len(in_category) >= 6, category
        assert 2 <= len(heldout) <= 3, category


def test_multi_turn_items_are_conversations():
    for item in load_prompts(category="multi_turn"):
        roles = [turn["role"] for turn in item["turns"]]
        assert len(roles) >= 3 and roles[-1] == "user" and "assistant" in roles
        assert "prompt" not in item


def test_rag_and_summarization_carry_their_passage():
    for item in load_prompts(category="rag"):
        assert "Question:" in item["prompt"] and len(item["prompt"]) > 150
    for item in load_prompts(category="summarization"):
        assert "\n\n" in item["prompt"] and len(item["prompt"]) > 150


def test_filters():
    heldout = load_prompts(split="heldout")
    train = load_prompts(split="train")
    assert heldout and train and {i["split"] for i in heldout} == {"heldout"}
    assert len(heldout) + len(train) == len(load_prompts())
    math_train = load_prompts(split="train", category="math")
    assert math_train and all(i["category"] == "math" and i["split"] == "train" for i in math_train)
    with pytest.raises(ValueError, match="split"):
        load_prompts(split="test")
    with pytest.raises(ValueError, match="category"):
        load_prompts(category="poetry")


def test_prompt_messages():
    single = {"id": "x", "category": "qa", "split": "train", "prompt": "Why?"}
    assert prompt_messages(single) == [{"role": "user", "content": "Why?"}]
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]
    messages = prompt_messages({"id": "y", "category": "multi_turn", "split": "train", "turns": turns})
    assert messages == turns and messages is not turns


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"id": "a", "category": "qa", "split": "train", "prompt": "Hi?"})


@pytest.mark.parametrize("bad_line, message", [
    ('{"id": "b", "category": "qa", ', "not valid JSON"),
    (json.dumps({"id": "b", "category": "qa", "split": "train"}), "exactly one of 'prompt' or 'turns'"),
    (json.dumps({"id": "b", "category": "qa", "split": "train", "prompt": "x",
                 "turns": [{"role": "user", "content": "x"}]}), "exactly one"),
    (json.dumps({"id": "b", "category": "poetry", "split": "train", "prompt": "x"}), "category"),
    (json.dumps({"id": "b", "category": "qa", "split": "dev", "prompt": "x"}), "split"),
    (json.dumps({"category": "qa", "split": "train", "prompt": "x"}), "'id'"),
    (json.dumps({"id": "b", "category": "qa", "split": "train", "prompt": "  "}), "non-empty"),
    (json.dumps({"id": "b", "category": "multi_turn", "split": "train",
                 "turns": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}), "last turn"),
    (json.dumps({"id": "b", "category": "multi_turn", "split": "train",
                 "turns": [{"role": "robot", "content": "x"}]}), "role"),
    (json.dumps(["not", "an", "object"]), "JSON object"),
    (GOOD, "duplicate id"),
])
def test_bad_lines_name_their_line_number(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "p.jsonl", [GOOD, "", bad_line])
    with pytest.raises(ValueError, match=message) as info:
        load_prompts(path)
    assert f"{path}:3:" in str(info.value)


def test_blank_lines_are_skipped(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ["", GOOD, "   "])
    assert [item["id"] for item in load_prompts(path)] == ["a"]


def test_categories_are_balanced():
    counts = Counter(item["category"] for item in load_prompts())
    assert len(set(counts.values())) == 1  # 7 per category
