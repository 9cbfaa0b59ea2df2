"""Every run option, declared once: its name, the config that owns it, type, bounds, help and default.

The config dataclasses (`config.py`) take their defaults and their validation from this table; the
command line's decoding flags (`__main__.py`) and the app's controls and API parameters (`app/ui.py`)
are generated from it; the app's requests and the pair presets' overrides are checked against it. `run_defaults(device)` is the one
answer to "what does a run on this device get when the caller sets nothing".

    from nanospec.options import OPTIONS, run_defaults, check_option
    run_defaults("cuda")["total_tokens"]   # 60
    check_option("depth", 0)               # ValueError: depth must be an integer in [1, 32]; got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

METHODS = ("ar", "full", "static", "nanospec", "hybrid")
CONFIGS = ("run", "tree", "sampling", "vocab")  # "run": GenerationConfig's own fields
CLI_KINDS = ("value", "list", "flag", "switch", "none")
_SAME = object()  # an Option's `cuda` default when it is the same as on a CPU


@dataclass(frozen=True)
class Option:
    """One run option. `default` is a CPU's (and every device's where `cuda` is left unset); `cuda`
    is a CUDA device's where it differs. Numbers lie in [`lo`, `hi`] (`lo_open`: `lo` itself is
    excluded; None: unbounded on that side); `choices` lists a string option's values; `nullable`
    admits None. `ui` is the narrower range a shared front end offers (the app's sliders), `ui_step` its
    slider's step (None: 1 for an integer, a hundredth of the range for a number) and `label` the
    control's short name (None: the name, spaced).

    `cli` says how the command line takes it: "value" (`--name X`), "list" (`--name A,B`: compare and
    sweep run each value, `tag` naming the rows), "flag" (`--name` sets True), "switch" (`--name on|off|both`: compare runs
    both), "none" (no decoding flag: the subcommands declare it their own way, or not at all)."""

    name: str
    config: str
    type: type
    help: str
    default: object
    cuda: object = _SAME
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple | None = None
    nullable: bool = False
    ui: tuple | None = None
    ui_step: float | None = None
    label: str | None = None
    cli: str = "value"
    tag: str | None = None  # a "list" option's mark in a result row's name: `nanospec+copy10`

    def __post_init__(self):
        if self.config not in CONFIGS:
            raise ValueError(f"option {self.name!r}: config must be one of {CONFIGS}; got {self.config!r}")
        if self.cli not in CLI_KINDS:
            raise ValueError(f"option {self.name!r}: cli must be one of {CLI_KINDS}; got {self.cli!r}")
        if (self.cli in ("flag", "switch")) != (self.type is bool) and self.cli != "none":
            raise ValueError(f"option {self.name!r}: a bool takes cli 'flag' or 'switch', other types neither")
        if (self.cli == "list") != bool(self.tag):
            raise ValueError(f"option {self.name!r}: a 'list' option, and only one, names its rows with a tag")
        if self.cli == "flag" and (self.default is not False or self.per_device):
            raise ValueError(f"option {self.name!r}: a 'flag' turns on an option that is off on every device")
        for value in (self.default, self.cuda):
            if value is not _SAME:
                self.check(value)  # a default the option itself would refuse is a mistake in the table
        if self.label is None:
            object.__setattr__(self, "label", self.name.replace("_", " "))

    def default_for(self, device) -> object:
        """This option's value on `device` (a torch.device or its name) when the caller sets none."""
        if self.cuda is not _SAME and torch.device(device).type == "cuda":
            return self.cuda
        return self.default

    @property
    def per_device(self) -> bool:
        return self.cuda is not _SAME and self.cuda != self.default

    def allowed(self) -> str:
        """What values are allowed, in words: 'an integer in [1, 32]', 'a number in (0, 1]'."""
        if self.type is bool:
            text = "True or False"
        elif self.choices is not None:
            text = "one of " + ", ".join(map(str, self.choices))
        else:
            kind = "an integer" if self.type is int else "a number"
            if self.lo is not None and self.hi is not None:
                text = f"{kind} in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"
            elif self.lo is not None:
                text = f"{kind} {'>' if self.lo_open else '>='} {self.lo}"
            elif self.hi is not None:
                text = f"{kind} <= {self.hi}"
            else:
                text = kind
        return text + (" or None" if self.nullable else "")

    def check(self, value) -> None:
        """ValueError naming the option, what is allowed and what came, unless `value` is allowed."""
        if value is None and self.nullable:
            return
        if not self._ok(value):
            raise ValueError(f"{self.name} must be {self.allowed()}; got {value!r}")

    def _ok(self, value) -> bool:
        if self.type is bool:
            return isinstance(value, bool)
        if self.choices is not None:
            return isinstance(value, self.type) and value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int,) if self.type is int else (int, float)):
            return False
        if self.type is float and not math.isfinite(value):
            return False
        if self.lo is not None and not (value > self.lo if self.lo_open else value >= self.lo):
            return False
        return self.hi is None or value <= self.hi


_TABLE = [
    # GenerationConfig's own
    Option("method", "run", str, "which LM-head rows the drafter scores: ar (no drafter), full (all V), "
           "static (the most frequent ids), nanospec (the in-context set), hybrid (nanospec plus a frequent core)",
           "nanospec", choices=METHODS, cli="none"),
    Option("max_new_tokens", "run", int, "tokens to generate at most", 128, lo=1, hi=1_000_000, ui=(1, 512)),
    Option("stop_on_eos", "run", bool, "stop at the model's end-of-sequence token", True, cli="none"),
    # the draft tree (TreeConfig): 3x4x12 suits a CPU, where every verified token costs time; a GPU
    # verifies 60 tokens for about the price of one, so there it is EAGLE-2's depth 6, top-k 10, 60 nodes
    Option("depth", "tree", int, "draft tree: levels drafted per step", 3, cuda=6, lo=1, hi=32, ui=(1, 12),
           label="tree depth"),
    Option("top_k", "tree", int, "draft tree: nodes kept per level (the frontier's width)", 4, cuda=10,
           lo=1, hi=64, ui=(1, 16), label="top-k per level"),
    Option("total_tokens", "tree", int, "draft tree: nodes verified per step, the root included", 12, cuda=60,
           lo=2, hi=512, ui=(2, 128), label="total tree tokens"),
    # the copy branch and the draft budget were chosen on a CPU (docs/benchmarks.md, "Context-copy
    # branch", "Draft budget") and have not been measured on a GPU: off there
    Option("copy_branch", "tree", int, "tree methods: add the context-copy chain (prompt lookup over the prompt "
           "and the answer so far) of up to N tokens to every draft tree, 0 = off", 10, cuda=0, lo=0, hi=64,
           ui=(0, 16), label="copy branch: prompt-lookup tokens added to the tree (0 = off)", cli="list",
           tag="copy"),
    Option("copy_ngram", "tree", int, "copy branch: longest n-gram matched (then shorter ones, as transformers' "
           "prompt lookup)", 2, lo=1, hi=16),
    # drafts retrieved from the target's own past answers (nanospec/retrieval): off until measured
    Option("retrieval_nodes", "tree", int, "tree methods: add up to N nodes retrieved from the pair's store of the "
           "target's past answers (the longest match of the recent context, count-weighted), 0 = off", 0,
           lo=0, hi=64, ui=(0, 32), label="retrieved nodes added to the tree (0 = off)", cli="list", tag="retr"),
    Option("retrieval_depth", "tree", int, "retrieval: continuation tokens read per occurrence (the branch's "
           "depth)", 6, lo=1, hi=16),
    Option("retrieval_min_match", "tree", int, "retrieval: shortest context match (in tokens) that proposes "
           "anything", 2, lo=1, hi=16),
    Option("fixed_shape", "tree", bool, "verify the same number of tree nodes every step (the copy chain's unused "
           "slots as PAD nodes), as a GPU always does; a CPU otherwise drops them first", False, cli="flag"),
    Option("budget", "tree", bool, "tree methods: the cost-aware draft budget, which verifies each step only the "
           "nodes whose calibrated acceptance chance pays for their verification on this device", True,
           cuda=False, label="draft budget", cli="switch"),
    # sampling (SamplingConfig)
    Option("temperature", "sampling", float, "sampling temperature, 0 = greedy (otherwise lossless speculative "
           "sampling from the warped target)", 0.0, lo=0, ui=(0.0, 2.0), ui_step=0.05,
           label="temperature (0 = greedy)"),
    Option("top_p", "sampling", float, "nucleus sampling: keep the smallest set of tokens whose probability "
           "reaches top_p", 1.0, lo=0, lo_open=True, hi=1, ui=(0.05, 1.0), ui_step=0.05,
           label="top-p"),
    Option("seed", "sampling", int, "sampling seed (None: a fresh random one)", 0, lo=0, hi=2**64 - 1,
           nullable=True, ui=(0, 2**31 - 1)),
    # the draft vocabulary (VocabConfig)
    Option("capacity", "vocab", int, "nanospec/hybrid: most in-context ids kept (FIFO eviction)", 3072,
           lo=1, hi=10_000_000, ui=(64, 16384), ui_step=64, label="NanoSpec capacity (in-context set size limit)"),
    Option("static_size", "vocab", int, "static: the top-N most frequent ids scored", 32768, lo=1, hi=10_000_000),
    Option("core_size", "vocab", int, "hybrid: the top-M frequent ids always active", 1024, lo=0, hi=10_000_000),
    Option("ctx_topk", "vocab", int, "nanospec/hybrid: the target's top-k added per prompt position (Ctx) and "
           "per tree node (Ext)", 3, lo=1, hi=64),
]
OPTIONS: dict[str, Option] = {o.name: o for o in _TABLE}


def options_of(config: str) -> dict[str, Option]:
    """The options a config owns ("run", "tree", "sampling" or "vocab"), in table order."""
    return {name: o for name, o in OPTIONS.items() if o.config == config}


def default(name: str) -> object:
    """An option's CPU default: the config dataclasses' field defaults."""
    return OPTIONS[name].default


def check_option(name: str, value) -> None:
    """ValueError unless `name` is a run option and `value` one of its allowed values."""
    if name not in OPTIONS:
        raise ValueError(f"unknown generation option {name!r}; known: {', '.join(OPTIONS)}")
    OPTIONS[name].check(value)


def run_defaults(device) -> dict:
    """The flat options a run on `device` (a torch.device or its name: 'cpu', 'cuda', 'cuda:1', ...)
    gets when the caller sets nothing; `GenerationConfig.build(**run_defaults(device))` is that run."""
    return {name: o.default_for(device) for name, o in OPTIONS.items()}


def check_overrides(overrides: dict, config: str | None = None) -> dict:
    """`overrides` (name -> value, e.g. a preset's) checked against the table: every name a run option
    (owned by `config` when given), every value allowed. Returns them unchanged."""
    known = OPTIONS if config is None else options_of(config)
    for name, value in overrides.items():
        if name not in known:
            where = f"{config} " if config else ""
            raise ValueError(f"unknown {where}option {name!r}; known: {', '.join(known)}")
        known[name].check(value)
    return overrides
