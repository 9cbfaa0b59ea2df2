"""What a decoding step reports (`StepEvent`), the run's `RunSummary`, and trace I/O (JSON / CSV)."""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from nanospec import metrics
from nanospec.timing import DRAFT_PHASES, PHASES

if TYPE_CHECKING:  # pandas is imported where a frame is made: decoding itself never needs it
    import pandas as pd

TRACE_VERSION = 1
TRACE_FILES = "a trace is the .json or .csv file that Download trace or `nanospec generate --trace` saves"
MISS_KINDS = ("none", "vocab", "draft")
STOP_REASONS = ("eos", "max_new_tokens", "context_limit", "stopped")


def stop_message(reason: str, max_context: int | None = None) -> str:
    """Why a run ended, in words (the CLI prints it, the app shows it)."""
    if reason == "context_limit":
        size = f" of {max_context:,} tokens" if max_context else ""
        return (f"stopped at the model's context limit{size}: the prompt, the answer so far and one draft "
                "tree must fit in it. Shorten the prompt or ask for fewer new tokens.")
    return {"eos": "the model ended its answer (end-of-sequence token)",
            "max_new_tokens": "reached the requested number of new tokens",
            "stopped": "stopped before the end (Stop, or the caller closed the run)"}.get(reason, reason)
ACCEPT_SOURCES = metrics.DRAFT_ORIGINS  # where an accepted draft token's node came from (head / copy / both)


# fields a trace may lack: saved before the copy branch (tree_sources) or the draft budget
OPTIONAL_FIELDS = ("tree_sources", "drafted_nodes", "expected_tokens", "budget_threshold")


@dataclass
class StepEvent:
    step: int                      # 0 = prefill, then one per target forward
    method: str
    root_token: int                # last token the target emitted before this step
    tree_tokens: list[int]         # node 0 = root
    tree_parents: list[int]
    tree_depths: list[int]
    tree_logprobs: list[float]     # cumulative draft log-prob per node (0 for the root)
    tree_in_active: list[bool]     # token was in the active set when drafted
    accepted_path: list[int]       # node indices, starting at the root
    accepted_tokens: list[int]     # drafted tokens the target accepted (excl. root)
    bonus_token: int               # the target's own token after the accepted path
    tokens: list[int]              # what this step emitted (accepted + bonus, cut at EOS / budget)
    active_size: int               # rows the drafter scored (V for `full`, 0 for `ar`)
    added_ids: int                 # ids added to the active set after this step's verification
    vocab_size: int
    coverage: bool | None          # bonus token in the active set when the tree was drafted
    miss_kind: str                 # none | vocab | draft
    wall_ms: float
    phases: dict[str, float] = field(default_factory=dict)
    # per node: root | head (the drafter) | copy (the context-copy chain) | both (the head drafted
    # what the copy chain proposed); empty in traces saved before the copy branch existed
    tree_sources: list[str] = field(default_factory=list)
    # the cost-aware draft budget (budget.py), when on: nodes drafted before it pruned (the root
    # included; the verified ones are tree_tokens), the expected tokens of the verified tree, and
    # λ·Δc, the mean price of one more verified node in tokens (λ the request's tokens per ms, Δc the
    # cost curve's mean ms per token; the budget prices each tree size by the curve itself)
    drafted_nodes: int = 0
    expected_tokens: float | None = None
    budget_threshold: float | None = None

    @property
    def is_prefill(self) -> bool:
        return self.step == 0

    @property
    def n_emitted(self) -> int:
        return len(self.tokens)

    @property
    def draft_ms(self) -> float:
        return sum(self.phases.get(p, 0.0) for p in DRAFT_PHASES)

    def accepted_outside(self) -> int:
        """Accepted draft tokens that were outside the active set (the copy chain can copy such a
        token under a static set; the head never drafts one)."""
        flags = self.tree_in_active
        return sum(not flags[i] for i in self.accepted_path[1:] if i < len(flags))

    def accepted_sources(self) -> list[str]:
        """Source of each accepted draft token (head / copy / both); "head" for older traces."""
        return metrics.accepted_origins(self.accepted_path, self.tree_sources)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepEvent":
        names = {f.name for f in fields(cls)}
        missing = names - set(d) - {"phases"} - set(OPTIONAL_FIELDS)
        if missing:
            raise ValueError(f"not a NanoSpec trace step: missing fields {sorted(missing)}")
        event = cls(**{k: v for k, v in d.items() if k in names})
        check_types(event, f"step {d.get('step')!r}")
        for name in ("tree_tokens", "accepted_tokens", "tokens"):
            if any(not 0 <= t < event.vocab_size for t in getattr(event, name)):
                raise ValueError(f"step {event.step}: field {name!r} holds ids outside [0, {event.vocab_size})")
        return event


def check_types(record, where: str) -> None:
    """ValueError naming the field when a dataclass read from a file holds a value of the wrong type."""
    hints = _type_hints(type(record))
    for f in fields(record):
        value = getattr(record, f.name)
        if not _is(value, hints[f.name]):
            raise ValueError(f"{where}: field {f.name!r} must be {_type_name(hints[f.name])}; got {value!r:.60}")


@functools.cache
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _is(value, hint) -> bool:
    """`value` matches `hint` (int, float, bool, str, X | None, list[X], dict[str, X]); ints pass as floats."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_is(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_is(k, args[0]) and _is(v, args[1]) for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**62
    return isinstance(value, hint)


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) if typing.get_origin(hint) is None else str(hint).replace("typing.", "")


@dataclass
class RunSummary:
    method: str
    new_tokens: int
    steps: int                  # decode steps (target forwards after prefill)
    wall_s: float
    tokens_per_s: float
    tau: float                  # tokens emitted per target forward, mean over decode steps (NaN: none)
    mean_active: float
    active_frac: float
    vocab_size: int
    coverage: float | None      # share of emitted tokens that were in the active set when drafted
    draft_ms_per_step: float
    lm_head_ms_per_step: float
    draft_share: float          # draft time / decode wall time
    prefill_ms: float
    stop_reason: str            # one of STOP_REASONS: eos | max_new_tokens | context_limit | stopped
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    miss_counts: dict[str, int] = field(default_factory=dict)
    # accepted draft tokens by the source of their node: head, copy (copy chain only), both
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    decode_tokens_per_s: float = math.nan  # tokens after the first / decoding time after prefill
    ttft_ms: float = math.nan               # time to first token: the prefill step's wall time

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(events: list[StepEvent], method: str, wall_s: float, stop_reason: str,
              text: str = "") -> RunSummary:
    decode = [e for e in events if not e.is_prefill]
    prefill = [e for e in events if e.is_prefill]
    new_tokens = sum(e.n_emitted for e in events)
    n = len(decode)
    vocab = events[0].vocab_size if events else 0
    # tau counts every emitted token incl. the bonus; a step cut at EOS still counts what it emitted
    tau = metrics.tau(e.n_emitted for e in decode)
    active = metrics.mean_active(e.active_size for e in decode)
    coverage = metrics.coverage([len(e.accepted_tokens) for e in decode], [e.coverage for e in decode],
                                [e.accepted_outside() for e in decode])
    sources = [s for e in decode for s in e.accepted_sources()]
    decode_ms = sum(e.wall_ms for e in decode)
    prefill_ms = sum(e.wall_ms for e in prefill)
    draft_ms = sum(e.draft_ms for e in decode)
    return RunSummary(
        method=method,
        new_tokens=new_tokens,
        steps=n,
        wall_s=wall_s,
        tokens_per_s=metrics.tokens_per_s(new_tokens, wall_s),
        tau=tau,
        mean_active=active,
        active_frac=active / vocab if vocab else math.nan,
        vocab_size=vocab,
        coverage=coverage,
        draft_ms_per_step=metrics.mean(e.draft_ms for e in decode),
        lm_head_ms_per_step=metrics.mean(e.phases.get("lm_head", 0.0) for e in decode),
        draft_share=draft_ms / decode_ms if decode_ms > 0 else 0.0,
        prefill_ms=prefill_ms,
        stop_reason=stop_reason,
        output_ids=[t for e in events for t in e.tokens],
        text=text,
        miss_counts={k: sum(e.miss_kind == k for e in decode) for k in MISS_KINDS},
        accepted_by_source={k: sources.count(k) for k in ACCEPT_SOURCES},
        decode_tokens_per_s=metrics.decode_tokens_per_s(new_tokens, wall_s, prefill_ms / 1e3),
        ttft_ms=prefill_ms if prefill else math.nan,
    )


# -- frames and trace files ------------------------------------------------------
LIST_COLUMNS = ("tree_tokens", "tree_parents", "tree_depths", "tree_logprobs", "tree_in_active",
                "accepted_path", "accepted_tokens", "tokens", "tree_sources")
OPTIONAL_COLUMNS = ("tree_sources",)  # absent from traces saved before the copy branch


def events_to_frame(events: list[StepEvent]) -> pd.DataFrame:
    """One row per step; phases flattened to `phase_<name>` columns (ms); list columns kept as lists."""
    import pandas as pd

    rows = []
    for e in events:
        row = {k: v for k, v in e.to_dict().items() if k != "phases"}
        for p in PHASES:
            row[f"phase_{p}"] = float(e.phases.get(p, 0.0))
        row["draft_ms"] = e.draft_ms
        row["n_accepted"] = len(e.accepted_tokens)
        row["n_emitted"] = e.n_emitted
        rows.append(row)
    cols = [f.name for f in fields(StepEvent) if f.name != "phases"] + [f"phase_{p}" for p in PHASES] \
        + ["draft_ms", "n_accepted", "n_emitted"]
    return pd.DataFrame(rows, columns=cols)


def frame_to_events(frame: pd.DataFrame) -> list[StepEvent]:
    events = []
    for rec in frame.to_dict(orient="records"):
        phases = {p: float(rec.pop(f"phase_{p}", 0.0)) for p in PHASES}
        cov = rec.get("coverage")
        rec["coverage"] = None if cov is None or (isinstance(cov, float) and math.isnan(cov)) else bool(cov)
        for name in ("expected_tokens", "budget_threshold"):  # a CSV's empty cell reads as NaN
            v = rec.get(name)
            rec[name] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
        if "drafted_nodes" in rec:
            rec["drafted_nodes"] = int(rec["drafted_nodes"])
        events.append(StepEvent.from_dict({**rec, "phases": phases}))
    return events


def save_trace(path: str | Path, events: list[StepEvent], summary: RunSummary | None = None,
               meta: dict | None = None) -> Path:
    """`.json`: events + summary + meta. `.csv`: one row per step (lists as JSON strings)."""
    path = Path(path)
    if path.suffix == ".csv":
        frame = events_to_frame(events)
        for col in LIST_COLUMNS:
            frame[col] = frame[col].map(json.dumps)
        frame.to_csv(path, index=False)
        return path
    doc = {"format": "nanospec-trace", "version": TRACE_VERSION, "meta": meta or {},
           "summary": summary.to_dict() if summary else None,
           "events": [e.to_dict() for e in events]}
    path.write_text(json.dumps(doc))
    return path


def load_trace(path: str | Path) -> tuple[list[StepEvent], RunSummary | None, dict]:
    """Read a trace saved by `save_trace`; ValueError if the file is not one."""
    import pandas as pd

    path = Path(path)
    try:
        if path.suffix == ".csv":
            frame = pd.read_csv(path)
            for col in LIST_COLUMNS:
                if col not in frame and col in OPTIONAL_COLUMNS:
                    frame[col] = "[]"
                if col not in frame:
                    raise ValueError(f"column {col!r} missing")
                frame[col] = frame[col].map(json.loads)
            frame["coverage"] = frame["coverage"].astype(object)
            return frame_to_events(frame), None, {}
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("format") != "nanospec-trace":
            raise ValueError("no 'format': 'nanospec-trace' header")
        if not isinstance(doc.get("events"), list):
            raise ValueError("field 'events' must be a list of steps")
        events = [StepEvent.from_dict(e) for e in doc["events"]]
        summary = RunSummary(**doc["summary"]) if doc.get("summary") else None
        if summary is not None:
            check_types(summary, "summary")
        meta = doc.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError("field 'meta' must be an object")
        return events, summary, meta
    except UnicodeDecodeError:
        raise ValueError(f"{path.name} is not a NanoSpec trace: it is not a text file ({TRACE_FILES})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name} is not a NanoSpec trace: it is not valid JSON (line {exc.lineno}, column "
                         f"{exc.colno}; {TRACE_FILES})") from None
    except ValueError as exc:
        raise ValueError(f"{path.name} is not a NanoSpec trace (.json or .csv saved by NanoSpec): {exc}") from None
    except (KeyError, TypeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path.name} is not a NanoSpec trace (.json or .csv saved by NanoSpec): {exc}") from None
    except RecursionError:
        raise ValueError(f"{path.name} is not a NanoSpec trace: its JSON is nested too deeply") from None
