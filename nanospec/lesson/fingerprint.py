"""What produced a lesson recording: its fingerprint, and whether the engine in this repository still matches it.

A recording stores (bundle key `fingerprint`):

    engine     the parts of the engine that decide its timings, comparable across machines: the cost-curve
               version (`decoding/cost_curve.CURVE_VERSION`, bumped with every change of kernels or of the
               forward's work) and the trace format (`events.TRACE_VERSION`)
    kernels    the engine's own line of which kernels it decoded on (`SpecEngine.kernels`, machine-dependent)
    target_sha256, head_sha256, dtype, torch, cpu, threads, date

`engine_part()` is the engine part as the code in this repository has it (no model is loaded), so a test
can fail when the shipped recording's engine part differs: an engine change that alters timings then
re-records in the same change. `status(bundle)` reads a bundle's fingerprint for the lesson's timed
charts: "" when it matches, else the label they show ("unknown engine", "recorded with an older engine
on DATE").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

FIELDS = ("engine", "kernels", "target_sha256", "head_sha256", "dtype", "torch", "cpu", "threads", "date")


def engine_part() -> dict:
    """The timing-relevant versions of the engine in this repository (cheap: no model, no measurement)."""
    from nanospec.decoding.cost_curve import CURVE_VERSION
    from nanospec.events import TRACE_VERSION

    return {"cost_curve_version": CURVE_VERSION, "trace_version": TRACE_VERSION}


def files_digest(folder: str | Path | None, patterns: tuple[str, ...] = ("*.safetensors", "pytorch_model.bin")
                 ) -> str | None:
    """sha256 over the weight files of a model folder (sorted by name); None when there are none."""
    if folder is None or not Path(folder).is_dir():
        return None
    files = sorted({f for p in patterns for f in Path(folder).glob(p)})
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def fingerprint(engine, pair: dict, machine: dict, date: str) -> dict:
    """The fingerprint of a recording made now with `engine` (pair and machine as `record` labels them)."""
    folder = getattr(getattr(engine.model, "config", None), "_name_or_path", None)
    return {"engine": engine_part(), "kernels": getattr(engine, "kernels", None),
            "target_sha256": files_digest(folder), "head_sha256": pair.get("head_sha256"),
            "dtype": pair.get("dtype"), "torch": machine.get("torch"), "cpu": machine.get("cpu"),
            "threads": machine.get("torch_threads"), "date": date}


def status(bundle: dict) -> str:
    """"" when the bundle was recorded by the engine in this repository; else the label every timed chart
    shows: "unknown engine" (no fingerprint, or not one this code wrote) or "recorded with an older engine
    on DATE"."""
    fp = bundle.get("fingerprint")
    date = bundle.get("recorded_at") or "an unknown date"
    if not isinstance(fp, dict) or not isinstance(fp.get("engine"), dict):
        return f"unknown engine: recorded {date} without an engine fingerprint; timings may differ from today's engine"
    if fp["engine"] != engine_part():
        return f"recorded with an older engine on {fp.get('date') or date}; today's engine times differently"
    return ""


def chart_tag(bundle: dict) -> str:
    """The short form of `status` a timed chart writes under its title ("" when the engine matches)."""
    if not status(bundle):
        return ""
    fp = bundle.get("fingerprint")
    day = str((fp or {}).get("date") or bundle.get("recorded_at") or "?")[:10]
    if not isinstance(fp, dict) or not isinstance(fp.get("engine"), dict):
        return f"⚠ unknown engine: timings recorded {day}"
    return f"⚠ recorded with an older engine on {day}"
