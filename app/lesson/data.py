"""The recorded lesson material: load what `python -m nanospec record-lesson` wrote, and measure it.

`load_lesson()` reads the bundle the recorder writes (file names and command come from
`nanospec.lesson.record`); the measurement functions are pure and used by the chapters' figures
and narration. Nothing here loads a model or touches Gradio.
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nanospec import metrics
from nanospec.decoding.cost_curve import CostCurve
from nanospec.events import RunSummary, StepEvent, events_to_frame
from nanospec.lesson.fingerprint import chart_tag, status as engine_status
from nanospec.lesson.record import BUNDLE_FORMAT, COMMAND, LESSON_DIR, RUNS_FILE, SWEEP_FILE

__all__ = ["BUNDLE_FORMAT", "COMMAND", "LESSON_DIR", "RUNS_FILE", "SWEEP_FILE", "RUN_LABELS", "SEEN", "Lesson",
           "LessonRun", "load_lesson", "locality", "run_locality", "ctx_breakdown", "lm_head_share",
           "summary_table", "phase_means", "SYSTEM_PHASES", "BUDGETED", "BudgetNode", "BudgetStep", "budget_step",
           "budget_curve", "budget_start", "price"]

SAMPLED = "sampled"   # the key of the run at temperature > 0 (the sampling chapter)
BUDGETED = "budget"   # NanoSpec's run with the draft budget on (the budget chapter)
RUN_LABELS = {"ar": "ar", "greedy": "greedy chain", "full": "full", "static": "static",
              "nanospec": "nanospec", "hybrid": "hybrid", BUDGETED: "nanospec + budget", SAMPLED: "nanospec, sampled"}
SEEN = {"prompt": ("in the prompt", "#3b6fd8"), "output": ("earlier in the answer", "#2e9d5b"),
        "top3": ("in the target's earlier top-3", "#f2b134"), "new": ("new", "#d64545")}


# -- the recorded material -------------------------------------------------------------------
@dataclass
class LessonRun:
    """One recorded (prompt, run) trace with its frame and per-token bookkeeping precomputed."""

    prompt_id: str
    key: str
    events: list[StepEvent]
    summary: RunSummary
    meta: dict
    token_steps: list[int] = field(init=False)   # step that emitted each output token

    def __post_init__(self):
        self.token_steps = [e.step for e in self.events for _ in e.tokens]

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """One row per step (`events_to_frame`), built when a chart first needs it: the page opens faster."""
        return events_to_frame(self.events)

    @property
    def output_ids(self) -> list[int]:
        return self.summary.output_ids

    @property
    def pieces(self) -> list[str]:
        return self.meta.get("pieces") or [f"⟨{t}⟩" for t in self.output_ids]

    @property
    def token_text(self) -> dict[int, str]:
        return {int(k): v for k, v in self.meta.get("token_text", {}).items()}

    @property
    def last_step(self) -> int:
        return self.events[-1].step

    def event(self, step: int) -> StepEvent:
        return self.events[max(0, min(step, self.last_step))]

    def tokens_through(self, step: int) -> int:
        """Output tokens emitted up to and including `step`."""
        return sum(1 for s in self.token_steps if s <= step)


@dataclass
class Lesson:
    runs: dict[tuple[str, str], LessonRun]
    prompts: list[dict]
    info: dict                  # command, recorded_at, machine, pair, settings
    sweep: dict | None
    sampled: dict[str, LessonRun] = field(default_factory=dict)   # prompt id -> the run at temperature > 0
    checks: dict[str, dict] = field(default_factory=dict)         # prompt id -> first-token distribution check
    derived: dict = field(default_factory=dict, repr=False)  # memo of whole-lesson aggregates

    def has(self, prompt_id: str, key: str) -> bool:
        return (prompt_id, key) in self.runs or (key == SAMPLED and prompt_id in self.sampled)

    def run(self, prompt_id: str, key: str) -> LessonRun:
        """A greedy run by key (`record.RUNS`), or `SAMPLED` for the prompt's run at temperature > 0."""
        if key == SAMPLED and prompt_id in self.sampled:
            return self.sampled[prompt_id]
        if (prompt_id, key) not in self.runs:
            raise ValueError(f"no recorded run {key!r} for prompt {prompt_id!r}; re-record with `{COMMAND}`")
        return self.runs[(prompt_id, key)]

    @property
    def prompt_ids(self) -> list[str]:
        return [p["id"] for p in self.prompts]

    def prompt(self, prompt_id: str) -> dict:
        return next(p for p in self.prompts if p["id"] == prompt_id)

    def keys(self, prompt_id: str) -> list[str]:
        return [k for (p, k) in self.runs if p == prompt_id]


def load_lesson(folder: str | Path | None = None) -> Lesson:
    """Read the recorded runs (+ sweep, if present). FileNotFoundError / ValueError say what is wrong."""
    folder = Path(folder) if folder is not None else LESSON_DIR
    path = folder / RUNS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no lesson traces at {path}; record them with `{COMMAND}`")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:   # one line, naming the file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{path} is corrupted ({reason}); re-record it with `{COMMAND}`") from None
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path.name} is not a lesson bundle written by `{COMMAND}`")
    runs = {}
    for trace in doc["runs"]:
        run = _run(trace)
        runs[(run.prompt_id, run.key)] = run
    sampled = {pid: _run(entry["run"]) for pid, entry in (doc.get("sampling") or {}).items()}
    checks = {pid: entry["distribution"] for pid, entry in (doc.get("sampling") or {}).items()
              if entry.get("distribution")}
    sweep_path = folder / SWEEP_FILE
    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else None
    info = {k: doc.get(k) for k in ("command", "recorded_at", "machine", "pair", "settings", "calibration",
                                    "fingerprint")}
    info["engine_label"] = engine_status(doc)   # "" = recorded by the engine in this repository
    info["engine_tag"] = chart_tag(doc)     # its short form, under every timed chart's title
    return Lesson(runs, doc["prompts"], info, sweep, sampled, checks)


def _run(trace: dict) -> LessonRun:
    meta = trace["meta"]
    return LessonRun(meta["prompt_id"], meta.get("run", SAMPLED), [StepEvent.from_dict(e) for e in trace["events"]],
                     RunSummary(**trace["summary"]), meta)



# -- measurements on the traces ----------------------------------------------------------------
def locality(prompt_ids: list[int], output_ids: list[int], top3: list[list[int]]) -> list[str]:
    """Where each output token was seen before it was emitted (first match wins): the prompt, earlier
    output, the target's top-3 at an earlier position (not the guess for this very position), or new."""
    n = len(prompt_ids)
    in_prompt = set(prompt_ids)
    seen_out: set[int] = set()
    guessed: set[int] = set()
    upto = 0  # top3 rows already added; row i holds the guesses for position i + 1
    out = []
    for j, tok in enumerate(output_ids):
        # token j sits at position n + j; its own guess is row n + j - 1, so take rows before that
        for row in top3[upto: n + j - 1]:
            guessed.update(row)
        upto = max(upto, n + j - 1)
        if tok in in_prompt:
            out.append("prompt")
        elif tok in seen_out:
            out.append("output")
        elif tok in guessed:
            out.append("top3")
        else:
            out.append("new")
        seen_out.add(tok)
    return out


def decode_events(run: LessonRun) -> list[StepEvent]:
    return [e for e in run.events if e.step > 0]


def busiest_early_step(run: LessonRun) -> int:
    """The step that wrote the most tokens in the first half of the run (a good draft to look at)."""
    decode = decode_events(run)
    if not decode:
        return 0
    return max(decode[: max(1, len(decode) // 2)], key=lambda e: len(e.tokens)).step


def run_locality(run: LessonRun) -> list[str]:
    return locality(run.meta["prompt_ids"], run.output_ids, run.meta["top3"])


def ctx_breakdown(run: LessonRun) -> dict:
    """What NanoSpec's Ctx step adds at prefill: unique prompt ids, plus more from the top-3 guesses."""
    prompt = run.meta["prompt_ids"]
    top = [t for row in run.meta["top3"][: len(prompt)] for t in row]
    unique_prompt = len(set(prompt))
    return {"prompt_tokens": len(prompt), "unique_prompt": unique_prompt,
            "from_top3": len(set(prompt) | set(top)) - unique_prompt}


def lm_head_share(run: LessonRun) -> float:
    decode = run.frame[run.frame["step"] > 0]
    draft = float(decode["draft_ms"].sum())
    return float(decode["phase_lm_head"].sum()) / draft if draft > 0 else 0.0


def summary_table(lesson: Lesson, prompt_id: str) -> pd.DataFrame:
    """One row per recorded run of a prompt, with speedup over `ar` (same prompt, same recording)."""
    rows = []
    ar = lesson.run(prompt_id, "ar").summary.tokens_per_s
    for key in lesson.keys(prompt_id):
        s = lesson.run(prompt_id, key).summary
        rows.append({"method": RUN_LABELS.get(key, key), "tokens_per_s": s.tokens_per_s,
                     "speedup": metrics.speedup(s.tokens_per_s, ar), "tau": s.tau,
                     "draft_ms_per_step": s.draft_ms_per_step, "mean_active": s.mean_active,
                     "coverage": s.coverage, "identical": lesson.run(prompt_id, key).meta.get("identical_to_first")})
    return pd.DataFrame(rows)


SYSTEM_PHASES = ("draft_layers", "lm_head", "gather_wait", "topk", "vocab_update")


def phase_means(lesson: Lesson, keys: list[str]) -> dict[str, dict[str, float]]:
    """Mean ms per decode step of each draft-side phase, per run key, over every recorded prompt."""
    memo = lesson.derived.setdefault("phase_means", {})
    for key in keys:
        if key not in memo:
            decode = pd.concat([lesson.run(p, key).frame for p in lesson.prompt_ids if (p, key) in lesson.runs])
            decode = decode[decode["step"] > 0]
            memo[key] = {ph: float(decode[f"phase_{ph}"].mean()) for ph in SYSTEM_PHASES}
    return memo


# -- the draft budget (its chapter) ------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetNode:
    """One drafted node of a budgeted step (`record-lesson` kept them all, dropped ones too)."""

    token: int
    depth: int
    source: str        # head | copy | both
    p: float           # calibrated chance of being accepted (its whole root path)
    kept: bool         # verified: among the likeliest nodes whose summed p most exceeds their price
    accepted: bool     # on the path the target accepted


@dataclass(frozen=True)
class BudgetStep:
    """What the budget decided at one step: every drafted node, likeliest first, and its prices."""

    step: int
    nodes: list[BudgetNode]
    threshold: float       # λ·Δc: a node's mean price (Δc the cost curve's mean slope)
    per_token_ms: float    # Δc: ms per extra verified token, the cost curve's mean slope
    expected: float        # expected tokens of the verified tree, the bonus token included
    explore: bool          # verified the likeliest node anyway (after plain steps in a row)
    rate: float            # λ, tokens per ms: the request's throughput so far, as the budget priced this step
    prices: list[float]    # per node (as `nodes`, likeliest first): λ·(c(1 + k) - c(k)), the tokens its
                           # share of the forward's time would earn (the first waived when `explore`)

    @property
    def kept(self) -> list[BudgetNode]:
        return [n for n in self.nodes if n.kept]

    @property
    def dropped(self) -> list[BudgetNode]:
        return [n for n in self.nodes if not n.kept]

    @property
    def kept_price(self) -> float:
        """The tokens the verified nodes' extra forward time would earn at λ (their prices summed)."""
        return sum(self.prices[:len(self.kept)])

    @property
    def kept_chance(self) -> float:
        """The verified nodes' chances summed: the drafted tokens they are expected to bring."""
        return sum(n.p for n in self.kept)


def price(threshold: float) -> str:
    """A price in tokens as the lesson writes it: two significant digits (0.17, or a busy machine's 0.0024)."""
    return f"{threshold:.2g}"


def budget_curve(run: LessonRun) -> CostCurve | None:
    """The target's cost curve the budgeted run used (None: not recorded, or a run without the budget)."""
    curve = (run.meta.get("budget") or {}).get("cost_curve")
    return CostCurve.from_dict(curve) if curve else None


def budget_step(run: LessonRun, step: int) -> BudgetStep | None:
    """Step `step` of a budgeted run, node by node (None: prefill, or not recorded)."""
    steps = (run.meta.get("budget") or {}).get("steps") or []
    curve = budget_curve(run)
    e = run.event(step)
    entry = steps[e.step] if e.step < len(steps) else None
    if not entry or curve is None:
        return None
    kept_index = [i for i, k in enumerate(entry["kept"]) if k]
    verified = kept_index if len(kept_index) == len(e.tree_tokens) else list(range(len(entry["tokens"])))
    on_path = {verified[i] for i in e.accepted_path}
    nodes = [BudgetNode(entry["tokens"][i], entry["depths"][i], entry["sources"][i], entry["p"][i], entry["kept"][i],
                        i in on_path) for i in range(1, len(entry["tokens"]))]   # node 0 is the root
    nodes.sort(key=lambda n: -n.p)   # stable: the budget's own order
    expected = e.expected_tokens if e.expected_tokens is not None else 1 + sum(n.p for n in nodes if n.kept)
    rate = entry.get("rate", entry["threshold"] / curve.per_token_ms if curve.per_token_ms > 0 else 0.0)
    prices = entry.get("prices") or [entry["threshold"]] * len(nodes)   # recorded before per-size prices: the mean
    return BudgetStep(e.step, nodes, entry["threshold"], curve.per_token_ms, expected, entry["explore"], rate, prices)


def budget_start(run: LessonRun) -> int:
    """A step worth explaining the budget on: it kept some drafted nodes and dropped others; of those in
    the run's first half, the one that wrote the most tokens (else the first decode step)."""
    both = [s for e in decode_events(run) if (s := budget_step(run, e.step)) and s.kept and s.dropped]
    if not both:
        return 1 if decode_events(run) else 0
    early = [s for s in both if s.step <= run.last_step // 2] or both
    return max(early, key=lambda s: (len(run.event(s.step).tokens), min(len(s.kept), len(s.dropped)))).step

