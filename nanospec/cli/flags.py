"""The command line's flags: the model flags, and one flag per run option of the table
(`options.OPTIONS`) with its type, bounds, help and default, so a new option touches one place."""

from __future__ import annotations

import argparse

from nanospec.options import OPTIONS, Option


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="hub id or local folder (default: offline SmolLM2-135M-Instruct)")
    p.add_argument("--head", default=None,
                   help="EAGLE-1/2 or EAGLE-3 head folder or hub id (default: the shipped head for the default model)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA if available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--freq-table", default=None, help="token-frequency table for static/hybrid")
    p.add_argument("--no-pack", action="store_true",
                   help="fp32 CPU: keep PyTorch's default linear kernel instead of oneDNN pre-packed weights")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """One flag per run option of the table; an option whose default depends on the device is left
    None here and filled once the device is known (`nanospec.__main__._fill_defaults`)."""
    for opt in OPTIONS.values():
        if opt.cli == "none":
            continue
        flag = f"--{opt.name.replace('_', '-')}"
        default = None if opt.per_device else opt.default
        if opt.cli == "flag":
            p.add_argument(flag, action="store_true", help=f"{opt.help} (default: off)")
        elif opt.cli == "switch":
            p.add_argument(flag, choices=("on", "off", "both"), default=None if default is None else on_off(default),
                           help=f"{opt.help} (default: {default_text(opt, on_off)}); compare takes 'both' and "
                                "runs each")
        elif opt.cli == "list":
            p.add_argument(flag, type=value_list(opt), default=None if default is None else [default],
                           metavar="N[,N...]",
                           help=f"{opt.help}; {opt.allowed()} (default: {default_text(opt)}); compare and sweep "
                                "take a comma-separated list and run each")
        else:
            p.add_argument(flag, type=value(opt), default=default, metavar=metavar(opt),
                           help=f"{opt.help}; {opt.allowed()} (default: {default_text(opt)})")


def add_args(p: argparse.ArgumentParser, args: tuple) -> None:
    """A subcommand's own arguments: ((flag, ...), argparse keywords) each."""
    for names, kwargs in args:
        p.add_argument(*names, **kwargs)


def on_off(value: bool) -> str:
    return "on" if value else "off"


def default_text(opt: Option, show=str) -> str:
    if not opt.per_device:
        return show(opt.default)
    return f"{show(opt.default)} on a CPU, {show(opt.cuda)} on a GPU"


def metavar(opt: Option) -> str:
    return "{" + ",".join(map(str, opt.choices)) + "}" if opt.choices else {int: "N", float: "X"}.get(opt.type, "V")


def value(opt: Option):
    """argparse `type` for one option: parse the text, then check it against the table's bounds, so a
    bad value is an argparse error naming the flag and what is allowed."""
    def parse(text: str):
        if opt.nullable and text.strip().lower() == "none":
            return None
        try:
            parsed = opt.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{opt.name} must be {opt.allowed()}; got {text!r}") from None
        try:
            opt.check(parsed)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return parsed
    return parse


def value_list(opt: Option):
    """argparse `type` for a comma-separated list of one option's values ('0,4,10')."""
    one = value(opt)

    def parse(text: str) -> list:
        values = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value for {opt.name}, e.g. 0,4")
        return values
    return parse
