"""`compare`: the same prompts through every method, one table of honest, same-run numbers.

Methods run interleaved per prompt (ar, full, static, nanospec, hybrid, ...), after one warm-up
generation each, so machine noise hits all of them alike. Speedup is the median over prompts of
(method tokens/s / ar tokens/s on that prompt); tokens/s and per-step times are medians over
prompts; τ, mean active size and coverage pool every step. Each row also keeps τ and speedup
per prompt (`per_prompt_tau`, `per_prompt_speedup`) for the JSON.
"""

from __future__ import annotations

import dataclasses
import itertools
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nanospec import metrics, precision
from nanospec.bench.trust import assess_trust
from nanospec.timing import metered
from nanospec.config import GenerationConfig
from nanospec.decoding.engine import SpecEngine
from nanospec.options import OPTIONS


@dataclass
class MethodRows:
    method: str
    tps: list[float]
    draft_ms: list[float]
    lm_head_ms: list[float]
    outputs: list[list[int]]
    taus: list[float] = dataclasses.field(default_factory=list)  # per prompt (and repeat)
    emitted: list[int] = dataclasses.field(default_factory=list)  # per decode step, every prompt pooled
    accepted: list[int] = dataclasses.field(default_factory=list)  # per decode step
    coverage: list[bool | None] = dataclasses.field(default_factory=list)  # per decode step
    outside: list[int] = dataclasses.field(default_factory=list)  # per decode step: accepted, not in the set
    sources: dict[str, int] = dataclasses.field(default_factory=dict)  # accepted drafts by node source
    steps: list[list[int]] = dataclasses.field(default_factory=list)  # per output: tokens emitted per step
    active: list[int] = dataclasses.field(default_factory=list)  # per decode step: active size
    budget_ms: list[float] = dataclasses.field(default_factory=list)  # per decode step: the draft budget's own time
    step_ms: list[float] = dataclasses.field(default_factory=list)  # per decode step: wall time
    verified: list[int] = dataclasses.field(default_factory=list)  # per decode step: tree nodes verified
    # per budgeted decode step: the tokens the kept tree was expected to bring, and brought (the bonus included)
    expected: list[float] = dataclasses.field(default_factory=list)
    brought: list[int] = dataclasses.field(default_factory=list)
    new_tokens: int = 0
    peer: dict | None = None  # an outside engine's row (bench.peers): its τ, settings and counters


def row_name(base: str, variant: dict | None = None, budget: bool | None = None) -> str:
    """A result row's name, the same in `compare` and `sweep`: `base`, then the option's tag and value
    for each option of `variant` (those the run varies) set above 0 (`+copy10`, `+retr8`), and
    `+budget` for the draft budget on (when that run varies it)."""
    tags = "".join(f"+{OPTIONS[name].tag}{value}" for name, value in (variant or {}).items() if value)
    return base + tags + ("+budget" if budget else "")


def variants_of(values: dict[str, tuple]) -> list[dict]:
    """Every combination of the run's varied list options ({name: values}): [{name: value, ...}, ...],
    in the order given; [{}] when none is varied."""
    names = list(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*(values[n] for n in names))]


def compare(engine: SpecEngine, prompts: list, methods: list[str], options: dict,
            prompt_lookup: int = 0, progress=None, repeat: int = 1, variants: dict[str, tuple] | None = None,
            budgets: tuple[bool, ...] = (), peer=None, hf_generate: bool = False, hf_model=None) -> list[dict]:
    """Run `methods` (ar first, added if missing) on every prompt; return one dict per method.

    `variants`: list options to vary ({name: values}, e.g. {"copy_branch": (0, 10), "retrieval_nodes":
    (0, 8)}): every tree method runs once per combination (rows `method+copy10+retr8`, a value 0 leaving
    its tag out); none = once, with `options`' own values.
    `budgets`: run every tree method with the draft budget off and/or on (row `method+budget` when
    on and both are asked for); empty = `options`' own `budget`.
    `peer`: an outside engine (`bench.peers.VllmPeer`), called once with every prompt's token ids after
    this engine's runs; its rows (`PeerRun`s) join the table with the same identity check against ar.
    `hf_generate`: also time transformers' own greedy `generate()` (row `hf_generate`), so a reader sees how
    `ar` compares with the library's plain decoding; on `hf_model` (the same target as transformers loads
    it, none of this engine's kernels) or, when None, on the engine's own model."""
    methods = ["ar"] + [m for m in methods if m != "ar"]
    configs = {}
    for m in methods:
        for v in (variants_of(variants or {}) if m != "ar" else [{}]):
            for b in (budgets if len(budgets) > 1 and m != "ar" else (None,)):
                opts = {**options, **v} if b is None else {**options, **v, "budget": b}
                configs[row_name(m, v, b)] = GenerationConfig.build(m, **opts)
    reference = (hf_model if hf_model is not None else engine.model) if hf_generate else None
    return _interleaved(engine, prompts, configs, prompt_lookup, progress, repeat, peer, reference)


def sweep(engine: SpecEngine, prompts: list, method: str, trees: list[tuple[int, int, int]], options: dict,
          progress=None, repeat: int = 1, variants: dict[str, tuple] | None = None) -> list[dict]:
    """`method` at several tree sizes (depth, top_k, total_tokens), each with every combination of
    `variants` (as `compare`'s), against ar, same run, interleaved."""
    configs = {"ar": GenerationConfig.build("ar", **options)}
    for depth, top_k, total in trees:
        for v in variants_of(variants or {}):
            configs[row_name(f"{method} {depth}x{top_k}x{total}", v)] = GenerationConfig.build(
                method, **{**options, **v, "depth": depth, "top_k": top_k, "total_tokens": total})
    return _interleaved(engine, prompts, configs, 0, progress, repeat)


def parse_tree_settings(text: str) -> list[tuple[int, int, int]]:
    """Tree sizes for `sweep` (`--trees`) and train-head's `--eval`: '5x8x32,4x6x24' -> [(depth, top_k, total_tokens), ...]"""
    try:
        out = [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ValueError(f"tree settings must look like 5x8x32,4x6x24 (depth x top_k x total_tokens): {text!r}") from err
    if not out or any(len(s) != 3 for s in out):
        raise ValueError(f"tree settings must look like 5x8x32,4x6x24 (depth x top_k x total_tokens): {text!r}")
    return out


OUTSIDE_ROWS = ("prompt_lookup", "hf_generate")  # transformers' own decoding: references, not this engine's


def _interleaved(engine: SpecEngine, prompts: list, configs: dict[str, GenerationConfig], prompt_lookup: int,
                 progress, repeat: int, peer=None, reference=None) -> list[dict]:
    """Every config on every prompt, interleaved per prompt after one warm-up each; "ar" is the reference.
    `reference`: the model of the `hf_generate` row (None: no such row)."""
    for cfg in configs.values():
        cfg.validate()
    ids = [engine.encode_prompt(p) for p in prompts]
    rows = {name: MethodRows(name, [], [], [], []) for name in configs}
    if prompt_lookup:
        rows["prompt_lookup"] = MethodRows("prompt_lookup", [], [], [], [])
    if reference is not None:
        rows["hf_generate"] = MethodRows("hf_generate", [], [], [], [])
        _record_generate(MethodRows("warm-up", [], [], [], []), engine, ids[0], configs["ar"], 0, 4, reference)
    for cfg in configs.values():  # warm-up (allocators, kernels), excluded
        engine.generate(ids[0], dataclasses.replace(cfg, max_new_tokens=4))
    total = len(ids) * repeat
    done = 0
    busy = {name: [0.0, 0.0] for name in configs}  # per row: CPU share x wall time, wall time
    for _ in range(repeat):
        for p in ids:
            for name, cfg in configs.items():
                with metered() as meter:
                    result = engine.generate(p, cfg)
                busy[name][0] += meter.cpu_share * meter.wall_s
                busy[name][1] += meter.wall_s
                _record(rows[name], result)
            if prompt_lookup:
                _record_generate(rows["prompt_lookup"], engine, p, configs["ar"], prompt_lookup)
            if reference is not None:
                _record_generate(rows["hf_generate"], engine, p, configs["ar"], 0, model=reference)
            done += 1
            if progress:
                progress(done, total)
    # ar once more on the first prompt: its speed now against its first timed run (did the machine change?)
    ar_again = engine.generate(ids[0], configs["ar"]).summary.tokens_per_s
    ar_drift = abs(ar_again / rows["ar"].tps[0] - 1) if rows["ar"].tps and rows["ar"].tps[0] > 0 else None
    for run in peer(ids) if peer is not None else []:  # in its own process, after this engine's runs
        rows[run.name] = MethodRows(run.name, run.tokens_per_s, [], [], run.outputs, taus=run.taus,
                                    new_tokens=sum(map(len, run.outputs)), peer={**run.info, "tau": run.tau})
    table = _table(rows, greedy=configs["ar"].sampling.greedy, vocab_size=engine.vocab_size)
    for row in table:
        b = busy.get(row["method"])
        peer_info = row.get("peer") or {}  # another engine: its own CPU share; τ bounds only this engine's speedup
        share = b[0] / b[1] if b and b[1] > 0 else peer_info.get("cpu_share")
        row["trust"] = assess_trust(row["method"], row["per_prompt_speedup"], repeat, len(ids), row["speedup"],
                                    None if peer_info else row["tau"], share, ar_drift)
    if configs["ar"].sampling.greedy:
        _add_exactness(table, rows, engine, ids * repeat)
    return table


def _add_exactness(table: list[dict], rows: dict[str, MethodRows], engine: SpecEngine, ids: list[list[int]]) -> None:
    """Greedy: per row, the share of outputs identical to ar's, each output's first divergence with
    the target's logit margin there, and the verdict (`precision.exactness`)."""
    ar = rows["ar"].outputs
    for row in table:
        if row["method"] == "ar":
            continue
        r = rows[row["method"]]
        found = [precision.divergence(engine, p, out, ref, steps)
                 for p, out, ref, steps in zip(ids, r.outputs, ar, r.steps or [None] * len(r.outputs))]
        row["identical_share"] = sum(d is None for d in found) / len(found) if found else None
        row["divergences"] = [d.to_dict() if d is not None else None for d in found]
        row["exactness"] = precision.exactness(found, engine.model.dtype)


def _record(row: MethodRows, result) -> None:
    s = result.summary
    decode = [e for e in result.events if not e.is_prefill]
    row.tps.append(s.tokens_per_s)
    row.draft_ms.append(s.draft_ms_per_step)
    row.lm_head_ms.append(s.lm_head_ms_per_step)
    row.outputs.append(s.output_ids)
    row.steps.append([e.n_emitted for e in result.events])
    emitted = [e.n_emitted for e in decode]
    row.taus.append(s.tau)
    row.emitted += emitted
    row.accepted += [len(e.accepted_tokens) for e in decode]
    row.coverage += [e.coverage for e in decode]
    row.outside += [e.accepted_outside() for e in decode]
    for source, count in s.accepted_by_source.items():
        row.sources[source] = row.sources.get(source, 0) + count
    row.active += [e.active_size for e in decode]
    row.budget_ms += [e.phases.get("budget", 0.0) for e in decode]
    row.step_ms += [e.wall_ms for e in decode]
    row.verified += [len(e.tree_tokens) for e in decode]
    budgeted = [e for e in decode if e.expected_tokens is not None]
    row.expected += [e.expected_tokens for e in budgeted]
    row.brought += [len(e.accepted_tokens) + 1 for e in budgeted]
    row.new_tokens += s.new_tokens


@torch.inference_mode()
def _record_generate(row: MethodRows, engine: SpecEngine, prompt_ids: list[int], cfg: GenerationConfig,
                     n_lookup: int, max_new_tokens: int | None = None, model=None) -> None:
    """transformers' own greedy `generate()` on the same target (`model`, default the engine's), with
    prompt-lookup decoding of `n_lookup` tokens (0: plain greedy decoding), as an outside reference."""
    model = engine.model if model is None else model
    inp = torch.tensor([prompt_ids], device=engine.device)
    eos = sorted(engine.eos_token_ids) or None
    lookup = {"prompt_lookup_num_tokens": n_lookup} if n_lookup else {}
    t0 = time.perf_counter()
    out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new_tokens or cfg.max_new_tokens,
                         do_sample=False, eos_token_id=eos, pad_token_id=eos[0] if eos else None, **lookup)
    wall = time.perf_counter() - t0
    gen = out[0, inp.shape[1]:].tolist()
    row.tps.append(metrics.tokens_per_s(len(gen), wall))
    row.outputs.append(gen)
    row.new_tokens += len(gen)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _table(rows: dict[str, MethodRows], greedy: bool, vocab_size: int) -> list[dict]:
    ar = rows["ar"]
    table = []
    for name, r in rows.items():
        speedups = [metrics.speedup(a, b) for a, b in zip(r.tps, ar.tps) if b > 0]
        drafts = name != "ar" and name not in OUTSIDE_ROWS and r.peer is None
        mean_active = metrics.mean_active(r.active)
        peer_active = r.peer.get("mean_active") if r.peer else None  # vLLM with NanoSpec's plugin
        table.append({
            "method": name,
            "tokens_per_s": _median(r.tps),
            "speedup": _median(speedups),
            "tau": r.peer["tau"] if r.peer else metrics.tau(r.emitted),
            "draft_ms_per_step": _median(r.draft_ms) if r.draft_ms and drafts else None,
            "lm_head_ms_per_step": _median(r.lm_head_ms) if r.lm_head_ms and drafts else None,
            "mean_active": mean_active if drafts else peer_active,
            "active_frac": mean_active / vocab_size if drafts else (peer_active / vocab_size if peer_active else None),
            "coverage": r.peer.get("coverage") if r.peer else metrics.coverage(r.accepted, r.coverage, r.outside),
            "identical_to_ar": metrics.identical_to_ar(r.outputs, ar.outputs[:len(r.outputs)] if r.peer else ar.outputs,
                                                       greedy),
            # share of accepted draft tokens by the source of their node (head / copy / both)
            "accepted_share": {k: v / sum(r.sources.values()) for k, v in r.sources.items()}
            if sum(r.sources.values()) else None,
            "n_prompts": len(r.outputs),
            "new_tokens": r.new_tokens,
            # per prompt, in prompt order, once per repeat (index i is prompt i % n_prompts)
            "per_prompt_tau": r.taus if r.taus else None,
            "per_prompt_speedup": speedups,
            # tree nodes verified per step (the root included), and the draft budget's own time as a
            # share of the step's (0 without the budget)
            "mean_verified": metrics.mean(r.verified) if drafts else None,
            "budget_share": sum(r.budget_ms) / sum(r.step_ms) if drafts and sum(r.step_ms) else None,
            # the draft budget's calibration: tokens a step its kept trees were expected to bring, and brought
            "budget_expected": metrics.mean(r.expected) if drafts and r.expected else None,
            "budget_brought": metrics.mean(r.brought) if drafts and r.brought else None,
            **({"peer": r.peer} if r.peer else {}),
        })
    return table


def by_category(table: list[dict], categories: list[str]) -> list[dict]:
    """τ (mean of the per-prompt τ) and speedup (median of the per-prompt ratios) of every method per
    prompt category; `categories[i]` is prompt i's. One dict per category, in first-seen order."""
    n = len(categories)
    out = []
    for cat in dict.fromkeys(categories):
        row: dict = {"category": cat, "n_prompts": categories.count(cat)}
        for r in table:
            picks = [i for i in range(len(r["per_prompt_speedup"])) if categories[i % n] == cat]
            taus = r["per_prompt_tau"] or []
            row[r["method"]] = {
                "tau": metrics.mean_tau(taus[i] for i in picks) if taus else None,
                "speedup": _median([r["per_prompt_speedup"][i] for i in picks]),
            }
        out.append(row)
    return out


def format_by_category(rows: list[dict], methods: list[str]) -> str:
    head = f"{'category':<19}" + "".join(f"{m[:16]:>18}" for m in methods)
    lines = [head + "    (tau / speedup vs ar)", "-" * len(head)]
    for row in rows:
        cells = []
        for m in methods:
            tau, sp = row[m]["tau"], row[m]["speedup"]
            cells.append(f"{'-' if tau is None else f'{tau:.2f}':>10} {sp:5.2f}x ")
        lines.append(f"{row['category'] + ' (' + str(row['n_prompts']) + ')':<19}" + "".join(cells))
    return "\n".join(lines)


def peak_memory_mb() -> float:
    """Peak resident memory of this process (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_split_mb(status: str | None = None) -> dict[str, float] | None:
    """Resident memory now, split into anonymous (tensors, allocator) and file-backed pages (mapped
    files: the model's safetensors, which transformers maps rather than copies, and libraries),
    from Linux's /proc/self/status; None where that is not available. File-backed pages are page
    cache: shared, and the kernel can drop them under memory pressure."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return {key: int(fields[name].split()[0]) / 1024
                for key, name in (("rss", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile"))}
    except (KeyError, ValueError, IndexError):
        return None


def exactness_notes(table: list[dict]) -> list[str]:
    """One line per method whose greedy output is not identical to ar's: the share, and each first
    divergence with the target's margin there (see `precision.py`)."""
    lines = []
    for row in table:
        if row.get("exactness") in (None, "identical"):
            continue
        lines.append(f"{row['method']}: {row['identical_share']:.0%} of outputs identical to ar; "
                     + ("every difference is a near-tie at this precision" if row["exactness"] == "near-tie"
                        else "a difference that precision does not explain"))
        for i, d in enumerate(row["divergences"]):
            if d is not None:
                lines.append(f"  prompt {i}: " + precision.Divergence(**d).describe())
    return lines


def format_table(table: list[dict]) -> str:
    head = f"{'method':<18}{'tok/s':>8}{'speedup':>9}{'tau':>7}{'draft ms':>10}{'lm_head ms':>11}" \
           f"{'active':>9}{'% of V':>8}{'coverage':>10}{'identical':>11}{'copy/both %':>13}{'nodes':>7}"
    lines = [head, "-" * len(head)]
    for row in table:
        def fmt(v, spec):  # a missing value keeps the column's width
            return format(v, spec) if v is not None and v == v else "-".rjust(int(spec.split(".")[0] or 0))
        ident = {True: "yes", False: "NO", None: "-"}[row["identical_to_ar"]]
        if row.get("exactness") == "near-tie":  # low precision: differences the dtype explains
            ident = f"{row['identical_share']:.0%} tie"
        lines.append(
            f"{row['method']:<18}{fmt(row['tokens_per_s'], '8.2f')}{fmt(row['speedup'], '8.2f')}x"
            f"{fmt(row['tau'], '7.2f')}{fmt(row['draft_ms_per_step'], '10.2f')}"
            f"{fmt(row['lm_head_ms_per_step'], '11.2f')}{fmt(row['mean_active'], '9.0f')}"
            f"{fmt(None if row['active_frac'] is None else 100 * row['active_frac'], '7.2f')}%"
            f"{fmt(None if row['coverage'] is None else 100 * row['coverage'], '9.1f')}%{ident:>11}"
            f"{_copy_share(row.get('accepted_share')):>13}{fmt(row.get('mean_verified'), '7.1f')}")
    return "\n".join(lines)


def _copy_share(share: dict | None) -> str:
    """Accepted draft tokens from the copy chain only / from nodes both sources proposed, in %."""
    if not share or not (share.get("copy") or share.get("both")):
        return "-"
    return f"{100 * share.get('copy', 0):.0f}/{100 * share.get('both', 0):.0f}"
