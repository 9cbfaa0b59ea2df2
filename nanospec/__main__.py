"""Command line: `python -m nanospec {generate,compare,sweep,random-pair,train-head,freq-table,record-lesson,gpu-bench}`.

Every subcommand is a row of `SUBCOMMANDS`; the ones that run the engine get the model flags and one
flag per run option of the table (`cli/flags.py`), and print through one report printer (`cli/report.py`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from nanospec.cli import report
from nanospec.cli.flags import add_args, add_model_args, add_run_options, on_off
from nanospec.config import GenerationConfig
from nanospec.options import METHODS, OPTIONS, run_defaults


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


def _fill_defaults(a, device) -> None:
    """Run options whose default depends on the device and that the command line left unset take
    `run_defaults(device)` (the others have their default from the parser)."""
    defaults = run_defaults(device)
    for opt in OPTIONS.values():
        if opt.cli == "none" or not opt.per_device or getattr(a, opt.name) is not None:
            continue
        value = defaults[opt.name]
        setattr(a, opt.name, [value] if opt.cli == "list" else on_off(value) if opt.cli == "switch" else value)


def _variants(a) -> dict[str, tuple]:
    """The list options given more than one value ({name: values}): compare and sweep run each
    combination as a row of its own; generate refuses them."""
    return {o.name: tuple(getattr(a, o.name)) for o in OPTIONS.values()
            if o.cli == "list" and getattr(a, o.name, None) is not None and len(getattr(a, o.name)) > 1}


def _list_values(a) -> str:
    """The header's words for the list options: 'copy branch 0,10 | retrieval nodes 0'."""
    return " | ".join(f"{o.name.replace('_', ' ')} {','.join(map(str, getattr(a, o.name)))}"
                      for o in OPTIONS.values() if o.cli == "list")


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


def _stock_model(a, info):
    """`--hf-generate stock`: the target loaded again as transformers loads it (no packed linears, fused
    norms or tree attention), on the same device and dtype; otherwise None."""
    if a.hf_generate != "stock":
        return None
    from nanospec.loaders.loading import load_target
    return load_target(a.model, device=info.device, dtype=info.dtype).model


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
    from nanospec.data.prompts import load_prompts, prompt_input
    if varied := _variants(a):
        raise ValueError("generate takes one " + " and one ".join(f"--{n.replace('_', '-')} value" for n in varied))
    if a.budget == "both":
        raise ValueError("generate takes --budget on or off ('both' is for compare)")
    engine, info = _load(a)
    _fill_defaults(a, engine.device)  # options left unset: this device's run defaults
    prompt = a.prompt if a.prompt is not None else prompt_input(load_prompts(a.prompts)[0])
    cfg = GenerationConfig.build(a.method, **_decode_options(a))
    run = engine.stream(prompt, cfg)
    for event in run:
        if a.stream:
            print(engine.tokenizer.decode(event.tokens, skip_special_tokens=True), end="", flush=True)
    s = run.summary
    report.print_run(info, a.method, s, a.stream)
    if s.stop_reason == "context_limit":
        from nanospec.events import stop_message
        print(f"note: {stop_message(s.stop_reason, engine.max_context)}", file=sys.stderr)
    if a.trace:
        from nanospec.events import save_trace
        save_trace(a.trace, run.events, s, meta={"target": info.target, "config": cfg.to_dict()})
    return 0


def cmd_compare(a) -> int:
    from nanospec.bench.compare import compare
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
    options = _decode_options(a)
    table = compare(engine, prompts, methods, options, prompt_lookup=a.prompt_lookup,
                    progress=_prompt_progress, repeat=a.repeat, variants=_variants(a),
                    budgets=(False, True) if a.budget == "both" else (), peer=_peer_runner(peer, a, engine, info),
                    hf_generate=a.hf_generate is not None, hf_model=_stock_model(a, info))
    report.print_table(
        f"target {info.target} (V={info.vocab_size}, H={info.hidden_size}) | head {info.head} ({info.head_family}) | "
        f"device {info.device} {info.dtype} | {len(prompts)} prompts x {a.repeat} | "
        f"max_new_tokens {a.max_new_tokens} | tree depth {a.depth} top_k {a.top_k} total {a.total_tokens} | "
        f"temperature {a.temperature} | {_list_values(a)} | copy ngram {a.copy_ngram}", table)
    report.print_peer(peer, table)
    report.print_categories_and_memory(table, [item.get("category", "-") for item in items])
    return report.save_and_check(table, a.json, a.temperature)


def cmd_sweep(a) -> int:
    from nanospec.bench.compare import parse_tree_settings, sweep
    from nanospec.data.prompts import prompt_input
    if a.budget == "both":
        raise ValueError("sweep takes --budget on or off ('both' is for compare)")
    engine, info = _load(a)
    _fill_defaults(a, engine.device)  # options left unset: this device's run defaults
    trees = parse_tree_settings(a.trees)
    prompts = [prompt_input(item) for item in _prompt_items(a, own_split="heldout")]
    table = sweep(engine, prompts, a.method, trees, _decode_options(a), progress=_prompt_progress, repeat=a.repeat,
                  variants=_variants(a))
    report.print_table(
        f"target {info.target} | head {info.head} | device {info.device} {info.dtype} | {len(prompts)} prompts "
        f"x {a.repeat} | max_new_tokens {a.max_new_tokens} | {a.method} at depth x top_k x total_tokens", table)
    return report.save_and_check(table, a.json, a.temperature)


def cmd_random_pair(a) -> int:
    from nanospec.bench.random_pair import write_random_pair
    target, head = write_random_pair(a.out, a.vocab, a.hidden, a.layers, config_like=a.config_like, seed=a.seed)
    print(f"target: {target}\nhead:   {head}")
    return 0


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


def _skip(methods: list[str], missing: dict[str, str]) -> list[str]:
    """`methods` less those in `missing`, each skipped with its reason printed."""
    for method, reason in missing.items():
        print(f"skipping {method}: {reason}", file=sys.stderr)
    return [m for m in methods if m not in missing]


def _prompt_progress(i: int, n: int) -> None:
    print(f"\r  prompt {i}/{n}", end="", file=sys.stderr, flush=True)


# -- the subcommands ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    run: Callable | None = None  # None: a script of its own (`forward`), which parses its own options
    args: tuple = ()             # ((flag, ...), argparse keywords): its own arguments
    run_options: bool = False    # the model flags and one flag per run option of the table
    forward: str = ""            # the module whose main() runs it, under nanospec.


def _arg(*names, **kwargs) -> tuple:
    return names, kwargs


PROMPTS = _arg("--prompts", default=None, help="JSONL prompts (default: the project's prompt set)")
LIMIT = _arg("--limit", type=int, default=0, help="use only the first N prompts")
REPEAT = _arg("--repeat", type=int, default=1)
JSON = _arg("--json", default=None, help="write the table as JSON")

SUBCOMMANDS = (
    Subcommand("generate", "generate text and print the run summary", cmd_generate, run_options=True, args=(
        _arg("prompt", nargs="?", default=None, help="prompt text (default: first prompt of --prompts)"),
        _arg("--prompts", default=None, help="JSONL prompts file"),
        _arg("--method", default=OPTIONS["method"].default, choices=METHODS, help=OPTIONS["method"].help),
        _arg("--stream", action="store_true", help="print tokens as each step emits them"),
        _arg("--trace", default=None, help="save the run's trace (.json or .csv)"))),
    Subcommand("compare", "same prompts through every method; a table of speed and acceptance", cmd_compare,
               run_options=True, args=(
        PROMPTS, _arg("--split", default=None, choices=["train", "heldout"], help="prompt split"), LIMIT,
        _arg("--methods", default=",".join(METHODS)),
        _arg("--prompt-lookup", type=int, default=0, metavar="N",
             help="also run transformers' prompt-lookup decoding with N tokens (outside reference)"),
        _arg("--hf-generate", nargs="?", const="stock", default=None, choices=("stock", "engine"),
             help="also time transformers' own greedy generate() (outside reference for ar): on a second copy "
                  "of the target as transformers loads it ('stock', the default) or on the engine's own model, "
                  "its kernels included ('engine')"),
        REPEAT, JSON,
        _arg("--peer", default=None, metavar="vllm:KIND[,...]",
             help="also run the prompts through vLLM in a child process (greedy, batch 1, same target): "
                  "vllm:plain, vllm:ngram, vllm:eagle (this pair's head), vllm:nanospec (that head with NanoSpec's "
                  "active vocabulary inside vLLM); vllm:eagle:N drafts N tokens; see docs/serving.md"),
        _arg("--vllm-python", default=None, metavar="PATH",
             help="python of the environment that has vLLM (default: $NANOSPEC_VLLM_PYTHON, else this one)"))),
    Subcommand("sweep", "one method at several tree sizes against ar (tune the tree for a machine)", cmd_sweep,
               run_options=True, args=(
        _arg("--trees", default="3x4x12,4x6x24,5x8x32", help="depth x top_k x total_tokens, comma-separated"),
        _arg("--method", default="nanospec", choices=[m for m in METHODS if m != "ar"]), PROMPTS,
        _arg("--split", default=None, choices=["train", "heldout"],
             help="prompt split (default: heldout of the project's set; every prompt of a --prompts file)"),
        LIMIT, REPEAT, JSON)),
    Subcommand("random-pair", "write a random-weight target folder and a matching head folder", cmd_random_pair,
               args=(_arg("out"), _arg("--vocab", type=int, required=True), _arg("--hidden", type=int, required=True),
                     _arg("--layers", type=int, required=True),
                     _arg("--config-like", default=None, help="copy other config fields from this folder or hub id"),
                     _arg("--seed", type=int, default=0))),
    Subcommand("train-head", "train the draft head for the default target", forward="training.train_head"),
    Subcommand("freq-table", "build the token-frequency table", forward="data.freq_table"),
    Subcommand("record-lesson", "record the lesson's traces", forward="lesson.record"),
    Subcommand("gpu-bench", "per-step costs of every method at Llama-3 shapes on a GPU", forward="bench.gpu_bench"),
)
FORWARDED = {c.name: c.forward for c in SUBCOMMANDS if c.forward}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nanospec", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        if command.forward:
            sub.add_parser(command.name, help=f"{command.help} (options: python -m nanospec {command.name} --help)")
            continue
        p = sub.add_parser(command.name, help=command.help)
        if command.run_options:
            add_model_args(p)
            add_run_options(p)
        add_args(p, command.args)
        p.set_defaults(func=command.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FORWARDED:  # these scripts parse their own options
        import importlib
        return importlib.import_module(f"nanospec.{FORWARDED[argv[0]]}").main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
