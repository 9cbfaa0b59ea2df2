"""One-command benchmark at Llama-3 shapes: per-step draft and verify cost of every method on a GPU.

    python -m nanospec gpu-bench --out DIR [--quick] [--device cuda|cpu]

1. Runs the engine tests on the device (`NANOSPEC_TEST_DEVICE`; `--quick`: a subset, time-boxed) and
   records their outcome in the report; the benchmark runs either way.
2. Builds random-weight Llama pairs directly on the device (nothing downloaded, nothing written
   but the results): Llama-3.2-1B and Llama-3.1-8B shapes (V = 128,256), bf16, each with an
   EAGLE-2 head of matching shape. `--device cpu` uses a tiny shape with the same vocabulary, fp32.
3. Feeds the held-out prompts as Llama-3 token ids (`bench/llama3_prompts.py`), so the in-context
   vocabulary sees real text; `static` / `hybrid` use the Llama-3 frequency table
   (assets/freq/llama3_token_freq.safetensors) and are skipped, with the reason, without one.
4. Runs every method with the device's default tree and writes DIR/gpu_bench.json and .md.

Random heads accept almost nothing, so the figures are per-step costs (draft, LM head, verify),
not τ or end-to-end speedups of a trained head.

Exactness: with fp32 weights and TF32 off every method's greedy output equals `ar`'s token for
token on CUDA as on CPU (the engine tests check it). In bf16 a tree forward and a one-token forward
use different kernels, so after a near-tie the outputs may part; the benchmark reports the share of
prompts whose output equals `ar`'s and, per prompt, the first position where it differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch

from nanospec import metrics

from nanospec import transfer
from nanospec.config import GenerationConfig, default_tree
from nanospec.options import METHODS
from nanospec.decoding.engine import SpecEngine
from nanospec.paths import ASSETS
from nanospec.precision import first_difference
from nanospec.timing import DRAFT_PHASES, sync
from nanospec.bench.gpu_report import engine_tests, write_report
from nanospec.bench.llama3_prompts import LLAMA3_VOCAB, load_prompt_ids
from nanospec.bench.random_pair import random_head, random_target, random_target_config

FREQ_TABLE = ASSETS / "freq" / "llama3_token_freq.safetensors"


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool
    vocab: int = LLAMA3_VOCAB


SHAPES = {
    "llama-3.2-1b": Shape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, tied=True),
    "llama-3.1-8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, tied=False),
    "tiny": Shape("tiny (CPU check)", 64, 2, 4, 2, 128, tied=False),
}


@dataclass(frozen=True)
class Plan:
    shapes: tuple[str, ...]
    prompts: int
    new_tokens: int
    dtype: torch.dtype


def plan_for(device: torch.device, quick: bool) -> Plan:
    if device.type == "cuda":
        return Plan(("llama-3.2-1b", "llama-3.1-8b"), 2 if quick else 8, 32 if quick else 64, torch.bfloat16)
    return Plan(("tiny",), 2 if quick else 4, 8 if quick else 32, torch.float32)


def build_pair(shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random target + EAGLE-2 head, initialised on the device in `dtype` (rotary tables stay fp32)."""
    cfg = random_target_config(shape.vocab, shape.hidden, shape.layers, heads=shape.heads,
                               kv_heads=shape.kv_heads, intermediate=shape.intermediate, max_positions=8192)
    cfg.tie_word_embeddings = shape.tied
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    target = random_target(cfg, seed, dtype=dtype, device=device)
    return target, random_head(target.config, seed + 1, dtype=dtype, device=device)


def frequent_ids(vocab: int) -> tuple[torch.Tensor | None, str | None]:
    if not FREQ_TABLE.is_file():
        return None, (f"no Llama-3 frequency table ({FREQ_TABLE.name}); build it with "
                      "`python -m nanospec freq-table --tokenizer llama3`")
    from nanospec.data.freq_table import load_frequency_table, top_ids

    counts = load_frequency_table(FREQ_TABLE, vocab_size=vocab)
    if counts.shape[0] != vocab:
        return None, f"{FREQ_TABLE.name} has {counts.shape[0]} entries, the shape's vocabulary {vocab}"
    return top_ids(counts, vocab), None


def _generate(engine: SpecEngine, ids: list[int], cfg: GenerationConfig):
    sync(engine.device)
    t0 = time.perf_counter()
    result = engine.generate(ids, cfg)
    sync(engine.device)
    return result, time.perf_counter() - t0


SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug mode says this


def count_per_step(engine: SpecEngine, ids: list[int], cfg: GenerationConfig, cuda_syncs: bool,
                   kinds: dict[str, list[int]] | None = None) -> list[int]:
    """Host waits per decoding step (prefill excluded): `transfer.to_host` calls, or (cuda_syncs)
    every synchronising CUDA call that torch's sync debug mode reports plus every CUDA event
    `synchronize()` (the phase timer's; the debug mode does not see those). `kinds`, if given,
    receives the per-step counts of each kind ("debug_mode", "event_wait")."""
    seen: list[str] = []  # a "step" mark before each step, then one entry per wait
    real = transfer.to_host
    engine.before_step = lambda step, method: seen.append("step")

    def note(message, *args, **kwargs):
        if SYNC_WARNING in str(message):
            seen.append("debug_mode")

    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("always")
        if cuda_syncs:
            warnings.showwarning = note
            real_sync = torch.cuda.Event.synchronize

            def event_sync(event):
                seen.append("event_wait")
                return real_sync(event)
            stack.enter_context(mock.patch.object(torch.cuda.Event, "synchronize", event_sync))
            torch.cuda.set_sync_debug_mode("warn")
        else:
            transfer.to_host = lambda *parts: seen.append("read") or real(*parts)
        try:
            engine.generate(ids, cfg)
        finally:
            if cuda_syncs:
                torch.cuda.set_sync_debug_mode("default")
            transfer.to_host = real
            engine.before_step = None
    marks = [i for i, s in enumerate(seen) if s == "step"] + [len(seen)]
    steps = [seen[a + 1:b] for a, b in zip(marks, marks[1:])]
    if kinds is not None:
        for kind in ("debug_mode", "event_wait"):
            kinds[kind] = [s.count(kind) for s in steps]
    return [len(s) for s in steps]


def _phase_means(results) -> dict[str, float]:
    steps = [e for r in results for e in r.events if not e.is_prefill]
    return {k: statistics.fmean(e.phases[k] for e in steps) for k in steps[0].phases} if steps else {}


def bench_method(engine: SpecEngine, prompts: list[list[int]], cfg: GenerationConfig,
                 ref: dict[int, list[int]] | None) -> tuple[dict, list[list[int]]]:
    """Timer off (tokens/s, outputs), timer on (phases), then reads/syncs per step on the first prompt."""
    cuda = engine.device.type == "cuda"
    engine.generate(prompts[0], cfg)  # warm-up
    engine.timing = False
    if cuda:
        torch.cuda.reset_peak_memory_stats(engine.device)
    off = [_generate(engine, p, cfg) for p in prompts]
    engine.timing = True
    on = [_generate(engine, p, cfg) for p in prompts]
    results = [r for r, _ in off]
    outputs = [r.token_ids for r in results]
    n_tok = sum(len(o) for o in outputs)
    decode = [e for r in results for e in r.events if not e.is_prefill]
    steps = len(decode)
    step_off = 1e3 * sum(w for _, w in off) / max(steps, 1)
    step_on = statistics.fmean(e.wall_ms for r, _ in on for e in r.events if not e.is_prefill)
    phases = _phase_means([r for r, _ in on])
    row = {
        "tokens_per_s": metrics.tokens_per_s(n_tok, sum(w for _, w in off)),
        "tau": metrics.tau(e.n_emitted for e in decode),
        "step_ms": step_off, "step_ms_timed": step_on, "timer_overhead_pct": 100 * (step_on / step_off - 1),
        "draft_ms": sum(phases.get(k, 0.0) for k in DRAFT_PHASES),
        **{f"{k}_ms": phases.get(k, 0.0) for k in DRAFT_PHASES},
        "verify_ms": phases.get("verify_forward", 0.0),
        "mean_active": metrics.mean_active(e.active_size for e in decode),
        "peak_gpu_gib": torch.cuda.max_memory_allocated(engine.device) / 2**30 if cuda else None,
        "host_reads_per_step": max(count_per_step(engine, prompts[0], cfg, cuda_syncs=False)),
    }
    if cuda:
        for timing in (False, True):
            engine.timing = timing
            kinds: dict[str, list[int]] = {}
            counts = count_per_step(engine, prompts[0], cfg, cuda_syncs=True, kinds=kinds)
            row[f"cuda_syncs_per_step_timer_{'on' if timing else 'off'}"] = max(counts)
            if timing:
                row["event_waits_per_step_timer_on"] = max(kinds["event_wait"])
    engine.timing = True
    if ref is not None:
        div = [first_difference(o, ref[i]) for i, o in enumerate(outputs)]
        row["identical_to_ar"] = sum(d is None for d in div) / len(div)
        row["first_divergence"] = div
    return row, outputs


def bench_shape(key: str, plan: Plan, device: torch.device, prompts: list[list[int]], log) -> dict:
    shape = SHAPES[key]
    t0 = time.perf_counter()
    target, head = build_pair(shape, device, plan.dtype)
    freq, why = frequent_ids(shape.vocab)
    engine = SpecEngine(target, None, head, frequent_ids=freq, eos_token_ids=[])
    build_s = time.perf_counter() - t0
    log(f"{shape.name}: built on {device} in {build_s:.1f} s")
    tree = default_tree(device)
    out = {"shape": vars(shape), "build_s": build_s, "tree": vars(tree), "methods": {}}
    ref = None
    for method in METHODS:
        if method in ("static", "hybrid") and freq is None:
            out["methods"][method] = {"skipped": why}
            log(f"  {method}: skipped ({why})")
            continue
        cfg = GenerationConfig.build(method, max_new_tokens=plan.new_tokens, **vars(tree))
        row, outputs = bench_method(engine, prompts, cfg, ref)
        if method == "ar":
            ref = dict(enumerate(outputs))
        out["methods"][method] = row
        log(f"  {method}: {row['tokens_per_s']:.1f} tok/s, draft {row['draft_ms']:.2f} ms/step "
            f"(LM head {row['lm_head_ms']:.2f}), verify {row['verify_ms']:.2f} ms/step")
    del engine, target, head
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _bench_or_error(key: str, plan: Plan, device: torch.device, prompts: list[list[int]], log) -> dict:
    """One shape's results, or what stopped it (out of memory, a kernel error): the report is written either way."""
    try:
        return bench_shape(key, plan, device, prompts, log)
    except (RuntimeError, ValueError, AssertionError) as exc:
        log(f"{SHAPES[key].name}: not measured ({type(exc).__name__}: {exc})")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"shape": vars(SHAPES[key]), "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m nanospec gpu-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_bench.json and gpu_bench.md")
    ap.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    ap.add_argument("--device", default=None, help="cuda | cuda:N | cpu (default: cuda when available)")
    ap.add_argument("--skip-tests", action="store_true", help="do not run the engine tests first")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"--device must be cuda, cuda:N or cpu; got {a.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    tests = "skipped (--skip-tests)" if a.skip_tests else engine_tests(device, log, quick=a.quick)
    plan = plan_for(device, a.quick)
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = [p["ids"] for p in load_prompt_ids()[: plan.prompts]]
    t0 = time.perf_counter()
    shapes = [_bench_or_error(key, plan, device, prompts, log) for key in plan.shapes]
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": str(plan.dtype).removeprefix("torch."),
            "quick": a.quick, "prompts": len(prompts), "new_tokens": plan.new_tokens, "engine_tests": tests,
            "wall_s": time.perf_counter() - t0, "command": "python -m nanospec gpu-bench " + " ".join(argv or [])}
    json_path, md_path = write_report(Path(a.out), meta, shapes)
    log(f"wrote {json_path} and {md_path} ({meta['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
