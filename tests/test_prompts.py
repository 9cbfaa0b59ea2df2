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


def test_outside_check_prompts_are_apart_from_the_set():
    from nanospec.data.prompts import OUTSIDE_PROMPTS_PATH
    outside = load_prompts(OUTSIDE_PROMPTS_PATH)
    assert len(outside) >= 12 and {item["split"] for item in outside} == {"outside"}
    assert not {item["category"] for item in outside} & set(CATEGORIES)  # kinds the set does not have
    assert all(item["split"] != "outside" for item in load_prompts())   # never mixed into the set


BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
                    "translation", "summarization", "qa", "math_reasoning", "rag")


def test_outside_bench_set_shape_and_schema():
    from nanospec.data.prompts import DEFAULT_PROMPTS_PATH
    path = DEFAULT_PROMPTS_PATH.parent / "outside_bench.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(raw) == 52 and all(set(r) == {"id", "category", "split", "prompt"} for r in raw)  # plain prompts only
    items = load_prompts(path)
    assert len({item["id"] for item in items}) == len(items) == 52
    assert all(item["id"].startswith("ob-") for item in items)
    assert Counter(item["category"] for item in items) == {category: 4 for category in BENCH_CATEGORIES}
    assert {item["split"] for item in items} == {"outside"} and len(load_prompts(path, split="outside")) == 52
    assert all(isinstance(item["prompt"], str) and item["prompt"].strip() for item in items)
    for item in items:
        if item["category"] in ("summarization", "extraction", "rag"):   # each carries its own passage
            passage = max(item["prompt"].split("\n\n"), key=len)
            assert 80 <= len(passage.split()) <= 200, item["id"]
        if item["category"] == "rag":
            assert "Question:" in item["prompt"], item["id"]


def test_outside_bench_shares_no_text_with_the_other_prompt_files():
    from nanospec.data.prompts import DEFAULT_PROMPTS_PATH
    folder = DEFAULT_PROMPTS_PATH.parent
    bench = load_prompts(folder / "outside_bench.jsonl")

    def pieces(item):  # the prompt (or each turn) and its lines of some length
        texts = [item["prompt"]] if "prompt" in item else [turn["content"] for turn in item["turns"]]
        return set(texts) | {line.strip() for text in texts for line in text.splitlines() if len(line.strip()) >= 30}

    others = set()
    for other in sorted(folder.glob("*.jsonl")):
        if other.name != "outside_bench.jsonl":
            others |= {piece for item in load_prompts(other) for piece in pieces(item)}
    assert len(others) > 50  # prompts.jsonl and the outside*.jsonl files were read
    for item in bench:
        assert not pieces(item) & others, item["id"]


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
    (json.dumps({"id": "b", "category": "qa", "split": "dev", "prompt": "x"}), "split"),
    (json.dumps({"id": "", "category": "qa", "split": "train", "prompt": "x"}), "field 'id'"),
    (json.dumps({"prompt": 5}), "field 'prompt'"),
    (json.dumps({"turns": ["first", 2]}), r"field 'turns'\[0\]"),
    (json.dumps({"question_id": [1], "turns": ["x"]}), "field 'question_id'"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
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


def test_the_project_set_requires_id_category_and_split(tmp_path, monkeypatch):
    import nanospec.data.prompts as prompts

    for bad, message in [({"category": "qa", "split": "train", "prompt": "x"}, "field 'id'"),
                         ({"id": "b", "split": "train", "prompt": "x"}, "field 'category'"),
                         ({"id": "b", "category": "poetry", "split": "train", "prompt": "x"}, "field 'category'")]:
        path = write_lines(tmp_path / "own.jsonl", [GOOD, json.dumps(bad)])
        monkeypatch.setattr(prompts, "DEFAULT_PROMPTS_PATH", path)
        with pytest.raises(ValueError, match=message) as info:
            load_prompts()
        assert f"{path}:2:" in str(info.value)


def test_a_users_own_file_needs_only_the_prompt(tmp_path):
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    path = write_lines(tmp_path / "mine.jsonl", [json.dumps({"prompt": "Why is the sky blue?"}), json.dumps({"turns": turns}),
                                                 json.dumps({"prompt": "x", "category": "poetry", "id": "p1"})])
    items = load_prompts(path)
    assert [i["id"] for i in items] == ["line-1", "line-2", "p1"]
    assert prompt_messages(items[0]) == [{"role": "user", "content": "Why is the sky blue?"}]
    assert prompt_messages(items[1]) == turns
    assert [i["id"] for i in load_prompts(path, category="poetry")] == ["p1"]
    with pytest.raises(ValueError, match="no line has a 'split' field"):
        load_prompts(path, split="heldout")


def test_spec_bench_question_file(tmp_path):
    """Spec-Bench's question.jsonl: question_id, category, turns as user strings; the first turn is the prompt."""
    lines = [json.dumps({"question_id": 81, "category": "writing",
                         "turns": ["Compose a travel blog post about Hawaii.", "Rewrite it starting every sentence with A."]}),
             json.dumps({"question_id": 161, "category": "translation", "turns": ["Translate to English: Bonjour."]})]
    items = load_prompts(write_lines(tmp_path / "question.jsonl", lines))
    assert [(i["id"], i["category"]) for i in items] == [("81", "writing"), ("161", "translation")]
    assert prompt_messages(items[0]) == [{"role": "user", "content": "Compose a travel blog post about Hawaii."}]
    with pytest.raises(ValueError, match="duplicate id '81'"):
        load_prompts(write_lines(tmp_path / "dup.jsonl", [lines[0], lines[0]]))
