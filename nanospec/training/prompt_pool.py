"""The prompt pool of the answer-generation job: a seeded mix of every kind of request, frozen in parts.

The pool is an endless list cut into parts of ``part_size`` conversations. Part k is built once from
its own seed (templated and open instructions, real-text tasks, extraction, multi-turn chats, math;
see ``FAMILY_WEIGHTS``), shuffled so any prefix is a fair mix, and written to
``pool-<k>.jsonl.gz`` in the data folder. Freezing it matters: the real-text tasks read files of
this machine (package documentation, gettext catalogs) that change when packages are installed,
and the job's cursor is an index into the pool.

No conversation of the pool is, or shares a passage with, an evaluation prompt: the held-out split
of ``assets/prompts/prompts.jsonl`` and every ``assets/prompts/outside*.jsonl`` (:class:`LeakGuard`).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from pathlib import Path

from nanospec.paths import ASSETS
from nanospec.training.instructions import Messages

FAMILY_WEIGHTS = {"passage": 18, "code": 12, "translation": 10, "extraction": 10, "math": 10, "multi_turn": 10,
                  "open": 18, "templated": 12}
PART_SIZE = 6000
SHINGLE_WORDS = 8


# ---- evaluation prompts and the leak guard --------------------------------------------------------


def evaluation_conversations(prompt_dir: Path | None = None) -> list[Messages]:
    """Every evaluation prompt this repository holds: the held-out split and all outside sets."""
    from nanospec.data.prompts import load_prompts, prompt_messages

    folder = prompt_dir or ASSETS / "prompts"
    convs = [prompt_messages(p) for p in load_prompts(folder / "prompts.jsonl", split="heldout")]
    for path in sorted(folder.glob("outside*.jsonl")):
        convs += [prompt_messages(p) for p in load_prompts(path)]
    return convs


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(text: str) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + SHINGLE_WORDS]) for i in range(len(w) - SHINGLE_WORDS + 1)}


class LeakGuard:
    """Says whether a conversation leaks an evaluation prompt: any turn equal to an evaluation turn (case
    and punctuation aside), or any run of ``SHINGLE_WORDS`` words shared with one (a copied passage)."""

    def __init__(self, evaluation: list[Messages]):
        texts = [m["content"] for conv in evaluation for m in conv if m["role"] == "user"]
        self.exact = {" ".join(_words(t)) for t in texts}
        self.shingles = set().union(*(_shingles(t) for t in texts)) if texts else set()

    def leaks(self, messages: Messages) -> bool:
        for m in messages:
            if " ".join(_words(m["content"])) in self.exact or not self.shingles.isdisjoint(_shingles(m["content"])):
                return True
        return False


# ---- building a part ------------------------------------------------------------------------------


def _family_makers(seed: int, rng: random.Random, pools) -> dict:
    """family -> make(attempt) returning one conversation (the list-based families are made in bulk)."""
    from nanospec.training import extra_tasks
    from nanospec.training.real_tasks import code_task, passage_task, translation_task

    makers = {"extraction": lambda _: extra_tasks.extraction(rng), "math": lambda _: extra_tasks.math(rng),
              "multi_turn": lambda _: extra_tasks.multi_turn(rng)}
    if pools.passages:
        makers["passage"] = lambda _: passage_task(pools, rng)
    if pools.functions:
        makers["code"] = lambda _: code_task(pools, rng)
    if pools.pairs:
        makers["translation"] = lambda _: translation_task(pools, rng)
    return makers


def _counts(size: int, families: list[str]) -> dict[str, int]:
    weights = {f: FAMILY_WEIGHTS[f] for f in families}
    total = sum(weights.values())
    counts = {f: size * w // total for f, w in weights.items()}
    counts[families[0]] += size - sum(counts.values())
    return counts


def build_part(part: int, size: int, seed: int, exclude: list[Messages], guard: LeakGuard,
               pools=None, earlier: list[Messages] = ()) -> list[dict]:
    """Part `part` of the pool: `size` items {"source", "messages"}, seeded by (seed, part), shuffled, none
    equal to a conversation of `exclude` (the train prompts; their last turns too) or of `earlier` (the
    earlier parts' conversations, as wholes), or leaking."""
    from nanospec.training.instructions import distinct_conversations, make_instructions
    from nanospec.training.open_instructions import make_open_instructions
    from nanospec.training.real_tasks import load_pools

    part_seed = seed * 1000 + part
    rng = random.Random(f"pool-{part_seed}")
    if pools is None:
        pools = load_pools(None, part_seed, sizes=(0, 2000, 2000, 4000))
    makers = _family_makers(part_seed, rng, pools)
    families = [f for f in FAMILY_WEIGHTS if f in makers or f in ("open", "templated")]
    seen = list(exclude) + list(earlier)
    last_turns = list(exclude)   # not the earlier parts': a chat's follow-up question recurs across chats
    items: list[dict] = []
    for family, n in _counts(size, families).items():
        if family == "open":
            convs = make_open_instructions(n * 2, seed=1000 + part_seed, exclude=seen)
        elif family == "templated":
            convs = make_instructions(n * 2, seed=1000 + part_seed, exclude=seen)
        else:
            convs = distinct_conversations(n * 2, makers[family], seen, family, last_turns)
        convs = [c for c in convs if not guard.leaks(c)][:n]
        if len(convs) < n:
            raise ValueError(f"prompt pool part {part}: only {len(convs)} of {n} {family} prompts could be made")
        seen += convs
        last_turns += convs
        items += [{"source": family, "messages": c} for c in convs]
    rng.shuffle(items)
    return items


# ---- frozen parts on disk -------------------------------------------------------------------------


def part_path(folder: Path, part: int) -> Path:
    return folder / f"pool-{part:03d}.jsonl.gz"


def write_part(path: Path, items: list[dict]) -> None:
    """Atomic, byte-reproducible (gzip without a timestamp)."""
    tmp = path.with_name(path.name + ".tmp")
    data = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(data)
    os.replace(tmp, path)


def read_part(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class PromptPool:
    """Index -> conversation over the frozen parts of one data folder; parts are built when first needed."""

    def __init__(self, folder: Path, seed: int = 0, part_size: int = PART_SIZE, log=print, pools=None):
        if part_size < 1:
            raise ValueError(f"part_size must be >= 1, got {part_size}")
        self.folder, self.seed, self.part_size, self.log = Path(folder), seed, part_size, log
        self._parts: dict[int, list[dict]] = {}
        self._guard: LeakGuard | None = None
        self._pools = pools

    def item(self, index: int) -> dict:
        part = self._part(index // self.part_size)
        return part[index % self.part_size]

    def _part(self, k: int) -> list[dict]:
        if k not in self._parts:
            path = part_path(self.folder, k)
            if not path.exists():
                self._build(k, path)
            self._parts[k] = read_part(path)
            if len(self._parts[k]) != self.part_size:
                raise ValueError(f"{path}: holds {len(self._parts[k])} prompts, the manifest says parts of "
                                 f"{self.part_size}")
        return self._parts[k]

    def _build(self, k: int, path: Path) -> None:
        from nanospec.data.prompts import load_prompts, prompt_messages

        if self._guard is None:
            self._guard = LeakGuard(evaluation_conversations())
        earlier = [it["messages"] for j in range(k) for it in self._part(j)]
        train = [prompt_messages(p) for p in load_prompts(split="train")]
        self.log(f"building prompt pool part {k} ({self.part_size} prompts) in {path}")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_part(path, build_part(k, self.part_size, self.seed, train, self._guard,
                                           self._pools, earlier=earlier))
