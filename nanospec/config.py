"""Configuration dataclasses for a decoding run, validated at the engine boundary.

Each field is a run option of `options.py`: its default (a CPU's) and its allowed values come from
that table, which is also where a GPU's defaults and every front end's flags and controls come from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from nanospec.options import METHODS, OPTIONS, default, options_of, run_defaults

__all__ = ["METHODS", "TREE_OPTIONS", "GenerationConfig", "SamplingConfig", "TreeConfig", "VocabConfig",
           "default_tree"]


@dataclass
class TreeConfig:
    """EAGLE-2 dynamic tree: `depth` draft levels, `top_k` frontier width, `total_tokens` nodes incl. root.

    `copy_branch` N > 0 adds the context-copy chain (prompt lookup over the prompt and the answer so
    far, n-grams of `copy_ngram` tokens down to 1) as up to N more nodes (copy_branch.py). The
    default, 10, is the best of N = 0, 3, 6, 10 in a held-out `compare` run on a CPU
    (docs/benchmarks.md, "Context-copy branch").

    `retrieval_nodes` N > 0 adds up to N nodes looked up in the pair's store of the target's past
    answers (retrieved_branch.py): what followed the longest match (at least `retrieval_min_match`
    tokens) of the recent context there, `retrieval_depth` tokens deep, the most frequent first. Off
    by default (not yet measured); an engine without a store leaves it off.

    `fixed_shape`: verify the same number of nodes every step (the copy chain's unused slots stay
    as PAD nodes), as a GPU always does, where a shape that depends on data would make the host
    wait. Off, a CPU drops the PAD nodes first (it pays for every verified node); on any other
    device the shape is fixed either way.

    `budget`: the cost-aware draft budget (budget.py): each step verifies only the nodes whose
    calibrated acceptance chance pays for their share of the verification forward on this device.
    On by default: faster than the fixed tree on the held-out and the outside prompts on a CPU
    (docs/benchmarks.md, "Draft budget"); off in a GPU's default tree, where it is not measured.
    """

    depth: int = default("depth")
    top_k: int = default("top_k")
    total_tokens: int = default("total_tokens")
    copy_branch: int = default("copy_branch")
    copy_ngram: int = default("copy_ngram")
    retrieval_nodes: int = default("retrieval_nodes")
    retrieval_depth: int = default("retrieval_depth")
    retrieval_min_match: int = default("retrieval_min_match")
    fixed_shape: bool = default("fixed_shape")
    budget: bool = default("budget")

    @property
    def max_nodes(self) -> int:
        """Nodes a verification forward can hold: the drafted tree plus the copy chain's and the
        retrieved branch's slots."""
        return self.total_tokens + self.copy_branch + self.retrieval_nodes

    @property
    def max_depth(self) -> int:
        """The deepest node a tree can have: the drafted levels plus the copy chain, or the retrieved branch."""
        return max(self.depth + self.copy_branch, self.retrieval_depth if self.retrieval_nodes else 0)

    def validate(self) -> None:
        _check_fields(self)


# the options that shape a tree (a run that sets none of them gets the device's default tree)
# (the retrieved branch's options add to whatever tree the run gets, as the budget does)
TREE_OPTIONS = frozenset(TreeConfig.__dataclass_fields__) - {"fixed_shape", "budget", "retrieval_nodes",
                                                             "retrieval_depth", "retrieval_min_match"}


def default_tree(device) -> TreeConfig:
    """The tree a run gets when the caller sets none (`options.run_defaults`): 3x4x12 suits a CPU,
    where every verified token costs time; a GPU verifies 60 tokens for about the price of one, so
    there it is EAGLE-2's (and NanoSpec's) depth 6, top-k 10, 60 nodes. The copy branch and the draft
    budget stay off on a GPU: both were chosen on a CPU and have not been measured on a GPU."""
    defaults = run_defaults(device)
    return TreeConfig(**{name: defaults[name] for name in options_of("tree")})


@dataclass
class SamplingConfig:
    """temperature 0 means greedy; otherwise lossless speculative sampling from the warped target."""

    temperature: float = default("temperature")
    top_p: float = default("top_p")
    seed: int | None = default("seed")  # None: a fresh random seed per run

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        _check_fields(self)


@dataclass
class VocabConfig:
    """Which LM-head rows the drafter scores (docs/design.md §4)."""

    capacity: int = default("capacity")        # nanospec / hybrid: max in-context ids (FIFO eviction)
    static_size: int = default("static_size")  # static: top-N frequent ids
    core_size: int = default("core_size")      # hybrid: top-M frequent ids always active
    ctx_topk: int = default("ctx_topk")        # target's top-k added per prompt position (Ctx) and tree node (Ext)

    def validate(self) -> None:
        _check_fields(self)


@dataclass
class GenerationConfig:
    method: str = default("method")
    max_new_tokens: int = default("max_new_tokens")
    tree: TreeConfig = field(default_factory=TreeConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    stop_on_eos: bool = default("stop_on_eos")

    def validate(self) -> None:
        for f in fields(self):
            if f.name not in ("tree", "sampling", "vocab"):
                OPTIONS[f.name].check(getattr(self, f.name))
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
        sub = {name: {} for name in ("run", *parts)}
        for key, value in kw.items():
            if key not in OPTIONS:
                raise ValueError(f"unknown generation option {key!r}")
            sub[OPTIONS[key].config][key] = value  # which config owns it: the options table says
        return cls(method=method, **sub["run"], **{n: parts[n](**sub[n]) for n in parts})


def _check_fields(config) -> None:
    """Every field of a tree, sampling or vocabulary config against its run option's allowed values."""
    for f in fields(config):
        OPTIONS[f.name].check(getattr(config, f.name))
