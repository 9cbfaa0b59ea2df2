"""The page's words and colours for what the charts show: token origins, tree node kinds, the engine's
phases (plain names, groups, hovers, colours), tree node sources, and token text as labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nanospec import metrics

# the README: an *accepted draft token* (by the source that drafted it), a *bonus token*, a *vocab miss*
ACCEPTED = "accepted draft token, drafted by the head"
COPIED = "accepted draft token, copied from the context (copy chain)"
BOTH = "accepted draft token, drafted by the head and the copy chain"
RETRIEVED = "accepted draft token, retrieved from the target's past answers (retrieval)"
BONUS = "bonus token: the target's own next token"
VOCAB_MISS = "vocab miss: the target's token was outside the active set"
ORIGIN_LABELS = {metrics.ORIGIN_HEAD: ACCEPTED, metrics.ORIGIN_COPY: COPIED, metrics.ORIGIN_BOTH: BOTH,
                 metrics.ORIGIN_RETRIEVED: RETRIEVED, metrics.ORIGIN_BONUS: BONUS,
                 metrics.ORIGIN_VOCAB_MISS: VOCAB_MISS}
ORIGIN_COLORS = {ACCEPTED: "#2e9d5b", COPIED: "#b5479b", BOTH: "#13928f", RETRIEVED: "#9a6b00", BONUS: "#3b6fd8",
                 VOCAB_MISS: "#d64545"}
ORIGIN_SHORT = {ACCEPTED: "accepted draft", COPIED: "accepted draft (copy chain)",
                BOTH: "accepted draft (head + copy)", RETRIEVED: "accepted draft (retrieved)", BONUS: "bonus token",
                VOCAB_MISS: "vocab miss"}  # the answer legend's words; the full label is the hover text
# the tree's node kinds, in the same words
TREE_ACCEPTED, TREE_REJECTED, TREE_BONUS = "accepted draft token", "rejected draft token", "bonus token"

# The engine's phases (`nanospec.timing.PHASES`, the data keys) as the page names them: a plain name, the
# group it belongs to and what it is (the hover). Groups follow the metric: drafting = draft time
# (`DRAFT_PHASES`), verification = the target's forward and the acceptance rule, bookkeeping = the rest.
PHASE_GROUPS = ("drafting", "verification", "bookkeeping")


@dataclass(frozen=True)
class PhaseName:
    name: str
    group: str
    about: str


PHASE_NAMES = {
    "draft_layers": PhaseName("draft head layers", "drafting", "the draft head's decoder layer over each tree level"),
    "lm_head": PhaseName("draft LM head", "drafting",
                         "scoring the active vocabulary rows: the LM-head matmul the small vocabulary shrinks"),
    "gather_wait": PhaseName("row gather", "drafting",
                             "copying newly added LM-head rows into the active buffer (waited for on a GPU)"),
    "topk": PhaseName("top-k", "drafting", "picking the best children of each node from the draft scores"),
    "copy_lookup": PhaseName("copy lookup", "drafting", "finding a continuation of the context to copy (copy chain)"),
    "retrieval_lookup": PhaseName("store lookup", "drafting",
                                  "finding a continuation of the context in the store of the target's past answers"),
    "verify_forward": PhaseName("target verify", "verification",
                                "one forward of the target over the whole draft tree"),
    "accept": PhaseName("accept / reject", "verification",
                        "comparing the drafts with the target's tokens; picking the bonus token"),
    "tree_build": PhaseName("tree build", "bookkeeping", "reranking drafted nodes and building the tree's mask"),
    "kv_compact": PhaseName("cache trim", "bookkeeping", "keeping only the accepted path's entries in the KV caches"),
    "vocab_update": PhaseName("vocab update", "bookkeeping", "adding the step's new ids to the active set"),
    "budget": PhaseName("draft budget", "bookkeeping", "choosing which drafted nodes are worth verifying"),
}
# one hue family per group: oranges for drafting, blues for verification, greys/greens for bookkeeping, each
# shade far enough from its neighbours in the stack to tell apart
PHASE_COLORS = {
    "draft_layers": "#d9480f", "lm_head": "#f59f00", "gather_wait": "#862e08", "topk": "#ffd43b",
    "copy_lookup": "#f783ac", "retrieval_lookup": "#e64980",
    "verify_forward": "#1c5fc9", "accept": "#74c0fc",
    "tree_build": "#495057", "kv_compact": "#adb5bd", "vocab_update": "#2b8a3e", "budget": "#8ce99a",
}


def phase_name(phase: str) -> str:
    """The plain name of an engine phase (its identifier when the page has none)."""
    return PHASE_NAMES[phase].name if phase in PHASE_NAMES else phase


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 step`, `2 steps` (`many` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


# where a draft-tree node came from (StepEvent.tree_sources): marker shape and hover text
SOURCE_SYMBOLS = {"head": "circle", "copy": "diamond", "both": "hexagram", "retrieved": "triangle-up"}
SOURCE_LEGEND = {"copy": "copy chain", "both": "head + copy", "retrieved": "retrieved"}  # short: the hover says more
SOURCE_TEXT = {"head": "the draft head", "copy": "the context-copy chain (prompt lookup)",
               "both": "the draft head and the copy chain",
               "retrieved": "the store of the target's past answers (retrieval)"}


def token_label(token_id: int, token_text: Mapping[int, str] | None) -> str:
    """Readable text of one token for hovers and node labels (whitespace made visible)."""
    text = (token_text or {}).get(int(token_id))
    if text is None:
        return f"⟨{int(token_id)}⟩"
    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    return shown if shown.strip() else shown.replace(" ", "·") or "∅"


NODE_LABEL_CHARS = 10


def node_label(token_id: int, token_text: Mapping[int, str] | None) -> str:
    """A draft-tree node's label: `token_label` cut to `NODE_LABEL_CHARS`, and a token of punctuation only
    ("." or ",") in quotes, so it reads as a token and not as a speck beside the marker."""
    label = token_label(token_id, token_text)
    if len(label) > NODE_LABEL_CHARS:
        label = label[:NODE_LABEL_CHARS - 1] + "…"
    core = label.replace("·", "").strip()
    if core and not any(ch.isalnum() for ch in core) and core not in ("∅", "⏎", "⇥"):
        label = f"“{label}”"
    return label

