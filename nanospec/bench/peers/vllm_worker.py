"""Child side of the vLLM peer: run one vLLM configuration on token-id prompts, write JSON.

Run by the interpreter of the environment that has vLLM, never imported by `nanospec` (it imports
only the standard library until it runs vLLM, so it works from a checkout or an installed
package alike; a request with `active_vocab` then imports NanoSpec's vLLM plugin from the package
this file belongs to):

    python vllm_worker.py --probe                 # JSON on stdout: vLLM's version, without importing it
    python vllm_worker.py REQUEST.json RESULT.json

The request (written by `vllm_peer.py`) holds the target folder, dtype, the kind (`plain`, `ngram`,
`eagle`, `eagle3`), the head folder, the prompts as token ids, max new tokens and the stop ids.
Every prompt runs alone (batch 1, greedy) after one excluded warm-up generation; the result holds
each prompt's output ids, wall time and vLLM's speculative-decoding counters for that prompt.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

# vLLM's Prometheus counters of speculative decoding (v1 engine)
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


def probe() -> dict:
    """Whether this interpreter has vLLM and which version, without importing it (importing takes
    ~10 s); plus the Intel OpenMP library vLLM's CPU build asks to preload for speculative decoding."""
    out = {"python": sys.executable, "vllm": None, "distribution": None, "preload": []}
    if importlib.util.find_spec("vllm") is None:
        return out
    for dist in importlib.metadata.packages_distributions().get("vllm", []) or ["vllm"]:
        try:
            out["vllm"], out["distribution"] = importlib.metadata.version(dist), dist
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.is_file():
        out["preload"].append(str(iomp))
    return out


def eagle_head_for_vllm(src: Path, dst: Path) -> list[str]:
    """Write `src` (an EAGLE-1/2 head in this project's layout) as a head vLLM loads the same way.

    vLLM's `llama_eagle.LlamaModel` builds `fc` without a bias, and its `LlamaAttention` reads a config
    key `bias` as *attention* bias. A head whose `fc` has a bias (the shipped one; the layout's default)
    would lose it and get uninitialised attention biases. Layer 0 has no input norm, so the fc bias b
    folds exactly into attention biases: q/k/v bias += W_qkv b (the attention sees h + b), o_proj bias
    += b (the residual carries h + b). Returns one note per change."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    weights_file = src / "model.safetensors"
    weights = load_file(weights_file) if weights_file.is_file() else torch.load(
        src / "pytorch_model.bin", map_location="cpu", weights_only=True)
    notes = []
    fc_bias = weights.pop("fc.bias", None)
    config.pop("bias", None)
    if fc_bias is not None:
        attn = "layers.0.self_attn."
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = weights[f"{attn}{proj}.weight"]  # [out, hidden]
            old = weights.get(f"{attn}{proj}.bias", torch.zeros(w.shape[0], dtype=w.dtype))
            weights[f"{attn}{proj}.bias"] = (old.float() + w.float() @ fc_bias.float()).to(w.dtype)
        o = weights[f"{attn}o_proj.weight"]
        old = weights.get(f"{attn}o_proj.bias", torch.zeros(o.shape[0], dtype=o.dtype))
        weights[f"{attn}o_proj.bias"] = (old.float() + fc_bias.float()).to(o.dtype)
        config["attention_bias"] = True
        notes.append("fc bias folded into layer 0's attention biases (vLLM's EAGLE fc has none)")
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    return notes


def eagle3_head_for_vllm(src: Path, dst: Path) -> list[str]:
    """Write `src` (an EAGLE-3 head in the published layout) as a head vLLM loads: vLLM builds no draft-to-target
    map when the draft vocabulary is the target's whole vocabulary, and then refuses a `d2t` tensor
    (`Eagle3LlamaForCausalLM.load_weights`: "There is no module or parameter named 'draft_id_to_target_id'"). This
    project's EAGLE-3 heads draft over the whole vocabulary and store identity maps (`d2t` all zero), so those
    are dropped; a head with a pruned vocabulary keeps them. Returns one note per change."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    weights = load_file(src / "model.safetensors")
    notes = []
    d2t = weights.get("d2t")
    full = int(config.get("draft_vocab_size") or config["vocab_size"]) == int(config["vocab_size"])
    if full and (d2t is None or not bool(torch.any(d2t != 0))):
        if {"d2t", "t2d"} & set(weights):
            notes.append("identity d2t/t2d dropped (the head drafts over the whole vocabulary)")
        weights.pop("d2t", None)
        weights.pop("t2d", None)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    return notes


def speculative_config(request: dict, workdir: Path) -> tuple[dict | None, list[str]]:
    """vLLM's `speculative_config` for the request's kind, and notes on what was adapted."""
    kind, k = request["kind"], request["num_speculative_tokens"]
    if kind == "plain":
        return None, []
    if kind == "ngram":
        # the same lookup as transformers' prompt lookup in compare's `--prompt-lookup` row: the longest
        # match of the last 2 tokens, else of the last one
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 2, "prompt_lookup_min": 1}, []
    model, notes = head_for_vllm(kind, Path(request["head"]), workdir)
    return {"method": kind, "model": model, "num_speculative_tokens": k}, notes


def head_for_vllm(method: str, head: Path, workdir: Path) -> tuple[str, list[str]]:
    """What vLLM's `method` drafting ("eagle", "eagle3") should load for `head`, and notes on what was adapted:
    a local head in this project's layout as a converted copy in `workdir` (`eagle_head_for_vllm`,
    `eagle3_head_for_vllm`), anything else (a hub id) as it is."""
    if method == "eagle" and head.is_dir():
        convert = eagle_head_for_vllm
    elif method == "eagle3" and (head / "model.safetensors").is_file():
        convert = eagle3_head_for_vllm
    else:
        return str(head), []
    converted = workdir / f"{method}_head"
    return str(converted), convert(head, converted)


def counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters now (absent without speculation: zeros)."""
    out = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(getattr(metric, "value", 0.0))
    return out


def active_vocab_plugin():
    """NanoSpec's vLLM plugin, installed in this process (before the engine is built): vLLM's EAGLE drafting
    then scores each request's active vocabulary only. Imported from the package this file lies in."""
    package_root = Path(__file__).resolve().parents[3]  # the folder that holds `nanospec`
    if importlib.util.find_spec("nanospec") is None:
        sys.path.insert(0, str(package_root))
    os.environ["NANOSPEC_VLLM_ACTIVE_VOCAB"] = "1"  # also for the entry point, where nanospec is installed
    from nanospec.serving import vllm_plugin

    vllm_plugin.install()
    return vllm_plugin


def run(request: dict, workdir: Path) -> dict:
    """Load vLLM with the request's settings and time every prompt (batch 1, greedy)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: one PID to time
    if Path(request["model"]).is_dir() and (request["kind"] in ("plain", "ngram") or Path(request["head"]).is_dir()):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never wait on the hub
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec, notes = speculative_config(request, workdir)
    plugin = active_vocab_plugin() if request.get("active_vocab") else None
    on_cpu = not torch.cuda.is_available()
    settings = {
        "dtype": request["dtype"],
        "max_model_len": request["max_model_len"],
        "kv_cache_memory_bytes": request["kv_cache_bytes"],
        "enable_prefix_caching": False,  # this engine does not reuse prompts across requests either
        "enforce_eager": on_cpu,  # on a CPU, torch.compile costs minutes at start-up for little
        "disable_log_stats": False,  # the speculative-decoding counters
    }
    t0 = time.perf_counter()
    llm = LLM(model=request["model"], speculative_config=spec, seed=0, **settings)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"], detokenize=False,
                            stop_token_ids=request["stop_token_ids"])
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    warm = SamplingParams(temperature=0.0, max_tokens=4, detokenize=False)
    llm.generate(prompts[:1], warm, use_tqdm=False)  # warm-up (allocators, kernels), excluded
    if plugin is not None:
        plugin.REPORT.clear()  # the warm-up's request is not one of the prompts
    results = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for prompt in prompts:
        before = counters(llm)
        t = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        wall = time.perf_counter() - t
        after = counters(llm)
        results.append({"output": list(out.token_ids), "wall_s": wall,
                        "drafts": after[DRAFTS] - before[DRAFTS],
                        "draft_tokens": after[DRAFT_TOKENS] - before[DRAFT_TOKENS],
                        "accepted": after[ACCEPTED] - before[ACCEPTED]})
    busy = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9) / max(torch.get_num_threads(), 1)
    return {"vllm": vllm.__version__, "kind": request["kind"], "load_s": load_s,
            "vocab": plugin.summary() if plugin is not None else None, "device": "cpu" if on_cpu else "cuda",
            "threads": torch.get_num_threads(), "cpu_share": busy, "settings": settings, "speculative_config": spec,
            "notes": notes, "prompts": results}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    request_path, result_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    result = run(request, request_path.parent)
    result_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM may start processes that re-import this file: the guard is required
    sys.exit(main(sys.argv[1:]))
