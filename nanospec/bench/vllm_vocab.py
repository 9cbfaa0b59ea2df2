"""Benchmark: vLLM EAGLE with the full vocabulary against vLLM EAGLE with NanoSpec's active vocabulary.

Run it with the python of the environment that has vLLM (docs/serving.md):

    venv-vllm/bin/python -m nanospec.bench.vllm_vocab --batch 1 8
    venv-vllm/bin/python -m nanospec.bench.vllm_vocab --target OUT/target --head OUT/head --batch 1 8

Three child processes run the same prompts one after another, greedy: vLLM plain (the reference output),
vLLM EAGLE with the head as it is (full vocabulary), and vLLM EAGLE with the plugin
(`nanospec/serving/vllm_plugin.py`). Each child loads vLLM once, runs one excluded warm-up, then every
batch size in turn (prompts in consecutive groups of that size, one `LLM.generate` per group). Printed
per batch size and row: tokens/s (output tokens / wall time of the generate calls), τ (vLLM's
spec-decode counters, counted as this engine counts it), draft time per step (vLLM's `propose`, which
drafts the whole chain for the batch; and the LM head + argmax inside it), mean active size and
coverage (plugin row: share of emitted tokens in the set when drafted; "next cov": the same for the
target's own token of each step alone), and whether every output equals vLLM plain's token for token.

Default pair: the offline default target and the shipped head, prompts = the project's held-out prompts
through the target's chat template. A folder without a tokenizer (`python -m nanospec random-pair`)
gets seeded random prompt ids instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KV_CACHE_BYTES = 1 << 30
ROWS = ("plain", "eagle", "eagle+nanospec")
ROOT = Path(__file__).resolve().parents[2]  # the checkout (children import nanospec from it)


# -- parent -----------------------------------------------------------------------------------

def default_pair() -> tuple[Path, Path]:
    from nanospec.loaders.default_model import ensure_default_model
    from nanospec.pair import DEFAULT_HEAD

    return ensure_default_model(), DEFAULT_HEAD


def prompt_ids(target: Path, limit: int | None, random_len: int, seed: int = 0) -> list[list[int]]:
    """The held-out prompts through the target's chat template; seeded random ids when it has no tokenizer."""
    from nanospec.data.prompts import load_prompts, prompt_messages

    items = load_prompts(None, split="heldout")[:limit]
    if has_tokenizer(target):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(target))
        out = []
        for item in items:
            ids = tok.apply_chat_template(prompt_messages(item), add_generation_prompt=True, tokenize=True)
            out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        return out
    import torch

    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (random_len,), generator=g).tolist() for _ in items]


def has_tokenizer(target: Path) -> bool:
    return (target / "tokenizer.json").is_file() or (target / "tokenizer_config.json").is_file()


def stop_ids(target: Path) -> list[int]:
    """The target's end-of-sequence ids; none for a target without a tokenizer (random weights: every
    row then generates all its tokens)."""
    if not has_tokenizer(target):
        return []
    config = json.loads((target / "config.json").read_text())
    eos = config.get("eos_token_id")
    return sorted(set(eos if isinstance(eos, list) else [eos] if eos is not None else []))


def run_child(python: str, request: dict, timeout: float) -> dict:
    """One row in its own process; RuntimeError with the log's last lines when it fails."""
    from nanospec.bench.peers.vllm_peer import probe

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in the child: the plugin's report is read in-process
    env["NANOSPEC_VLLM_ACTIVE_VOCAB"] = "1" if request["row"] == "eagle+nanospec" else "0"
    preload = [p for p in probe(python).preload if p not in env.get("LD_PRELOAD", "")]
    if preload:  # vLLM's CPU build asks for Intel OpenMP preloaded for speculative decoding
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [env.get("LD_PRELOAD")])])
    with tempfile.TemporaryDirectory(prefix="nanospec-vocab-bench-") as tmp:
        req, res, log = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "child.log")
        req.write_text(json.dumps(request))
        with log.open("w") as out:
            done = subprocess.run([python, "-m", "nanospec.bench.vllm_vocab", "--child", str(req), str(res)],
                                  stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=tmp)
        if done.returncode != 0 or not res.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"{request['row']} failed (exit status {done.returncode}):\n{tail}")
        return json.loads(res.read_text())


def compare_rows(results: dict[str, dict]) -> list[dict]:
    """One line per (batch size, row): speed, τ, draft time, active size, coverage, identical to plain."""
    lines = []
    plain = results.get("plain")
    for row, result in results.items():
        for batch, r in result["batches"].items():
            ref = plain["batches"][batch]["outputs"] if plain else None
            same = [a == b for a, b in zip(r["outputs"], ref)] if ref is not None else []
            decoded = sum(max(len(o) - 1, 0) for o in r["outputs"])
            steps = decoded - r["accepted"]
            lines.append({"batch": int(batch), "row": row, "tokens_per_s": r["tokens"] / r["wall_s"],
                          "tau": decoded / steps if row != "plain" and steps > 0 else 1.0,
                          "draft_ms_per_step": 1e3 * r["propose_s"] / r["propose_calls"] if r["propose_calls"] else None,
                          "lm_head_ms_per_step": 1e3 * r["sample_s"] / r["propose_calls"] if r["propose_calls"] else None,
                          "mean_active": r["vocab"]["mean_active"] if r.get("vocab") else None,
                          "coverage": r["vocab"]["coverage"] if r.get("vocab") else None,
                          "next_coverage": r["vocab"]["next_coverage"] if r.get("vocab") else None,
                          "identical": f"{sum(same)}/{len(same)}" if ref is not None else "-",
                          "all_identical": all(same) if ref is not None else None,
                          "per_request": r["vocab"]["requests"] if r.get("vocab") else None})
    return sorted(lines, key=lambda x: (x["batch"], ROWS.index(x["row"])))


def print_table(lines: list[dict], info: dict) -> None:
    print(f"vLLM {info['vllm']} on {info['device']}, {info.get('method', 'eagle')} head, dtype {info['dtype']}, "
          f"{info['num_prompts']} prompts, "
          f"{info['max_new_tokens']} new tokens, greedy, {info['num_speculative_tokens']} drafted tokens, "
          f"capacity {info['capacity']}, ctx top-{info['ctx_topk']}")
    head = f"{'batch':>5} {'row':<15} {'tok/s':>8} {'tau':>5} {'draft ms/step':>13} {'lm-head ms':>10} " \
           f"{'active':>7} {'coverage':>8} {'next cov':>8} {'identical to plain':>18}"
    print(head)
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for x in lines:
        print(f"{x['batch']:>5} {x['row']:<15} {x['tokens_per_s']:>8.2f} {x['tau']:>5.2f} "
              f"{fmt(x['draft_ms_per_step'], '.2f'):>13} {fmt(x['lm_head_ms_per_step'], '.2f'):>10} "
              f"{fmt(x['mean_active'], '.0f'):>7} {fmt(x['coverage'], '.3f'):>8} {fmt(x['next_coverage'], '.3f'):>8} "
              f"{x['identical']:>18}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nanospec.bench.vllm_vocab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (prompts per generate call)")
    ap.add_argument("--target", default=None, help="target folder (default: the offline default target)")
    ap.add_argument("--head", default=None, help="EAGLE-1/2 or EAGLE-3 head folder (default: the shipped head; "
                                               "alone: a head for the offline default target)")
    ap.add_argument("--limit", type=int, default=None, help="first N held-out prompts (default: all 14)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--random-prompt-len", type=int, default=64, help="prompt length for a target without tokenizer")
    ap.add_argument("--dtype", default=None, help="vLLM dtype (default: float32 on a CPU, bfloat16 on a GPU)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, of {', '.join(ROWS)}")
    ap.add_argument("--vllm-python", default=os.environ.get("NANOSPEC_VLLM_PYTHON") or sys.executable)
    ap.add_argument("--json", default=None, help="write every row (per-request figures included) here")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(Path(argv[1]), Path(argv[2]))
    from nanospec.heads.head3 import is_eagle3_folder
    from nanospec.serving.active_sets import check_pair

    ap = build_parser()
    a = ap.parse_args(argv)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    if not rows or any(r not in ROWS for r in rows) or any(b < 1 for b in a.batch):
        ap.error(f"--rows must name some of {', '.join(ROWS)} and --batch sizes must be >= 1")
    if a.target is not None and a.head is None:
        ap.error("--target needs its --head (neither: the default pair; --head alone: the default target)")
    target, head = (Path(a.target).resolve(), None) if a.target else default_pair()
    head = Path(a.head).resolve() if a.head else head  # --head alone: that head on the default target
    try:
        check_pair(target, head)  # before any child loads weights
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_rows(a, rows, target, head, "eagle3" if is_eagle3_folder(head) else "eagle")


def run_rows(a: argparse.Namespace, rows: list[str], target: Path, head: Path, method: str) -> int:
    """Each row in its child, then the table; `method` is vLLM's drafting method for this head.
    Exit status 1 when a row's output is not identical to vLLM plain's."""
    from nanospec.serving.vllm_plugin import settings

    capacity, ctx_topk = settings()
    prompts = prompt_ids(target, a.limit, a.random_prompt_len)
    longest = max(len(p) for p in prompts)
    base = {"model": str(target), "head": str(head), "method": method, "dtype": a.dtype, "prompts": prompts,
            "batches": a.batch,
            "max_new_tokens": a.max_new_tokens, "stop_token_ids": stop_ids(target),
            "num_speculative_tokens": a.num_speculative_tokens, "kv_cache_bytes": KV_CACHE_BYTES,
            "max_model_len": longest + a.max_new_tokens + a.num_speculative_tokens + 64}
    results = {}
    for row in rows:
        t = time.perf_counter()
        results[row] = run_child(a.vllm_python, {**base, "row": row}, a.timeout)
        print(f"[{row}: {time.perf_counter() - t:.0f} s including start-up]", file=sys.stderr)
    info = {**next(iter(results.values()))["info"], "num_prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
            "num_speculative_tokens": a.num_speculative_tokens, "capacity": capacity, "ctx_topk": ctx_topk,
            "method": method}
    lines = compare_rows(results)
    print_table(lines, info)
    if a.json:
        Path(a.json).write_text(json.dumps({"info": info, "target": str(target), "head": str(head), "rows": lines},
                                           indent=2))
    bad = [x for x in lines if x["all_identical"] is False]
    if bad:
        print("NOT IDENTICAL to vLLM plain: " + ", ".join(f"{x['row']} batch {x['batch']}" for x in bad))
    return 1 if bad else 0


# -- child ------------------------------------------------------------------------------------

def child(request_path: Path, result_path: Path) -> int:
    request = json.loads(request_path.read_text())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from nanospec.bench.peers.vllm_worker import ACCEPTED, counters, head_for_vllm
    from nanospec.serving import vllm_plugin

    row = request["row"]
    if row == "eagle+nanospec":
        vllm_plugin.install()  # also done by the entry point when nanospec is installed in vLLM's environment
    spec = None
    if row != "plain":
        vllm_plugin.install_timers()
        method = request.get("method", "eagle")
        model, _ = head_for_vllm(method, Path(request["head"]), request_path.parent)  # as the compare peer does
        spec = {"method": method, "model": model, "num_speculative_tokens": request["num_speculative_tokens"]}
    on_cpu = not torch.cuda.is_available()
    dtype = request["dtype"] or ("float32" if on_cpu else "bfloat16")
    target = Path(request["model"])
    tokenizer = has_tokenizer(target)
    llm = LLM(model=str(target), speculative_config=spec, seed=0, dtype=dtype,
              max_model_len=request["max_model_len"], kv_cache_memory_bytes=request["kv_cache_bytes"],
              enable_prefix_caching=False, enforce_eager=on_cpu, disable_log_stats=False,
              skip_tokenizer_init=not tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"], detokenize=False,
                            stop_token_ids=request["stop_token_ids"] or None, ignore_eos=not tokenizer)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, detokenize=False), use_tqdm=False)
    batches = {}
    for size in request["batches"]:
        _reset(vllm_plugin)
        before, wall, outputs = counters(llm)[ACCEPTED], 0.0, []
        for s in range(0, len(prompts), size):
            t = time.perf_counter()
            outs = llm.generate(prompts[s: s + size], params, use_tqdm=False)
            wall += time.perf_counter() - t
            outputs += [list(o.outputs[0].token_ids) for o in outs]
        times = dict(vllm_plugin.TIMES)
        batches[str(size)] = {"outputs": outputs, "wall_s": wall, "tokens": sum(map(len, outputs)),
                              "accepted": counters(llm)[ACCEPTED] - before, **times,
                              "vocab": vllm_plugin.summary() if row == "eagle+nanospec" else None}
    info = {"vllm": vllm.__version__, "device": "cpu" if on_cpu else "cuda", "dtype": dtype,
            "threads": torch.get_num_threads()}
    result_path.write_text(json.dumps({"row": row, "info": info, "batches": batches}))
    return 0


def _reset(plugin) -> None:
    plugin.REPORT.clear()
    for key in plugin.TIMES:
        plugin.TIMES[key] = 0.0 if key.endswith("_s") else 0


if __name__ == "__main__":  # vLLM may start processes that re-import this module: the guard is required
    sys.exit(main())
