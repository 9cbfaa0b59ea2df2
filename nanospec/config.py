"""Configuration dataclasses for a decoding run, validated at the engine boundary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

METHODS = ("ar", "full", "static", "nanospec", "hybrid")


@dataclass
class TreeConfig:
    """EAGLE-2 dynamic tree: `depth` draft levels, `top_k` frontier width, `total_tokens` nodes incl. root.

    `copy_branch` N > 0 adds the context-copy chain (prompt lookup over the prompt and the answer so
    far, n-grams of `copy_ngram` tokens down to 1) as up to N more nodes (copy_branch.py). The
    default, 10, is the best of N = 0, 3, 6, 10 in a held-out `compare` run on a CPU
    (docs/benchmarks.md, "Context-copy branch").

    `fixed_shape`: verify the same number of nodes every step (the copy chain's unused slots stay
    as PAD nodes), as a GPU always does, where a shape that depends on data would make the host
    wait. Off, a CPU drops the PAD nodes first (it pays for every verified node); on any other
    device the shape is fixed either way.

    `budget`: the cost-aware draft budget (budget.py): each step verifies only the nodes whose
    calibrated acceptance chance pays for their share of the verification forward on this device.
    """

    depth: int = 3
    top_k: int = 4
    total_tokens: int = 12
    copy_branch: int = 10
    copy_ngram: int = 2
    fixed_shape: bool = False
    budget: bool = False

    @property
    def max_nodes(self) -> int:
        """Nodes a verification forward can hold: the drafted tree plus the copy chain's slots."""
        return self.total_tokens + self.copy_branch

    def validate(self) -> None:
        _check_int("depth", self.depth, 1, 32)
        _check_int("top_k", self.top_k, 1, 64)
        _check_int("total_tokens", self.total_tokens, 2, 512)
        _check_int("copy_branch", self.copy_branch, 0, 64)
        _check_int("copy_ngram", self.copy_ngram, 1, 16)
        for name in ("fixed_shape", "budget"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")


# the options that shape a tree (a run that sets none of them gets the device's default tree)
TREE_OPTIONS = frozenset(TreeConfig.__dataclass_fields__) - {"fixed_shape", "budget"}


def default_tree(device) -> TreeConfig:
    """The tree a run gets when the caller sets none: 3x4x12 suits a CPU, where every verified
    token costs time; a GPU verifies 60 tokens for about the price of one, so there it is
    EAGLE-2's (and NanoSpec's) depth 6, top-k 10, 60 nodes. The copy branch stays off on a GPU:
    its length was chosen on a CPU and has not been measured on a GPU."""
    if torch.device(device).type == "cuda":
        return TreeConfig(depth=6, top_k=10, total_tokens=60, copy_branch=0)
    return TreeConfig()


@dataclass
class SamplingConfig:
    """temperature 0 means greedy; otherwise lossless speculative sampling from the warped target."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy); got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p!r}")


@dataclass
class VocabConfig:
    """Which LM-head rows the drafter scores (docs/design.md §4)."""

    capacity: int = 3072        # nanospec / hybrid: max in-context ids (FIFO eviction)
    static_size: int = 32768    # static: top-N frequent ids
    core_size: int = 1024       # hybrid: top-M frequent ids always active
    ctx_topk: int = 3           # target's top-k per position added at prefill (Ctx) and per tree node (Ext)

    def validate(self) -> None:
        _check_int("capacity", self.capacity, 1, 10_000_000)
        _check_int("static_size", self.static_size, 1, 10_000_000)
        _check_int("core_size", self.core_size, 0, 10_000_000)
        _check_int("ctx_topk", self.ctx_topk, 1, 64)


@dataclass
class GenerationConfig:
    method: str = "nanospec"
    max_new_tokens: int = 128
    tree: TreeConfig = field(default_factory=TreeConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    stop_on_eos: bool = True

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        _check_int("max_new_tokens", self.max_new_tokens, 1, 1_000_000)
        self.tree.validate()
        self.sampling.validate()
        self.vocab.validate()

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def step_slots(self) -> int:
        """Context positions reserved for one step's verification: the tree's nodes, plus the copy
        chain's slots where a drafted tree carries it (every method but `ar`, which keeps the same
        reservation as a tree method without the chain, so both stop at the same length)."""
        return self.tree.max_nodes if self.method != "ar" else self.tree.total_tokens

    @classmethod
    def build(cls, method: str = "nanospec", **kw) -> "GenerationConfig":
        """Flat keyword constructor: `GenerationConfig.build("nanospec", depth=4, temperature=0.7)`."""
        parts = {"tree": TreeConfig, "sampling": SamplingConfig, "vocab": VocabConfig}
        sub = {name: {} for name in parts}
        top = {}
        for key, value in kw.items():
            owner = next((n for n, c in parts.items() if key in c.__dataclass_fields__), None)
            if owner is not None:
                sub[owner][key] = value
            elif key in cls.__dataclass_fields__:
                top[key] = value
            else:
                raise ValueError(f"unknown generation option {key!r}")
        return cls(method=method, **top, **{n: parts[n](**sub[n]) for n in parts})


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}]; got {value!r}")
