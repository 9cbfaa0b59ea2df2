"""Command line: `python -m nanospec {generate,compare,sweep,random-pair,train-head,freq-table,record-lesson,gpu-bench}`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nanospec.config import GenerationConfig
from nanospec.options import METHODS, OPTIONS, Option, run_defaults


def _progress_bar():
    """A `progress(message, fraction)` callback drawing one tqdm bar (first-run fetch/conversion)."""
    from tqdm import tqdm
    bar = tqdm(total=1.0, bar_format="{desc} {percentage:3.0f}%|{bar}|", file=sys.stderr, leave=False)

    def progress(message: str, fraction: float | None) -> None:
        bar.set_description_str(message[:60])
        if fraction is not None:
            bar.n = fraction
        bar.refresh()
    return progress


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="hub id or local folder (default: offline SmolLM2-135M-Instruct)")
    p.add_argument("--head", default=None,
                   help="EAGLE-1/2 or EAGLE-3 head folder or hub id (default: the shipped head for the default model)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA if available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--freq-table", default=None, help="token-frequency table for static/hybrid")
    p.add_argument("--no-pack", action="store_true",
                   help="fp32 CPU: keep PyTorch's default linear kernel instead of oneDNN pre-packed weights")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    """One flag per run option of the table (`options.OPTIONS`), with its type, bounds, help and
    default; an option whose default depends on the device is left None here and filled by
    `_fill_defaults` once the device is known."""
    for opt in OPTIONS.values():
        if opt.cli == "none":
            continue
        flag = f"--{opt.name.replace('_', '-')}"
        default = None if opt.per_device else opt.default
        if opt.cli == "flag":
            p.add_argument(flag, action="store_true", help=f"{opt.help} (default: off)")
        elif opt.cli == "switch":
            p.add_argument(flag, choices=("on", "off", "both"), default=None if default is None else _on_off(default),
                           help=f"{opt.help} (default: {_default_text(opt, _on_off)}); compare takes 'both' and "
                                "runs each")
        elif opt.cli == "list":
            p.add_argument(flag, type=_value_list(opt), default=None if default is None else [default],
                           metavar="N[,N...]",
                           help=f"{opt.help}; {opt.allowed()} (default: {_default_text(opt)}); compare and sweep "
                                "take a comma-separated list and run each")
        else:
            p.add_argument(flag, type=_value(opt), default=default, metavar=_metavar(opt),
                           help=f"{opt.help}; {opt.allowed()} (default: {_default_text(opt)})")


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def _default_text(opt: Option, show=str) -> str:
    if not opt.per_device:
        return show(opt.default)
    return f"{show(opt.default)} on a CPU, {show(opt.cuda)} on a GPU"


def _metavar(opt: Option) -> str:
    return "{" + ",".join(map(str, opt.choices)) + "}" if opt.choices else {int: "N", float: "X"}.get(opt.type, "V")


def _value(opt: Option):
    """argparse `type` for one option: parse the text, then check it against the table's bounds, so a
    bad value is an argparse error naming the flag and what is allowed."""
    def parse(text: str):
        if opt.nullable and text.strip().lower() == "none":
            return None
        try:
            value = opt.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{opt.name} must be {opt.allowed()}; got {text!r}") from None
        try:
            opt.check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    return parse


def _value_list(opt: Option):
    """argparse `type` for a comma-separated list of one option's values ('0,4,10')."""
    one = _value(opt)

    def parse(text: str) -> list:
        values = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value for {opt.name}, e.g. 0,4")
        return values
    return parse


def _fill_defaults(a, device) -> None:
    """Run options whose default depends on the device and that the command line left unset take
    `run_defaults(device)` (the others have their default from the parser)."""
    defaults = run_defaults(device)
    for opt in OPTIONS.values():
        if opt.cli == "none" or not opt.per_device or getattr(a, opt.name) is not None:
            continue
        value = defaults[opt.name]
        setattr(a, opt.name, [value] if opt.cli == "list" else _on_off(value) if opt.cli == "switch" else value)


def _decode_options(a) -> dict:
    """The run's flat options from the parsed flags (filled by `_fill_defaults`): a list's first value
    (compare and sweep run the others as rows of their own), a switch's 'on' as True."""
    out = {}
    for opt in OPTIONS.values():
        if opt.cli == "none":
            continue
        value = getattr(a, opt.name)
        out[opt.name] = value[0] if opt.cli == "list" else value == "on" if opt.cli == "switch" else value
    return out


def _load(a):
    from nanospec.pair import load_pair
    engine, info = load_pair(a.model, a.head, device=a.device, dtype=a.dtype, freq_table=a.freq_table,
                             progress=_progress_bar(), pack_linears=not a.no_pack)
    return engine, info


def _read_prompts(path: str | None, split: str | None) -> list:
    from nanospec.data.prompts import load_prompts, prompt_input
    return [prompt_input(item) for item in load_prompts(path, split=split)]


def _prompt_items(a, own_split: str | None = None) -> list[dict]:
    """The prompts a benchmark command runs: `--prompts` (every line, unless `--split` is given) or the
    project's set (`--split`, else `own_split`), cut to `--limit`. None left is an error that says why."""
    from nanospec.data.prompts import load_prompts
    split = a.split if a.split is not None or a.prompts is not None else own_split
    items = load_prompts(a.prompts, split=split)
    if not items:
        where = a.prompts or "the project's prompt set"
        splits = sorted({str(item.get("split")) for item in load_prompts(a.prompts)})
        raise ValueError(f"no prompts to run: {where} has no prompt with split {split!r} (its splits: "
                         f"{', '.join(splits) or 'none'}); drop --split to run every prompt of the file")
    return items[: a.limit or None]


def cmd_generate(a) -> int:
    if a.copy_branch and len(a.copy_branch) > 1:
        raise ValueError("generate takes one --copy-branch value")
    if a.budget == "both":
        raise ValueError("generate takes --budget on or off ('both' is for compare)")
    engine, info = _load(a)
    _fill_defaults(a, engine.device)  # options left unset: this device's run defaults
    prompt = a.prompt if a.prompt is not None else _read_prompts(a.prompts, None)[0]
    cfg = GenerationConfig.build(a.method, **_decode_options(a))
    run = engine.stream(prompt, cfg)
    printed = []
    for event in run:
        printed.extend(event.tokens)
        if a.stream:
            print(engine.tokenizer.decode(event.tokens, skip_special_tokens=True), end="", flush=True)
    s = run.summary
    print(("\n" if a.stream else "") + ("" if a.stream else s.text))
    print(f"\n[{info.target} + {info.head_family or 'no'} head | {a.method} | {info.device}] {s.new_tokens} tokens in {s.wall_s:.2f} s = "
          f"{s.tokens_per_s:.2f} tok/s, tau {s.tau:.2f}, mean active {s.mean_active:.0f} "
          f"({100 * s.active_frac:.2f}% of V), coverage "
          f"{'-' if s.coverage is None else f'{100 * s.coverage:.1f}%'}, draft {s.draft_ms_per_step:.2f} ms/step, "
          f"stop: {s.stop_reason}", file=sys.stderr)
    if s.stop_reason == "context_limit":
        from nanospec.events import stop_message
        print(f"note: {stop_message(s.stop_reason, engine.max_context)}", file=sys.stderr)
    if a.trace:
        from nanospec.events import save_trace
        save_trace(a.trace, run.events, s, meta={"target": info.target, "config": cfg.to_dict()})
    return 0


def cmd_compare(a) -> int:
    from nanospec.bench.compare import by_category, compare, format_by_category, format_table, peak_memory_mb, resident_split_mb
    from nanospec.data.prompts import prompt_input
    from nanospec.pair import missing_before_load
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"--methods: unknown {bad}; allowed: {', '.join(METHODS)}")
    items = _prompt_items(a)  # read once: messages and categories
    methods = _skip(methods, missing_before_load(methods, a.model, a.head, a.freq_table))  # before loading
    peer = _peer_before_load(a)
    engine, info = _load(a)
    _fill_defaults(a, engine.device)  # options left unset: this device's run defaults
    methods = _skip(methods, {m: engine.missing_for(m) for m in methods if engine.missing_for(m)})
    prompts = [prompt_input(item) for item in items]
    categories = [item.get("category", "-") for item in items]
    options = _decode_options(a)
    table = compare(engine, prompts, methods, options, prompt_lookup=a.prompt_lookup,
                    progress=_prompt_progress, repeat=a.repeat, copy_branches=a.copy_branches,
                    budgets=(False, True) if a.budget == "both" else (), peer=_peer_runner(peer, a, engine, info),
                    hf_generate=a.hf_generate)
    print(file=sys.stderr)
    print(f"target {info.target} (V={info.vocab_size}, H={info.hidden_size}) | head {info.head} ({info.head_family}) | "
          f"device {info.device} {info.dtype} | {len(prompts)} prompts x {a.repeat} | "
          f"max_new_tokens {a.max_new_tokens} | tree depth {a.depth} top_k {a.top_k} total {a.total_tokens} | "
          f"temperature {a.temperature} | copy branch "
          f"{','.join(map(str, a.copy_branches or [options['copy_branch']]))} (ngram {a.copy_ngram})")
    print(format_table(table))
    for row in table:
        if row.get("budget_share"):
            print(f"{row['method']}: the draft budget's own time is {100 * row['budget_share']:.1f}% of a step")
    _print_trust(table)
    _print_peer(peer, table)
    if len(set(categories)) > 1:
        print("\nby prompt category:")
        print(format_by_category(by_category(table, categories), [r["method"] for r in table if r["method"] != "ar"]))
    print(f"peak memory (RSS): {peak_memory_mb():.0f} MB")
    split = resident_split_mb()
    if split:
        print(f"resident now: {split['rss']:.0f} MB = {split['anon']:.0f} MB anonymous + {split['file']:.0f} MB "
              "file-backed (mostly the model's safetensors, mapped by transformers: page cache, reclaimable)")
    return _save_and_check(table, a)


def _peer_before_load(a):
    """`--peer`, checked before this engine loads: the peer, or None when none was asked for or vLLM
    cannot run from `--vllm-python` (missing, too old): then one line says why and compare goes on."""
    if not a.peer:
        return None
    from nanospec.bench.peers import VllmPeer, default_python, parse_peers
    specs = parse_peers(a.peer)
    if a.temperature != 0:
        raise ValueError("--peer compares greedy outputs token for token: it needs --temperature 0, "
                         f"not {a.temperature}")
    peer = VllmPeer(specs, a.vllm_python or default_python())
    if not peer.check():
        print(peer.failure_lines()[0], file=sys.stderr)
        return None
    return peer


def _peer_runner(peer, a, engine, info):
    """compare's `peer`: the prompts' token ids -> the peer's runs on this pair's target and head."""
    if peer is None:
        return None
    from nanospec.bench.peers.vllm_peer import peer_target

    target = peer_target(engine, info, a.max_new_tokens)
    return lambda ids: peer.run(target, ids)


def _print_peer(peer, table: list[dict]) -> None:
    """Under the table: a line per peer kind that failed, and how the peer's rows were measured."""
    if peer is None:
        return
    for line in peer.failure_lines():
        print(line)
    rows = [r for r in table if r.get("peer")]
    if rows:
        p = rows[0]["peer"]
        own = [f"{r['method']} {r['peer']['speedup_vs_own_plain']:.2f}x" for r in rows
               if r["peer"]["kind"] != "plain" and r["peer"]["speedup_vs_own_plain"] is not None]
        print(f"{', '.join(r['method'] for r in rows)}: vLLM {p['vllm']} on {p['device']}, {p['threads']} threads, "
              "in a child process after this engine's rows (not interleaved); speedup is against this engine's ar"
              + (f"; against vLLM's own plain: {', '.join(own)}" if own else ""))


def _print_trust(table: list[dict]) -> None:
    """Under the table: a warning line per row whose timings cannot be trusted (bench.compare.assess_trust)."""
    from nanospec.bench.compare import trust_warnings
    for line in trust_warnings(table):
        print(line)


def _skip(methods: list[str], missing: dict[str, str]) -> list[str]:
    """`methods` less those in `missing`, each skipped with its reason printed."""
    for method, reason in missing.items():
        print(f"skipping {method}: {reason}", file=sys.stderr)
    return [m for m in methods if m not in missing]


def _prompt_progress(i: int, n: int) -> None:
    print(f"\r  prompt {i}/{n}", end="", file=sys.stderr, flush=True)


def _save_and_check(table: list[dict], a) -> int:
    """Write `--json`; exit code 1 if a speculative method's greedy output differs from ar in a way that
    the target's precision does not explain (any difference in fp32; in bf16/fp16 one that is not a
    near-tie: see precision.py)."""
    from nanospec.bench.compare import OUTSIDE_ROWS, exactness_notes
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=2))
    notes = exactness_notes(table)
    if notes:
        print("\n".join(notes), file=sys.stderr)
    if a.temperature == 0 and any(r.get("exactness") == "differs" for r in table
                                  if r["method"] not in OUTSIDE_ROWS and not r.get("peer")):  # outside: reported only
        print("ERROR: a speculative method's output differs from autoregressive decoding", file=sys.stderr)
        return 1
    return 0


def cmd_sweep(a) -> int:
    from nanospec.bench.compare import format_table, parse_tree_settings, sweep
    if a.budget == "both":
        raise ValueError("sweep takes --budget on or off ('both' is for compare)")
    engine, info = _load(a)
    _fill_defaults(a, engine.device)  # options left unset: this device's run defaults
    trees = parse_tree_settings(a.trees)
    from nanospec.data.prompts import prompt_input
    prompts = [prompt_input(item) for item in _prompt_items(a, own_split="heldout")]
    table = sweep(engine, prompts, a.method, trees, _decode_options(a), progress=_prompt_progress, repeat=a.repeat,
                  copy_branches=a.copy_branches)
    print(file=sys.stderr)
    print(f"target {info.target} | head {info.head} | device {info.device} {info.dtype} | {len(prompts)} prompts "
          f"x {a.repeat} | max_new_tokens {a.max_new_tokens} | {a.method} at depth x top_k x total_tokens")
    print(format_table(table))
    for row in table:
        if row.get("budget_share"):
            print(f"{row['method']}: the draft budget's own time is {100 * row['budget_share']:.1f}% of a step")
    _print_trust(table)
    return _save_and_check(table, a)


def cmd_random_pair(a) -> int:
    from nanospec.bench.random_pair import write_random_pair
    target, head = write_random_pair(a.out, a.vocab, a.hidden, a.layers, config_like=a.config_like, seed=a.seed)
    print(f"target: {target}\nhead:   {head}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nanospec", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text and print the run summary")
    _add_model_args(g)
    _add_decode_args(g)
    g.add_argument("prompt", nargs="?", default=None, help="prompt text (default: first prompt of --prompts)")
    g.add_argument("--prompts", default=None, help="JSONL prompts file")
    g.add_argument("--method", default=OPTIONS["method"].default, choices=METHODS, help=OPTIONS["method"].help)
    g.add_argument("--stream", action="store_true", help="print tokens as each step emits them")
    g.add_argument("--trace", default=None, help="save the run's trace (.json or .csv)")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("compare", help="same prompts through every method; a table of speed and acceptance")
    _add_model_args(c)
    _add_decode_args(c)
    c.add_argument("--prompts", default=None, help="JSONL prompts (default: the project's prompt set)")
    c.add_argument("--split", default=None, choices=["train", "heldout"], help="prompt split")
    c.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    c.add_argument("--methods", default=",".join(METHODS))
    c.add_argument("--prompt-lookup", type=int, default=0, metavar="N",
                   help="also run transformers' prompt-lookup decoding with N tokens (outside reference)")
    c.add_argument("--hf-generate", action="store_true",
                   help="also time transformers' own greedy generate() on the same model (outside reference for ar)")
    c.add_argument("--repeat", type=int, default=1)
    c.add_argument("--json", default=None, help="write the table as JSON")
    c.add_argument("--peer", default=None, metavar="vllm:KIND[,...]",
                   help="also run the prompts through vLLM in a child process (greedy, batch 1, same target): "
                        "vllm:plain, vllm:ngram, vllm:eagle (this pair's head), vllm:nanospec (that head with NanoSpec's "
                        "active vocabulary inside vLLM); vllm:eagle:N drafts N tokens; "
                        "see docs/serving.md")
    c.add_argument("--vllm-python", default=None, metavar="PATH",
                   help="python of the environment that has vLLM (default: $NANOSPEC_VLLM_PYTHON, else this one)")
    c.set_defaults(func=cmd_compare)

    w = sub.add_parser("sweep", help="one method at several tree sizes against ar (tune the tree for a machine)")
    _add_model_args(w)
    _add_decode_args(w)
    w.add_argument("--trees", default="3x4x12,4x6x24,5x8x32", help="depth x top_k x total_tokens, comma-separated")
    w.add_argument("--method", default="nanospec", choices=[m for m in METHODS if m != "ar"])
    w.add_argument("--prompts", default=None, help="JSONL prompts (default: the project's prompt set)")
    w.add_argument("--split", default=None, choices=["train", "heldout"],
                   help="prompt split (default: heldout of the project's set; every prompt of a --prompts file)")
    w.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    w.add_argument("--repeat", type=int, default=1)
    w.add_argument("--json", default=None, help="write the table as JSON")
    w.set_defaults(func=cmd_sweep)

    r = sub.add_parser("random-pair", help="write a random-weight target folder and a matching head folder")
    r.add_argument("out")
    r.add_argument("--vocab", type=int, required=True)
    r.add_argument("--hidden", type=int, required=True)
    r.add_argument("--layers", type=int, required=True)
    r.add_argument("--config-like", default=None, help="copy other config fields from this folder or hub id")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=cmd_random_pair)

    for name, text in (("train-head", "train the draft head for the default target"),
                       ("freq-table", "build the token-frequency table"),
                       ("record-lesson", "record the lesson's traces"),
                       ("gpu-bench", "per-step costs of every method at Llama-3 shapes on a GPU")):
        sub.add_parser(name, help=f"{text} (options: python -m nanospec {name} --help)")
    return ap


FORWARDED = {"train-head": "training.train_head", "freq-table": "data.freq_table", "record-lesson": "lesson.record",
             "gpu-bench": "bench.gpu_bench"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FORWARDED:  # these scripts parse their own options
        import importlib
        return importlib.import_module(f"nanospec.{FORWARDED[argv[0]]}").main(argv[1:])
    args = build_parser().parse_args(argv)
    # compare and sweep run each --copy-branch length given as its own row; none given: one row per
    # method at the device's default length
    args.copy_branches = tuple(getattr(args, "copy_branch", None) or ())
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
