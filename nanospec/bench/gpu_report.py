"""gpu-bench's two ends: the engine tests run on the device first, and the JSON/Markdown report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
# the engine tests that take their device from NANOSPEC_TEST_DEVICE (--quick: the first five)
ENGINE_TESTS = ("test_device.py", "test_host_syncs.py", "test_lossless.py", "test_host_transfer.py", "test_kv.py",
                "test_sampling.py", "test_vocab.py", "test_events.py", "test_tree.py", "test_engine_contracts.py")
QUICK_TESTS = 5
TEST_TIMEOUT_S = {True: 240, False: 1200}  # by --quick: the benchmark must still have its time


def engine_tests(device: torch.device, log, quick: bool = False) -> str:
    """Run the engine tests with NANOSPEC_TEST_DEVICE=device and return their outcome in one line
    ("passed: ...", "FAILED: ...", "timed out ...", "not run: ..."): the report records it, and the
    benchmark runs whatever the tests say."""
    tests = [REPO / "tests" / name for name in ENGINE_TESTS[:QUICK_TESTS if quick else None]]
    if not all(t.is_file() for t in tests):
        log("engine tests not run: they ship with the source checkout (tests/), not with the package")
        return "not run: no tests/ folder"
    try:
        import pytest  # noqa: F401
    except ImportError:
        log("engine tests not run: pytest is not installed (pip install pytest to run them)")
        return "not run: pytest not installed"
    limit = TEST_TIMEOUT_S[quick]
    log(f"running the engine tests on {device} ({len(tests)} files, at most {limit} s) ...")
    env = {**os.environ, "NANOSPEC_TEST_DEVICE": str(device)}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, tests)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        log(f"engine tests on {device}: timed out after {limit} s; benchmarking anyway")
        return f"timed out after {limit} s ({len(tests)} files)"
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1].strip("= ")
    if done.returncode != 0:
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        log(done.stdout[-4000:] + done.stderr[-2000:])
        log(f"engine tests FAILED on {device} ({summary}); benchmarking anyway, the report says so")
        return f"FAILED: {summary}" + (f" ({'; '.join(failed[:5])})" if failed else "")
    log(f"engine tests on {device}: {summary}")
    return f"passed: {summary}"


COLUMNS = (("tokens_per_s", "tok/s", "{:.1f}"), ("step_ms", "ms/step", "{:.2f}"),
           ("draft_ms", "draft ms", "{:.2f}"), ("draft_layers_ms", "layers", "{:.2f}"),
           ("lm_head_ms", "LM head", "{:.3f}"), ("gather_wait_ms", "gather wait", "{:.3f}"),
           ("topk_ms", "top-k", "{:.3f}"), ("verify_ms", "verify ms", "{:.2f}"),
           ("mean_active", "mean active", "{:,.0f}"), ("peak_gpu_gib", "peak GiB", "{:.1f}"),
           ("host_reads_per_step", "host reads/step", "{}"),
           ("cuda_syncs_per_step_timer_off", "syncs/step (timer off)", "{}"),
           ("cuda_syncs_per_step_timer_on", "syncs/step (timer on)", "{}"),
           ("event_waits_per_step_timer_on", "of which event waits", "{}"),
           ("timer_overhead_pct", "timer overhead %", "{:+.1f}"), ("identical_to_ar", "identical to ar", "{:.0%}"))


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def markdown(meta: dict, shapes: list[dict]) -> str:
    lines = [f"# gpu-bench on {meta['device']}", "",
             f"`{meta['command']}` | torch {meta['torch']} | {meta['dtype']} | {meta['prompts']} held-out prompts "
             f"(Llama-3 ids) x {meta['new_tokens']} new tokens | engine tests: {meta['engine_tests']} | "
             f"{meta['wall_s']:.0f} s", "",
             "Random weights: the heads accept almost nothing, so these are per-step costs, not τ. Draft and "
             "verify times are means per step with the phase timer on; tok/s and ms/step with it off.", ""]
    for shape in shapes:
        s = shape["shape"]
        title = f"## {s['name']} shape (V {s['vocab']:,}, hidden {s['hidden']:,}, {s['layers']} layers)"
        if "error" in shape:
            lines += [title, "", f"Not measured: {shape['error']}", ""]
            continue
        tree = shape["tree"]
        lines += [f"{title}, tree {tree['depth']}x{tree['top_k']}x{tree['total_tokens']}, "
                  f"built in {shape['build_s']:.0f} s", "",
                  "| method | " + " | ".join(c[1] for c in COLUMNS) + " |",
                  "|---|" + "---:|" * len(COLUMNS)]
        for method, row in shape["methods"].items():
            if "skipped" in row:
                lines.append(f"| {method} | skipped: {row['skipped']} |" + " |" * (len(COLUMNS) - 1))
            else:
                lines.append(f"| {method} | " + " | ".join(_cell(row, *c[::2]) for c in COLUMNS) + " |")
        lines.append("")
        change = draft_change(shape["methods"])
        if change is not None:
            lines += [f"nanospec's draft time against full's: {change:+.1%} per step.", ""]
    return "\n".join(lines)


def draft_change(methods: dict) -> float | None:
    """nanospec's draft ms per step relative to full's (the paper reports -51.6% at Llama-3.1-8B)."""
    full, nano = methods.get("full", {}), methods.get("nanospec", {})
    if not full.get("draft_ms") or "draft_ms" not in nano:
        return None
    return nano["draft_ms"] / full["draft_ms"] - 1


def write_report(out: Path, meta: dict, shapes: list[dict]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "gpu_bench.json", out / "gpu_bench.md"
    json_path.write_text(json.dumps({"meta": meta, "shapes": shapes}, indent=2) + "\n")
    md_path.write_text(markdown(meta, shapes))
    return json_path, md_path
