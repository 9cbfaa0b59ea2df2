"""The project's prompt set (``assets/prompts/prompts.jsonl``): loading, validation, chat messages."""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import ASSETS

CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math", "rag", "code")
SPLITS = ("train", "heldout")
ROLES = ("system", "user", "assistant")
DEFAULT_PROMPTS_PATH = ASSETS / "prompts" / "prompts.jsonl"


def load_prompts(path: str | Path | None = None, split: str | None = None,
                 category: str | None = None) -> list[dict]:
    """Read and validate the prompt file; optionally keep one split and/or one category."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES} or None, got {category!r}")
    path = Path(path) if path is not None else DEFAULT_PROMPTS_PATH
    items: list[dict] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err
            _validate(item, f"{path}:{line_no}")
            if item["id"] in seen:
                raise ValueError(f"{path}:{line_no}: duplicate id {item['id']!r}")
            seen.add(item["id"])
            items.append(item)
    return [item for item in items
            if (split is None or item["split"] == split)
            and (category is None or item["category"] == category)]


def prompt_messages(item: dict) -> list[dict]:
    """Chat messages for ``tokenizer.apply_chat_template``: the turns, or one user message."""
    if "turns" in item:
        return [{"role": turn["role"], "content": turn["content"]} for turn in item["turns"]]
    return [{"role": "user", "content": item["prompt"]}]


def _validate(item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: each line must be a JSON object")
    for key in ("id", "category", "split"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ValueError(f"{where}: missing or empty {key!r}")
    if item["category"] not in CATEGORIES:
        raise ValueError(f"{where}: category {item['category']!r} is not one of {CATEGORIES}")
    if item["split"] not in SPLITS:
        raise ValueError(f"{where}: split {item['split']!r} is not one of {SPLITS}")
    has_prompt, has_turns = "prompt" in item, "turns" in item
    if has_prompt == has_turns:
        raise ValueError(f"{where}: needs exactly one of 'prompt' or 'turns'")
    if has_prompt and (not isinstance(item["prompt"], str) or not item["prompt"].strip()):
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    if has_turns:
        turns = item["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: 'turns' must be a non-empty list")
        for turn in turns:
            if (not isinstance(turn, dict) or turn.get("role") not in ROLES
                    or not isinstance(turn.get("content"), str) or not turn["content"].strip()):
                raise ValueError(f"{where}: each turn needs a role in {ROLES} and non-empty content")
        if turns[-1]["role"] != "user":
            raise ValueError(f"{where}: the last turn must be from the user")
