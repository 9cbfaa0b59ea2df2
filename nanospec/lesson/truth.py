"""Checks of truth for a lesson recording: its figures are what its own traces say, whoever wins.

A recording need not show speculation paying (on a CPU it often does not, and the lesson teaches why).
It must be true to itself and to the project's measurements:

- every greedy run writes exactly `ar`'s tokens (lossless);
- each method's speed-up over `ar` recomputed from its own trace -- τ and the per-step phase times, through
  `metrics.modelled_speedup` -- agrees with the speed-up its measured tokens/s give, within `MAX_MODEL_GAP`
  (an edited tokens/s, or a summary that does not belong to its events, fails);
- the recorded `ar` speed lies within `AR_BAND` of what docs/benchmarks.md measured on the same machine
  class (CPU vendor and model family).

`problems(bundle)` lists what fails (empty: the recording is true); the stability guard (repeats agree,
calibration steady, CPU share high) is the trust module's and runs beside it.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from nanospec import metrics
from nanospec.timing import DRAFT_PHASES

MAX_MODEL_GAP = 0.10          # |modelled / measured speed-up - 1|
AR_BAND = (0.6, 1.6)          # recorded ar tok/s / the documented median for the machine class
MACHINE_CLASSES = ("Intel Xeon", "AMD EPYC")
BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def decode_steps(doc: dict) -> list[dict]:
    return [e for e in doc["events"] if e["step"] > 0]


def step_times(doc: dict) -> tuple[float, float, float]:
    """Mean ms per decode step of a run: (verification forward, drafting, everything else)."""
    steps = decode_steps(doc)
    if not steps:
        return float("nan"), float("nan"), float("nan")
    verify = statistics.fmean(e["phases"].get("verify_forward", 0.0) for e in steps)
    draft = statistics.fmean(sum(e["phases"].get(p, 0.0) for p in DRAFT_PHASES) for e in steps)
    wall = statistics.fmean(e["wall_ms"] for e in steps)
    return verify, draft, max(0.0, wall - verify - draft)


def plain_step_ms(ar_doc: dict) -> float:
    """Mean ms of one plain decoding step (a one-token target forward and its bookkeeping)."""
    steps = decode_steps(ar_doc)
    return statistics.fmean(e["wall_ms"] for e in steps) if steps else float("nan")


def modelled(doc: dict, ar_doc: dict) -> float:
    """The speed-up over `ar` that a run's τ and per-step times predict."""
    verify, draft, other = step_times(doc)
    return metrics.modelled_speedup(doc["summary"]["tau"], plain_step_ms(ar_doc), verify, draft, other)


def measured(doc: dict, ar_doc: dict) -> float:
    return metrics.speedup(doc["summary"]["tokens_per_s"], ar_doc["summary"]["tokens_per_s"])


def machine_class(cpu: str | None) -> str | None:
    """"Intel Xeon", "AMD EPYC", ... : the vendor and family in a CPU model name (None: not one we document)."""
    text = str(cpu or "")
    return next((c for c in MACHINE_CLASSES if all(w.lower() in text.lower() for w in c.split())), None)


def documented_ar_speeds(text: str) -> dict[str, list[float]]:
    """Plain decoding's tok/s in docs/benchmarks.md by machine class: every `| ar | N |` table row and every
    "`ar` at N tok/s" of a section (from one `## ` heading to the next) that names exactly one class."""
    out: dict[str, list[float]] = {}
    for section in re.split(r"\n(?=## )", text):
        named = [c for c in MACHINE_CLASSES if c in section]
        if len(named) != 1:
            continue
        values = re.findall(r"^\| *ar *\| *([0-9]+(?:\.[0-9]+)?) *\|", section, flags=re.M)
        values += re.findall(r"`ar` at ([0-9]+(?:\.[0-9]+)?) tok/s", section)
        out.setdefault(named[0], []).extend(float(v) for v in values)
    return {k: v for k, v in out.items() if v}


def problems(bundle: dict, benchmarks: str | None = None) -> list[str]:
    """Why a recording is not true to its traces or to the documented measurements (empty: it is).
    `benchmarks`: the text of docs/benchmarks.md (default: read from the repository)."""
    found: list[str] = []
    by_prompt: dict[str, dict[str, dict]] = {}
    for doc in bundle.get("runs") or []:
        by_prompt.setdefault(doc["meta"]["prompt_id"], {})[doc["meta"]["run"]] = doc
    ar_speeds = []
    for pid, runs in by_prompt.items():
        ar = runs.get("ar")
        if ar is None:
            found.append(f"{pid}: no ar run to check the others against")
            continue
        ar_speeds.append(ar["summary"]["tokens_per_s"])
        for key, doc in runs.items():
            if doc["summary"]["output_ids"] != ar["summary"]["output_ids"]:
                found.append(f"{pid}/{key}: its tokens differ from ar's")
            if key == "ar":
                continue
            model, meas = modelled(doc, ar), measured(doc, ar)
            if not (abs(model / meas - 1) <= MAX_MODEL_GAP):   # NaN fails too
                found.append(f"{pid}/{key}: measured {meas:.2f}x ar, but its τ and step times give {model:.2f}x "
                             f"(more than {MAX_MODEL_GAP:.0%} apart)")
    found += _ar_against_docs(bundle, ar_speeds, benchmarks)
    return found


def _ar_against_docs(bundle: dict, ar_speeds: list[float], benchmarks: str | None) -> list[str]:
    cls = machine_class((bundle.get("machine") or {}).get("cpu"))
    if not ar_speeds or cls is None:
        return [f"no documented machine class for {(bundle.get('machine') or {}).get('cpu')!r}"] if ar_speeds else []
    text = benchmarks if benchmarks is not None else (BENCHMARKS.read_text() if BENCHMARKS.exists() else "")
    documented = documented_ar_speeds(text).get(cls)
    if not documented:
        return [f"docs/benchmarks.md has no ar speed for {cls} to check the recording against"]
    ref, rec = statistics.median(documented), statistics.median(ar_speeds)
    lo, hi = AR_BAND
    if not lo <= rec / ref <= hi:
        return [f"ar ran at {rec:.1f} tok/s in the recording; docs/benchmarks.md measures {ref:.1f} on {cls} "
                f"(allowed {lo:g}-{hi:g}x)"]
    return []
