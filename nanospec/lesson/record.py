"""Record the classroom lesson's material: real runs of the offline default pair + an LM-head timing sweep.

    python -m nanospec record-lesson                  # shipped head -> assets/lesson/
    python -m nanospec record-lesson -- --head random   # development only, before the head exists
    python -m nanospec record-lesson -- --runs budget --merge   # development: one run, keep the rest

Writes two files the lesson tab (app/lesson/) reads without ever loading a model:
    lesson_runs.json.gz   every (prompt, run) as a `nanospec-trace` document (events, summary, meta); the
                          budgeted run's meta also holds every drafted node's fate (budget_trace.py)
    lm_head_sweep.json    LM-head matmul time vs vocabulary size at the default hidden size
Both carry the command that made them and a label of the machine it ran on.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch

from nanospec import metrics
from nanospec.config import GenerationConfig
from nanospec.events import TRACE_VERSION
from nanospec.paths import ASSETS
from nanospec.timing import metered
from nanospec.bench import trust
from nanospec.lesson import describe, fingerprint, sampling
from nanospec.lesson.budget_trace import BudgetTap
from nanospec.lesson.pair_setup import head_digest, load_engine, target_top3, token_pieces  # noqa: F401

LESSON_DIR = ASSETS / "lesson"
RUNS_FILE = "lesson_runs.json.gz"
SWEEP_FILE = "lm_head_sweep.json"
BUNDLE_FORMAT = "nanospec-lesson"
COMMAND = "python -m nanospec record-lesson"

DEFAULT_PROMPTS = ("code-06", "math-06", "sum-06")  # held-out: the head never trained on them
# run key -> GenerationConfig.build arguments. "greedy" is a greedy chain: one candidate per level.
# The lesson teaches the vocabulary policies, so its tree runs keep the context-copy branch off, and
# the fixed tree (no draft budget) until the budget's own chapter: its run, "budget", is NanoSpec's
# with the budget on, and also records what the budget decided for every node (budget_trace.py).
FIXED = {"copy_branch": 0, "budget": False}
RUNS: dict[str, dict] = {
    "ar": {"method": "ar"},
    "greedy": {"method": "full", "depth": 5, "top_k": 1, "total_tokens": 6, **FIXED},
    "full": {"method": "full", **FIXED},
    "static": {"method": "static", **FIXED},
    "nanospec": {"method": "nanospec", **FIXED},
    "hybrid": {"method": "hybrid", **FIXED},
    "budget": {"method": "nanospec", "copy_branch": 0, "budget": True},
}
# vocabulary sizes of real tokenizers (and NanoSpec's default capacity) for the LM-head sweep
SWEEP_VOCABS = {3072: "NanoSpec capacity", 32000: "Llama-2", 49152: "SmolLM2 (this model)",
                128256: "Llama-3", 151936: "Qwen2/3", 256000: "Gemma"}
SWEEP_HIDDEN = 576   # SmolLM2-135M's hidden size
SWEEP_ROWS = (1, 6)  # rows scored at once: one node, or one draft level of top_k = 6 nodes


# -- machine label ------------------------------------------------------------------------
def machine_label(device: torch.device | str = "cpu") -> dict:
    """Where a measurement ran: CPU model, core count, torch device and version."""
    device = torch.device(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    label = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "device": str(device), "torch": torch.__version__, "python": platform.python_version(),
             "os": f"{platform.system()} {platform.release()}"}
    if device.type == "cuda":
        label["gpu"] = torch.cuda.get_device_name(device)
    label["text"] = (f"{label.get('gpu', cpu)} · {label['cpu_count']} CPU cores · torch {torch.__version__} "
                     f"on {device}")
    return label


# -- the LM-head sweep ---------------------------------------------------------------------
def time_lm_head(vocab: int, hidden: int, rows: int, repeats: int, device: torch.device,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> float:
    """Median milliseconds of one `[rows, H] @ [H, V]` matmul with random weights (warm-up excluded)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=gen).to(device, dtype)   # [V, H], like an LM head
    h = torch.randn(rows, hidden, generator=gen).to(device, dtype)         # [k, H]
    times = []
    for i in range(repeats + 3):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        logits = h @ weight.T                                               # [k, V]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    del logits, weight
    times.sort()
    return times[len(times) // 2]


def lm_head_sweep(device: torch.device, repeats: int = 30, hidden: int = SWEEP_HIDDEN,
                  dtype: torch.dtype = torch.float32) -> dict:
    points = []
    for vocab, label in SWEEP_VOCABS.items():
        for rows in SWEEP_ROWS:
            ms = time_lm_head(vocab, hidden, rows, repeats, device, dtype)
            points.append({"vocab": vocab, "label": label, "rows": rows, "ms": round(ms, 4)})
            print(f"  lm-head sweep: V={vocab:>6} rows={rows}: {ms:.3f} ms", file=sys.stderr)
    return {"format": "nanospec-lm-head-sweep", "command": COMMAND, "hidden": hidden,
            "dtype": str(dtype).removeprefix("torch."), "repeats": repeats, "statistic": "median",
            "machine": machine_label(device), "recorded_at": _now(), "points": points}


# -- the runs ------------------------------------------------------------------------------
def record_run(engine, messages: list[dict], run_key: str, max_new_tokens: int, options: dict | None = None) -> dict:
    """One decoding run as a `nanospec-trace` document (the layout `events.save_trace` writes);
    `options` (GenerationConfig.build arguments) default to `RUNS[run_key]`."""
    cfg = GenerationConfig.build(max_new_tokens=max_new_tokens, **(options or RUNS[run_key]))
    budgeted = cfg.method != "ar" and cfg.tree.budget
    with BudgetTap(engine) if budgeted else nullcontext() as tap:
        run = engine.stream(messages, cfg)
        for _ in run:
            pass
    events, summary = run.events, run.summary
    tok = engine.tokenizer
    shown = {t for e in events for t in (*e.tree_tokens, e.bonus_token)}
    meta = {"run": run_key, "config": cfg.to_dict(), "prompt_ids": run.prompt_ids,
            "pieces": token_pieces(tok, summary.output_ids),
            "token_text": {str(t): tok.decode([t], skip_special_tokens=False) for t in sorted(shown)}}
    if budgeted:  # every drafted node's chance and fate (the events hold only the verified ones)
        steps = tap.steps(events)
        drafted = {t for entry in steps if entry for t in entry["tokens"]}
        meta["token_text"].update({str(t): tok.decode([t], skip_special_tokens=False) for t in sorted(drafted)})
        curve = engine.cost_curve(cfg.tree.max_nodes).to_dict()
        # the model's name, not where this machine keeps it
        if "model" in curve["key"]:
            curve["key"] = {**curve["key"], "model": Path(curve["key"]["model"]).name}
        meta["budget"] = {"cost_curve": curve, "steps": steps}
    return {"format": "nanospec-trace", "version": TRACE_VERSION, "meta": meta,
            "summary": summary.to_dict(), "events": [e.to_dict() for e in events]}


def record_prompt(engine, item: dict, max_new_tokens: int, runs: list[str], repeats: int = 1) -> list[dict]:
    """Every run of one prompt, interleaved, `repeats` times; each run keeps its median-speed repeat,
    and its meta records every repeat's tokens/s, speedup over ar and CPU share (bench/trust.py)."""
    from nanospec.data.prompts import prompt_messages

    messages = prompt_messages(item)
    tries: dict[str, list[tuple[dict, float]]] = {key: [] for key in runs}
    for rep in range(repeats):
        for key in runs:  # interleaved: a change in the machine's load hits every method alike
            with metered() as meter:
                doc = record_run(engine, messages, key, max_new_tokens)
            tries[key].append((doc, meter.cpu_share))
            s = doc["summary"]
            print(f"  {item['id']:>8} {key:>8} [{rep + 1}/{repeats}]: {s['new_tokens']} tokens, tau {s['tau']:.2f}, "
                  f"{s['tokens_per_s']:.1f} tok/s, cpu share {meter.cpu_share:.2f} ({meter.wall_s:.1f} s)",
                  file=sys.stderr)
    ar_tps = [d["summary"]["tokens_per_s"] for d, _ in tries[runs[0]]]
    docs = []
    for key in runs:
        tps = [d["summary"]["tokens_per_s"] for d, _ in tries[key]]
        doc = tries[key][trust.median_index(tps)][0]
        doc["meta"]["repeats"] = {"tokens_per_s": tps, "cpu_share": [c for _, c in tries[key]],
                                  "speedup": [metrics.speedup(t, a) for t, a in zip(tps, ar_tps)]}
        docs.append(doc)
    reference = docs[0]["summary"]["output_ids"]
    prompt_ids = docs[0]["meta"]["prompt_ids"]
    top3 = target_top3(engine, prompt_ids + reference)
    for doc in docs:
        doc["meta"].update(prompt_id=item["id"], category=item["category"],
                           identical_to_first=metrics.identical_to_ar(doc["summary"]["output_ids"], reference),
                           top3=top3)  # row i: the target's top-3 guesses for position i + 1
    return docs


CALIBRATION_PROMPT = "Count from one to twenty in words."


def calibrate(engine, max_new_tokens: int = 32) -> float:
    """Plain decoding's tokens/s on a fixed prompt (median of 3): the machine's speed right now."""
    cfg = GenerationConfig.build("ar", max_new_tokens=max_new_tokens, stop_on_eos=False)
    return statistics.median(engine.generate(CALIBRATION_PROMPT, cfg).summary.tokens_per_s for _ in range(3))


def check_recording(docs: list[dict], calibration: dict | None) -> list[str]:
    """trust.problems over a recording's runs."""
    runs = {f"{d['meta']['prompt_id']}/{d['meta']['run']}": d["meta"]["repeats"] for d in docs
            if "repeats" in d["meta"]}
    return trust.problems(runs, calibration)


def record_sampling(engine, item: dict, max_new_tokens: int, runs: int) -> dict:
    """The sampling chapter's material for one prompt: a recorded run at temperature > 0 with the
    acceptance log of every step, and the first-token check over `runs` seeded runs (0 = skip)."""
    from nanospec.data.prompts import prompt_messages

    messages = prompt_messages(item)
    options = sampling.SAMPLING
    doc = record_run(engine, messages, "sampled", max_new_tokens, options)
    log = sampling.trials(engine, doc, options["temperature"], options["top_p"])
    top = {t for entry in log for t, _ in entry.get("target_top", [])}
    doc["meta"]["token_text"].update({str(t): engine.tokenizer.decode([t], skip_special_tokens=False) for t in top})
    doc["meta"].update(prompt_id=item["id"], category=item["category"], trials=log,
                       identical_to_first=metrics.identical_to_ar(doc["summary"]["output_ids"], [], greedy=False))
    t0 = time.perf_counter()
    dist = sampling.first_token_distribution(engine, messages, runs) if runs else None
    if dist:
        print(f"  {item['id']:>8} sampling check: {dist['kept']}/{runs} runs share the first token, total variation "
              f"{dist['total_variation']:.3f} (exact sampling: {dist['total_variation_exact']:.3f}) "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return {"run": doc, "distribution": dist}


def warm_up(engine, runs: list[str]) -> None:
    """One short untimed run per method so first-call costs stay out of the recorded times."""
    for key in runs:
        cfg = GenerationConfig.build(max_new_tokens=8, **RUNS[key])
        engine.generate("Say hello.", cfg)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_runs(path: Path, docs: list[dict], prompts: list[dict], pair: dict, command: str,
               settings: dict, machine: dict, sampled: dict | None = None, calibration: dict | None = None,
               notes: dict | None = None) -> Path:
    """The bundle; `sampled` maps a prompt id to `record_sampling`'s result (the sampling chapter);
    `calibration`: plain decoding's tokens/s before and after the recording; `notes`: what a
    development recording did differently (`merged`: runs kept from an earlier bundle, `unsteady`:
    the stability problems it was written despite)."""
    bundle = {"format": BUNDLE_FORMAT, "version": 1, "command": command, "recorded_at": _now(),
              "machine": machine, "pair": pair, "settings": settings, "prompts": prompts, "runs": docs,
              "sampling": sampled or {}, "calibration": calibration, **(notes or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(bundle, fh, separators=(",", ":"))
    return path


def merge_into(path: Path, docs: list[dict], prompts: list[str], settings: dict) -> tuple[list[dict], dict, dict]:
    """`--merge`: the runs just recorded (`docs`) in place of the same runs of the bundle at `path`,
    which keeps the rest; (runs in `RUNS` order per prompt, its sampling material, a note of what was kept).
    Updates `settings["runs"]` to every run the merged bundle holds."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        old = json.load(fh)
    if old.get("format") != BUNDLE_FORMAT or [p["id"] for p in old["prompts"]] != prompts:
        raise SystemExit(f"record-lesson --merge: {path} is not a lesson bundle of the prompts {', '.join(prompts)}")
    new = {(d["meta"]["prompt_id"], d["meta"]["run"]) for d in docs}
    kept = [d for d in old["runs"] if (d["meta"]["prompt_id"], d["meta"]["run"]) not in new]
    order = {key: i for i, key in enumerate(RUNS)}
    merged = sorted(kept + docs, key=lambda d: (prompts.index(d["meta"]["prompt_id"]),
                                                order.get(d["meta"]["run"], len(order))))
    settings["runs"] = {**(old.get("settings") or {}).get("runs", {}), **settings["runs"]}
    settings["runs"] = {k: settings["runs"][k] for k in sorted(settings["runs"], key=lambda k: order.get(k, 99))}
    note = {"kept_from": old.get("recorded_at"), "kept_command": old.get("command"),
            "kept_runs": sorted({d["meta"]["run"] for d in kept})}
    return merged, old.get("sampling") or {}, note


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(LESSON_DIR), help="output folder (default: assets/lesson)")
    ap.add_argument("--head", default=None,
                    help="draft head folder (default: the shipped head); 'random' = untrained, development only")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: CUDA if available)")
    ap.add_argument("--prompts", default=",".join(DEFAULT_PROMPTS), help="comma-separated prompt ids")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated run keys from {', '.join(RUNS)}")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sampling-runs", type=int, default=300,
                    help="seeded two-token runs per prompt for the sampling chapter's distribution check (0 = skip)")
    ap.add_argument("--repeats", type=int, default=30, help="repeats per LM-head sweep point (median)")
    ap.add_argument("--run-repeats", type=int, default=5,
                    help="repeats of every decoding run, interleaved per prompt; each run keeps its median")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (default 0: torch's default, as the app and the benchmarks run)")
    ap.add_argument("--merge", action="store_true",
                    help="development: record only --runs (and ar) and keep every other run, the sampling material "
                         "and the sweep of the bundle already in --out (the plain command records everything)")
    ap.add_argument("--allow-unsteady", action="store_true",
                    help="development: write the recording even if its timings are not stable (the bundle lists "
                         "the problems; the lesson's tests fail until it is re-recorded on an idle machine)")
    ap.add_argument("--skip-runs", action="store_true", help="only the LM-head sweep")
    ap.add_argument("--skip-sweep", action="store_true", help="only the decoding runs")
    return ap


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str], dict]:
    """The options, checked: (options, run keys with `ar` first, prompt ids, prompt items by id)."""
    from nanospec.data.prompts import load_prompts

    a = build_parser().parse_args(argv)
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in RUNS]
    if bad or not runs:
        raise ValueError(f"--runs: unknown {bad}; allowed: {', '.join(RUNS)}")
    if runs[0] != "ar":
        runs = ["ar"] + [r for r in runs if r != "ar"]  # ar is the reference every run is checked against
    if not 1 <= a.max_new_tokens <= 512:
        raise ValueError("--max-new-tokens must be in [1, 512]")
    if not 0 <= a.sampling_runs <= 10_000:
        raise ValueError("--sampling-runs must be in [0, 10000]")
    if not 1 <= a.run_repeats <= 20:
        raise ValueError("--run-repeats must be in [1, 20]")
    wanted = [p.strip() for p in a.prompts.split(",") if p.strip()]
    by_id = {p["id"]: p for p in load_prompts()}
    missing = [p for p in wanted if p not in by_id]
    if missing or not wanted:
        raise ValueError(f"--prompts: unknown ids {missing}; see assets/prompts/prompts.jsonl")
    return a, runs, wanted, by_id


def record_runs(a: argparse.Namespace, runs: list[str], wanted: list[str], by_id: dict, command: str,
                out: Path) -> Path:
    """Every decoding run, calibrated and checked, the sampling material, written with its fingerprint; the
    README in `out` (if it has the markers) then describes the bundle."""
    from nanospec.data.prompts import prompt_text

    engine, pair = load_engine(a.head, a.device)
    warm_up(engine, runs)
    calibration = {"before": calibrate(engine)}
    docs, sampled = [], {}
    for pid in wanted:
        docs += record_prompt(engine, by_id[pid], a.max_new_tokens, runs, a.run_repeats)
    calibration["after"] = calibrate(engine)
    print(f"  calibration (ar, {CALIBRATION_PROMPT!r}): {calibration['before']:.1f} tok/s before, "
          f"{calibration['after']:.1f} after", file=sys.stderr)
    found = check_recording(docs, calibration)
    notes = {}
    if found and not a.allow_unsteady:
        raise SystemExit("record-lesson: the timings are not stable, so nothing was written (run it again on "
                         "an idle machine):\n  " + "\n  ".join(found))
    if found:
        notes["unsteady"] = found
        print("record-lesson: writing despite unstable timings (--allow-unsteady):\n  " + "\n  ".join(found),
              file=sys.stderr)
    settings = {"max_new_tokens": a.max_new_tokens, "runs": {k: RUNS[k] for k in runs},
                "temperature": 0.0, "sampling": sampling.SAMPLING, "sampling_runs": a.sampling_runs,
                "run_repeats": a.run_repeats, "defaults": GenerationConfig().to_dict()}
    if a.merge:
        docs, sampled, notes["merged"] = merge_into(out / RUNS_FILE, docs, wanted, settings)
    else:
        for pid in wanted:
            sampled[pid] = record_sampling(engine, by_id[pid], a.max_new_tokens, a.sampling_runs)
    prompts = [{"id": pid, "category": by_id[pid]["category"], "text": prompt_text(by_id[pid])} for pid in wanted]
    machine = machine_label(engine.device)
    notes["fingerprint"] = fingerprint.fingerprint(engine, pair, machine, _now())   # what made the recording
    path = write_runs(out / RUNS_FILE, docs, prompts, pair, command, settings, machine, sampled, calibration, notes)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)", file=sys.stderr)
    with gzip.open(path, "rt", encoding="utf-8") as fh:   # the README describes what was written
        if describe.write_readme(out / "README.md", json.load(fh)):
            print(f"updated {out / 'README.md'}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `python -m nanospec record-lesson -- --head random` forwards the separator
        argv = argv[1:]
    a, runs, wanted, by_id = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    command = " ".join([COMMAND, *argv])
    t_start = time.perf_counter()
    if not a.skip_runs:
        record_runs(a, runs, wanted, by_id, command, out)
    if not a.skip_sweep:
        device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        sweep = lm_head_sweep(device, a.repeats)
        sweep["command"] = command
        path = out / SWEEP_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(sweep, indent=1))
        print(f"wrote {path}", file=sys.stderr)
    print(f"record-lesson done in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
