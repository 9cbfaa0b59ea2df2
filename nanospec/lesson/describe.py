"""The lesson README's description of the shipped recording, written from the bundle itself.

`record-lesson` rewrites the part of assets/lesson/README.md between `BEGIN` and `END` with
`describe(bundle)` after every recording, so the date, machine, calibration and engine the README names
are the recording's own; tests/test_lesson_truth.py checks that they still are.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from nanospec.lesson import fingerprint

BEGIN = "<!-- recording: written by record-lesson from the bundle; do not edit by hand -->"
END = "<!-- /recording -->"


def describe(bundle: dict) -> str:
    """Markdown: when, where and how the bundle was recorded, and what plain decoding ran at."""
    machine, pair, settings = bundle.get("machine") or {}, bundle.get("pair") or {}, bundle.get("settings") or {}
    cal = bundle.get("calibration") or {}
    ar = [d["summary"]["tokens_per_s"] for d in bundle.get("runs") or [] if d["meta"].get("run") == "ar"]
    lines = [f"The shipped files come from `{bundle.get('command')}`, run {bundle.get('recorded_at')} on "
             f"{machine.get('cpu')} ({machine.get('cpu_count')} CPU cores, {machine.get('torch_threads')} torch "
             f"threads, torch {machine.get('torch')}, {machine.get('device')}), {pair.get('target')} + "
             f"{pair.get('head')} ({pair.get('dtype')}), {settings.get('run_repeats', 1)} repeats per run, "
             f"{settings.get('max_new_tokens')} new tokens."]
    if cal:
        lines.append(f"Plain decoding calibrated at {cal.get('before', 0):.1f} tok/s before the recording and "
                     f"{cal.get('after', 0):.1f} after.")
    if ar:
        lines.append(f"Its `ar` runs: {', '.join(f'{v:.1f}' for v in ar)} tok/s (median "
                     f"{statistics.median(ar):.1f}).")
    label = fingerprint.status(bundle)
    lines.append(f"Engine: {label}." if label else
                 f"Engine: cost-curve version {bundle['fingerprint']['engine'].get('cost_curve_version')}, "
                 f"{bundle['fingerprint'].get('kernels')}.")
    problems = bundle.get("unsteady") or []
    if problems:
        lines.append(f"**Development recording** (`--allow-unsteady`): {len(problems)} stability problems listed in "
                     "the bundle; re-record on an idle machine.")
    return " ".join(lines)


def section(text: str) -> str | None:
    """The description between the markers of a README's text (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write_readme(readme: Path, bundle: dict) -> bool:
    """Put `describe(bundle)` between the README's markers; False when the file or its markers are missing."""
    if not readme.exists():
        return False
    text = readme.read_text()
    if section(text) is None:
        return False
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    readme.write_text(f"{head}{BEGIN}\n{describe(bundle)}\n{END}{tail}")
    return True
