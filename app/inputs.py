"""UI inputs -> engine arguments: the prompt box (plain or multi-turn), example prompts, options."""

from __future__ import annotations

import math
import re

from nanospec.data.prompts import CATEGORIES, load_prompts
from nanospec.options import METHODS, OPTIONS, run_defaults

SPEC_METHODS = METHODS[1:]
# the knobs the page offers, in the order the callbacks and the API take them
KNOBS = ("method", "max_new_tokens", "depth", "top_k", "total_tokens", "temperature", "top_p", "seed",
         "capacity", "copy_branch", "budget")
# slider bounds: the option table's ranges for a shared front end (the engine validates again:
# anything can arrive through the API)
LIMITS = {name: OPTIONS[name].ui for name in KNOBS if OPTIONS[name].ui}
APP_MAX_NEW_TOKENS = 64  # the page's starting answer length (the engine's own default is longer)


def defaults_for(device) -> dict:
    """The page's starting values on `device`: what a run there gets when the caller sets nothing
    (`nanospec.options.run_defaults`: 3x4x12 + copy 10 + the draft budget on a CPU, 6x10x60 with
    neither on a GPU), with the page's shorter answer length."""
    every = run_defaults(device)
    return {**{name: every[name] for name in KNOBS}, "max_new_tokens": APP_MAX_NEW_TOKENS}


DEFAULTS = defaults_for("cpu")
INT_OPTIONS = tuple(name for name in KNOBS if OPTIONS[name].type is int)

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
                       capacity, copy_branch=DEFAULTS["copy_branch"], budget=DEFAULTS["budget"]) -> dict:
    """Keyword options for `SpecEngine.stream` (the engine validates the ranges). `budget`: the
    cost-aware draft budget (`TreeConfig.budget`), True or False (None: the engine's default)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    opts = {"method": method, "max_new_tokens": max_new_tokens, "depth": depth, "top_k": top_k,
            "total_tokens": total_tokens, "temperature": temperature, "top_p": top_p,
            "seed": DEFAULTS["seed"] if seed is None else seed, "capacity": capacity,
            "copy_branch": DEFAULTS["copy_branch"] if copy_branch is None else copy_branch,
            "budget": DEFAULTS["budget"] if budget is None else budget}
    for name in INT_OPTIONS:
        opts[name] = _as_int(name, opts[name])
    for name in ("temperature", "top_p"):
        if isinstance(opts[name], bool) or not isinstance(opts[name], (int, float)):
            raise ValueError(f"{name} must be a number; got {opts[name]!r}")
        opts[name] = float(opts[name])
    if not isinstance(opts["budget"], bool):  # a checkbox sends a bool; the API may send anything
        raise ValueError(f"budget must be true or false; got {opts['budget']!r}")
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2^31); got {seed!r}")
    # the app's own bounds (a shared Space should not run a million tokens); the engine checks types
    for name, (lo, hi) in LIMITS.items():
        value = opts[name]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}] in this app; got {value!r}")
    return opts
