"""UI inputs -> engine arguments: the prompt box (plain or multi-turn), example prompts, options."""

from __future__ import annotations

import math
import re

from nanospec.config import TreeConfig, VocabConfig, default_tree
from nanospec.data.prompts import CATEGORIES, load_prompts

METHODS = ("ar", "full", "static", "nanospec", "hybrid")
SPEC_METHODS = METHODS[1:]
# slider bounds; the engine validates again (anything can arrive through the API)
LIMITS = {
    "max_new_tokens": (1, 512), "depth": (1, 12), "top_k": (1, 16), "total_tokens": (2, 128),
    "temperature": (0.0, 2.0), "top_p": (0.05, 1.0), "capacity": (64, 16384), "copy_branch": (0, 16),
}
_TREE, _VOCAB = TreeConfig(), VocabConfig()
DEFAULTS = {"method": "nanospec", "max_new_tokens": 64, "depth": _TREE.depth, "top_k": _TREE.top_k,
            "total_tokens": _TREE.total_tokens, "temperature": 0.0, "top_p": 1.0, "seed": 0,
            "capacity": _VOCAB.capacity, "copy_branch": _TREE.copy_branch}


def defaults_for(device) -> dict:
    """The page's starting values on `device`: the tree the engine picks there when none is set
    (3x4x12 + copy 10 on a CPU, 6x10x60 + copy 0 on a GPU; `nanospec.config.default_tree`), everything
    else as `DEFAULTS`."""
    tree = default_tree(device)
    return {**DEFAULTS, "depth": tree.depth, "top_k": tree.top_k, "total_tokens": tree.total_tokens,
            "copy_branch": tree.copy_branch}


INT_OPTIONS = ("max_new_tokens", "depth", "top_k", "total_tokens", "capacity", "seed", "copy_branch")

_ROLE_LINE = re.compile(r"^(system|user|assistant):[ \t]?", re.IGNORECASE)


def parse_prompt(text) -> str | list[dict]:
    """Plain text is one user turn. Text whose first line starts with `user:` / `system:` /
    `assistant:` is a conversation: each such line opens a new turn (the engine applies the chat template).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the prompt is empty: type a prompt or pick an example")
    lines = text.strip().splitlines()
    if not _ROLE_LINE.match(lines[0]):
        return text.strip()
    turns: list[dict] = []
    for line in lines:
        match = _ROLE_LINE.match(line)
        if match:
            turns.append({"role": match.group(1).lower(), "content": line[match.end():]})
        else:
            turns[-1]["content"] += "\n" + line
    turns = [{"role": t["role"], "content": t["content"].strip()} for t in turns]
    if any(not t["content"] for t in turns):
        raise ValueError("every turn needs some text after its 'user:' / 'assistant:' / 'system:' marker")
    if turns[-1]["role"] != "user":
        raise ValueError("the last turn of a conversation must be 'user:'")
    return turns


def prompt_text(item: dict) -> str:
    """A prompt-set item as prompt-box text (inverse of `parse_prompt`)."""
    if "turns" in item:
        return "\n".join(f"{t['role']}: {t['content']}" for t in item["turns"])
    return item["prompt"]


def example_prompts(per_category: int = 2) -> list[tuple[str, str]]:
    """(label, text) pairs, round-robin over the 7 categories so every page shows each category."""
    by_cat = {c: load_prompts(category=c)[:per_category] for c in CATEGORIES}
    out = []
    for i in range(per_category):
        for cat in CATEGORIES:
            if i < len(by_cat[cat]):
                item = by_cat[cat][i]
                first = item["turns"][-1]["content"] if "turns" in item else item["prompt"]
                first = " ".join(first.split())
                label = f"{cat.replace('_', '-')}: {first[:48]}{'…' if len(first) > 48 else ''}"
                out.append((label, prompt_text(item)))
    return out


def _as_int(name: str, value):
    """Sliders send floats; whole numbers become ints, anything else goes on for the engine to reject."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer; got {value!r}") from None
    return value


def generation_options(method, max_new_tokens, depth, top_k, total_tokens, temperature, top_p, seed,
                       capacity, copy_branch=DEFAULTS["copy_branch"]) -> dict:
    """Keyword options for `SpecEngine.stream` (the engine validates the ranges)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    opts = {"method": method, "max_new_tokens": max_new_tokens, "depth": depth, "top_k": top_k,
            "total_tokens": total_tokens, "temperature": temperature, "top_p": top_p,
            "seed": DEFAULTS["seed"] if seed is None else seed, "capacity": capacity,
            "copy_branch": DEFAULTS["copy_branch"] if copy_branch is None else copy_branch}
    for name in INT_OPTIONS:
        opts[name] = _as_int(name, opts[name])
    for name in ("temperature", "top_p"):
        if isinstance(opts[name], bool) or not isinstance(opts[name], (int, float)):
            raise ValueError(f"{name} must be a number; got {opts[name]!r}")
        opts[name] = float(opts[name])
    # the app's own bounds (a shared Space should not run a million tokens); the engine checks types
    for name, (lo, hi) in LIMITS.items():
        value = opts[name]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}] in this app; got {value!r}")
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2^31); got {seed!r}")
    return opts
