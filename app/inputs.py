"""UI inputs -> engine arguments: the prompt box (plain or multi-turn), example prompts, options."""

from __future__ import annotations

import math
import re

from nanospec.data.prompts import CATEGORIES, load_prompts, prompt_text
from nanospec.options import METHODS, OPTIONS, run_defaults

SPEC_METHODS = METHODS[1:]
# the run options the page offers (each a control built from its row in `nanospec.options.OPTIONS`), in the
# order the page shows them and the API takes them after the prompt
KNOBS = ("method", "max_new_tokens", "depth", "top_k", "total_tokens", "temperature", "top_p", "seed",
         "capacity", "copy_branch", "budget")
# the app's range of each knob: the option table's `ui` range for a shared front end, its sliders' bounds
# (`generation_options` holds every request to it, the engine validates again: anything can arrive through the API)
LIMITS = {name: OPTIONS[name].ui for name in KNOBS if OPTIONS[name].ui}
APP_MAX_NEW_TOKENS = 64  # the page's starting answer length (the engine's own default is longer)


def defaults_for(device) -> dict:
    """The page's starting values on `device`, name -> value in KNOBS order: what a run there gets when the
    caller sets nothing (`nanospec.options.run_defaults`: 3x4x12 + copy 10 + the draft budget on a CPU,
    6x10x60 with neither on a GPU), with the page's shorter answer length."""
    every = run_defaults(device)
    return {**{name: every[name] for name in KNOBS}, "max_new_tokens": APP_MAX_NEW_TOKENS}


DEFAULTS = defaults_for("cpu")

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
    """Sliders send floats; whole numbers become ints, anything else goes on to be refused."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer; got {value!r}") from None
    return value


def _knob_value(name: str, value):
    """One knob's value as the engine takes it: coerced by its type in the option table, within the app's
    range (its `ui` range: a shared Space should not run a million tokens), else within the table's bounds."""
    opt = OPTIONS[name]
    if opt.type is int:
        value = _as_int(name, value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer; got {value!r}")
    elif opt.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number; got {value!r}")
        value = float(value)
    if opt.ui is not None and not opt.ui[0] <= value <= opt.ui[1]:  # NaN is in no range
        raise ValueError(f"{name} must be in [{opt.ui[0]}, {opt.ui[1]}] in this app; got {value!r}")
    opt.check(value)  # a choice, a switch, or a range the app does not narrow
    return value


def generation_options(knobs: dict) -> dict:
    """Keyword options for `SpecEngine.stream` from the page's knobs (name -> value, as its controls or an API
    client send them; the engine validates again). A knob left out or None (an emptied box) gets the page's
    starting value on a CPU (`DEFAULTS`); a name that is not one of KNOBS is refused."""
    unknown = [name for name in knobs if name not in KNOBS]
    if unknown:
        raise ValueError(f"unknown options {unknown}; this app takes {', '.join(KNOBS)}")
    defaults = defaults_for("cpu")
    return {name: _knob_value(name, defaults[name] if knobs.get(name) is None else knobs[name]) for name in KNOBS}
