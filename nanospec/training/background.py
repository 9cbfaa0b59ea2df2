"""What the long offline jobs (answer generation, training rounds) share: low priority, a graceful stop,
and a command-line parser generated from one config dataclass (every option declared once)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import time
from pathlib import Path


def lower_priority(threads: int) -> int:
    """Run beside other work: niceness 19 (if not already) and `threads` torch threads. Returns the niceness."""
    import torch

    try:
        now = os.nice(0)
        if now < 19:
            now = os.nice(19 - now)
    except OSError:
        now = -1
    torch.set_num_threads(threads)
    return now


class StopFlag:
    """Set by SIGTERM or SIGINT, checked between units of work, so a stopped job first saves what it has.
    (SIGSTOP/SIGCONT, the lead's pause, need nothing: the job just continues.) A second signal exits."""

    def __init__(self):
        self.set = False
        self.reason = ""
        self._old = {}

    def __enter__(self) -> "StopFlag":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame) -> None:
        if self.set:
            raise KeyboardInterrupt
        self.set, self.reason = True, signal.Signals(signum).name


class Deadline:
    """A wall-clock budget in minutes (<= 0: none)."""

    def __init__(self, minutes: float):
        self.end = time.monotonic() + minutes * 60 if minutes > 0 else float("inf")

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def parser_from_dataclass(cls, prog: str, description: str,
                          parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """One ``--flag`` per field of `cls`, with its type, default and ``metadata["help"]``."""
    p = parser or argparse.ArgumentParser(prog=prog, description=description)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str, "bool": bool,
                                                         "Path": Path}.get(str(f.type).split(" ")[0], str)
        help_text = f.metadata.get("help", "") + (f" (default: {default})" if default not in (None, "") else "")
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif f.metadata.get("required"):
            p.add_argument(flag, type=kind, required=True, help=help_text)
        else:
            p.add_argument(flag, type=kind, default=default, help=help_text)
    return p


def config_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
