"""Prompt files: the project's set (``assets/prompts/prompts.jsonl``), a user's own JSONL or Spec-Bench's
``question.jsonl``: loading, validation, chat messages."""

from __future__ import annotations

import json
from pathlib import Path

from nanospec.paths import ASSETS

CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math", "rag", "code")
SPLITS = ("train", "heldout", "outside")  # outside: kinds the set lacks (outside.jsonl), never trained on
ROLES = ("system", "user", "assistant")
DEFAULT_PROMPTS_PATH = ASSETS / "prompts" / "prompts.jsonl"
OUTSIDE_PROMPTS_PATH = ASSETS / "prompts" / "outside.jsonl"


def load_prompts(path: str | Path | None = None, split: str | None = None,
                 category: str | None = None) -> list[dict]:
    """Read and validate a JSONL prompt file; optionally keep one split and/or one category.

    Each line is one JSON object with either `prompt` (a string) or `turns`: a conversation
    (`{"role", "content"}` objects ending with the user) or Spec-Bench's list of user strings, of
    which the first turn is used (later turns need the model's own answer to the first).
    `id` (or Spec-Bench's `question_id`), `category` and `split` are optional in a user's file; the
    project's own set (the default) must have all three, from `CATEGORIES` and `SPLITS`.
    Errors name the file, the line and the field.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    path = Path(path) if path is not None else DEFAULT_PROMPTS_PATH
    own_set = path.resolve() == DEFAULT_PROMPTS_PATH.resolve()
    if category is not None and own_set and category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES} or None, got {category!r}")
    items: list[dict] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                raw = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as err:
                raise ValueError(f"{where}: not valid JSON ({getattr(err, 'msg', 'nested too deeply')})") from None
            item = _normalise(raw, where, own_set, default_id=f"line-{line_no}")
            if item["id"] in seen:
                raise ValueError(f"{where}: field 'id': duplicate id {item['id']!r}")
            seen.add(item["id"])
            items.append(item)
    if split is not None and items and not any("split" in item for item in items):
        raise ValueError(f"{path}: no line has a 'split' field, so split={split!r} would keep nothing")
    return [item for item in items
            if (split is None or item.get("split") == split)
            and (category is None or item.get("category") == category)]


def prompt_messages(item: dict) -> list[dict]:
    """Chat messages for ``tokenizer.apply_chat_template``: the turns, or one user message."""
    if "turns" in item:
        return [{"role": turn["role"], "content": turn["content"]} for turn in item["turns"]]
    return [{"role": "user", "content": item["prompt"]}]


def prompt_text(item: dict) -> str:
    """An item as prompt-box text (`role: content` lines for a conversation; the inverse of the app's
    `parse_prompt`)."""
    if "turns" in item:
        return "\n".join(f"{t['role']}: {t['content']}" for t in item["turns"])
    return item["prompt"]


def prompt_input(item: dict) -> str | list[dict]:
    """What the engine encodes for one item (`SpecEngine.encode`): a single prompt as its text (a
    tokenizer with a chat template wraps it as one user turn, exactly `prompt_messages`; a base
    model without one reads the text as is), multi-turn items as their turns (chat models only)."""
    return item["prompt"] if "turns" not in item else prompt_messages(item)


def _normalise(item: object, where: str, own_set: bool, default_id: str) -> dict:
    """A validated copy of one line: `id` always set, Spec-Bench's fields mapped to this project's."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: each line must be a JSON object, got {type(item).__name__}")
    item = dict(item)
    if "question_id" in item and "id" not in item:  # Spec-Bench / MT-Bench question.jsonl
        qid = item.pop("question_id")
        if isinstance(qid, bool) or not isinstance(qid, (int, str)) or str(qid) == "":
            raise ValueError(f"{where}: field 'question_id' must be an integer or a non-empty string")
        item["id"] = str(qid)
    required = ("id", "category", "split") if own_set else ()
    for key in ("id", "category", "split"):
        if key in item or key in required:
            if not isinstance(item.get(key), str) or not item[key]:
                raise ValueError(f"{where}: field {key!r}: missing or empty (must be a non-empty string)")
    item.setdefault("id", default_id)
    if own_set and item["category"] not in CATEGORIES:
        raise ValueError(f"{where}: field 'category': {item['category']!r} is not one of {CATEGORIES}")
    if "split" in item and item["split"] not in SPLITS:
        raise ValueError(f"{where}: field 'split': {item['split']!r} is not one of {SPLITS}")
    has_prompt, has_turns = "prompt" in item, "turns" in item
    if has_prompt == has_turns:
        raise ValueError(f"{where}: needs exactly one of 'prompt' or 'turns' (fields)")
    if has_prompt and (not isinstance(item["prompt"], str) or not item["prompt"].strip()):
        raise ValueError(f"{where}: field 'prompt' must be a non-empty string")
    if has_turns:
        turns = item["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: field 'turns' must be a non-empty list")
        if all(isinstance(t, str) for t in turns):  # Spec-Bench: user strings; the first turn is the prompt
            if not turns[0].strip():
                raise ValueError(f"{where}: field 'turns'[0] must be a non-empty string")
            item["prompt"] = turns[0]
            del item["turns"]
        else:
            _check_turns(turns, where)
    return item


def _check_turns(turns: list, where: str) -> None:
    for i, turn in enumerate(turns):
        if (not isinstance(turn, dict) or turn.get("role") not in ROLES
                or not isinstance(turn.get("content"), str) or not turn["content"].strip()):
            raise ValueError(f"{where}: field 'turns'[{i}]: each turn needs a role in {ROLES} and non-empty "
                             "content (or give every turn as a plain user string, as Spec-Bench does)")
    if turns[-1]["role"] != "user":
        raise ValueError(f"{where}: field 'turns': the last turn must be from the user")
