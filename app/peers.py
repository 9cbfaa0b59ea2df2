"""The Compare tab's outside rows: vLLM on the same prompt and target (`nanospec.bench.peers`).

Each chosen kind runs in a child process with the interpreter of the environment that has vLLM
(`$NANOSPEC_VLLM_PYTHON`, else the app's own), after this engine's runs, greedy, one untimed warm-up
each (vLLM's start-up and load are not timed). Whether vLLM can run is probed once per process, without
importing it; the control says so, and a missing vLLM is one line in the verdict, never an error.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator

from nanospec.bench.peers import KINDS, PeerRun, VllmPeer, default_python, parse_peers, peer_target, probe

CHOICES = tuple(f"vllm:{kind}" for kind in KINDS)
STATUS_EVERY_S = 1.0  # how often the verdict line counts the seconds of a running child


@functools.lru_cache(maxsize=None)
def found(python: str) -> tuple[str | None, str | None]:
    """(vLLM's version, None) when vLLM runs from `python`, else (None, why not): probed once per process."""
    result = probe(python)
    return result.version if result.error is None else None, result.error


def control_info() -> tuple[bool, str]:
    """(whether the control is offered, its explanatory line)."""
    version, error = found(default_python())
    if version is None:
        return False, ("vLLM is not installed for this server's python (docs/serving.md says how; "
                       "$NANOSPEC_VLLM_PYTHON names another environment's)")
    return True, (f"vLLM {version}, each kind in its own process after this engine's runs, greedy: start-up takes "
                  "a minute or more on a CPU. vllm:nanospec is vLLM's EAGLE with NanoSpec's active vocabulary.")


def check(chosen) -> list[str]:
    """The chosen kinds in `CHOICES` order; ValueError naming what is allowed."""
    chosen = [chosen] if isinstance(chosen, str) else list(chosen or [])
    bad = [c for c in chosen if c not in CHOICES]
    if bad:
        raise ValueError(f"unknown vLLM rows {bad}; choose from {', '.join(CHOICES)}")
    return [c for c in CHOICES if c in chosen]


def run(chosen: list[str], engine, info, prompt_ids: list[int], max_new_tokens: int,
        stop: threading.Event) -> Iterator[str | tuple[list[PeerRun], list[str]]]:
    """Status lines while the children run, then (runs, failure lines). Setting `stop` (the generator
    closed by the page's Stop) kills the running child."""
    peer = VllmPeer(parse_peers(",".join(chosen)), default_python())
    if not peer.check():
        yield [], peer.failure_lines()
        return
    target = peer_target(engine, info, max_new_tokens)
    out: list[PeerRun] = []
    worker = threading.Thread(target=lambda: out.extend(peer.run(target, [prompt_ids], stop=stop)),
                              name="nanospec-vllm-peer", daemon=True)
    t0 = time.monotonic()
    worker.start()
    while True:  # a line at once, then one every STATUS_EVERY_S
        yield (f"Running {', '.join(f'`{c}`' for c in chosen)} in vLLM's own process: "
               f"{time.monotonic() - t0:.0f} s (start-up and load take a minute or more on a CPU)…")
        worker.join(STATUS_EVERY_S)
        if not worker.is_alive():
            break
    yield out, peer.failure_lines()


def measured_note(runs: list[PeerRun]) -> str:
    """How the vLLM rows were measured (Markdown), or "" without rows."""
    if not runs:
        return ""
    info = runs[0].info
    return (f"vLLM rows: vLLM {info.get('vllm')} on {info.get('device')}, {info.get('threads')} threads, in a child "
            "process after this engine's runs (one untimed warm-up, start-up not timed); speedup is against this "
            "engine's `ar`.")
