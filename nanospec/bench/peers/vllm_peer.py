"""vLLM as an outside peer in `compare` (parent side): the same prompts, same target, greedy, batch 1.

vLLM runs in a child process, started with the interpreter of the environment that has it
(`--vllm-python`; vLLM's CPU build pins its own torch and transformers, so it usually lives in a
virtual environment of its own). The child (`vllm_worker.py`) gets the prompts as this engine's
token ids, so both engines see exactly the same input, and answers with each prompt's output ids,
wall time and vLLM's draft counters. Its memory and threads stay out of this engine's figures:
the peer runs after this engine's rows, one child per kind:

- `vllm:plain`  vLLM without speculation;
- `vllm:ngram`  vLLM's n-gram (prompt-lookup) speculation;
- `vllm:eagle`  vLLM's EAGLE drafting with this pair's own head (EAGLE-1/2, or EAGLE-3 as `eagle3`);
- `vllm:nanospec`  the same EAGLE drafting with NanoSpec's per-request active vocabulary inside vLLM
  (`nanospec/serving/vllm_plugin.py`, installed in the child): its rows add mean active size and coverage.

A kind may take the number of drafted tokens: `vllm:eagle:5` (default `DEFAULT_SPEC_TOKENS`).
Nothing here imports vLLM; a missing, too old or failing vLLM ends as one line in `error` (the
whole peer) or in `failures` (one kind), never as an exception out of `compare`. `run(..., stop=event)`
ends the running child when the event is set (the app's Stop).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ENGINE = "vllm"
KINDS = ("plain", "ngram", "eagle", "nanospec")
DEFAULT_SPEC_TOKENS = 3
MIN_VERSION = (0, 32)  # the oldest vLLM this peer was run with (the CPU build 0.32.0)
PYTHON_ENV = "NANOSPEC_VLLM_PYTHON"  # default for --vllm-python
WORKER = Path(__file__).with_name("vllm_worker.py")
PROBE_TIMEOUT_S = 60
START_TIMEOUT_S = 900  # import, load and warm-up of one child, on a slow shared CPU
KV_CACHE_BYTES = 1 << 30  # batch 1 needs little; vLLM's default would reserve 90% of memory
POLL_S = 0.2  # how often a running child is checked for a stop request


@dataclass(frozen=True)
class PeerSpec:
    kind: str
    num_speculative_tokens: int = DEFAULT_SPEC_TOKENS

    @property
    def name(self) -> str:
        return f"{ENGINE}:{self.kind}"


def parse_peers(text: str) -> list[PeerSpec]:
    """'vllm:plain,vllm:ngram,vllm:eagle:5' -> [PeerSpec, ...]; ValueError naming what is allowed."""
    allowed = ", ".join(f"{ENGINE}:{k}" for k in KINDS)
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        engine, _, rest = part.partition(":")
        kind, _, n = rest.partition(":")
        if engine != ENGINE or kind not in KINDS or (n and not (n.isdigit() and int(n) >= 1)) \
                or (n and kind == "plain"):
            raise ValueError(f"--peer: unknown {part!r}; allowed: {allowed} (a speculative kind may end in "
                             f":N drafted tokens, e.g. {ENGINE}:eagle:5)")
        spec = PeerSpec(kind, int(n) if n else DEFAULT_SPEC_TOKENS)
        if spec not in out:
            out.append(spec)
    if not out:
        raise ValueError(f"--peer: expected at least one of {allowed}")
    return out


def default_python() -> str:
    """`$NANOSPEC_VLLM_PYTHON` if set, else this interpreter."""
    return os.environ.get(PYTHON_ENV) or sys.executable


@dataclass
class Probe:
    python: str
    version: str | None = None
    preload: list[str] = field(default_factory=list)
    error: str | None = None  # one line: why vLLM cannot run from `python`


def probe(python: str) -> Probe:
    """Ask `python` (without importing vLLM: under a second) whether it has a vLLM this peer supports."""
    try:
        done = subprocess.run([python, str(WORKER), "--probe"], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        info = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as err:
        return Probe(python, error=f"cannot run {python}: {_one_line(str(err))}")
    if info is None:
        return Probe(python, error=f"{python} failed: {_last_line(done.stderr)}")
    found = Probe(python, version=info.get("vllm"), preload=info.get("preload") or [])
    if found.version is None:
        found.error = (f"vLLM is not installed for {python} (see docs/serving.md; --vllm-python or "
                       f"${PYTHON_ENV} picks another environment's interpreter)")
    elif _version_tuple(found.version) < MIN_VERSION:
        found.error = (f"vLLM {found.version} at {python} is older than "
                       f"{'.'.join(map(str, MIN_VERSION))}, the oldest this peer supports")
    return found


@dataclass
class PeerRun:
    """One kind's outputs and timings, one entry per prompt, in prompt order."""
    spec: PeerSpec
    outputs: list[list[int]]
    tokens_per_s: list[float]
    taus: list[float]  # per prompt: tokens per target forward (1.0 without speculation)
    tau: float  # pooled over every prompt's steps
    info: dict  # version, settings, load time, draft counters, notes

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class PeerTarget:
    """What this engine runs, for the peer to run the same: the target (a folder, or a hub id vLLM
    fetches itself), the head, dtype, max new tokens, stop ids and CPU threads."""
    model: str
    head: str | None
    head_family: str | None  # "eagle" (EAGLE-1/2) or "eagle3"
    dtype: str
    max_new_tokens: int
    stop_token_ids: list[int]
    threads: int


def peer_target(engine, info, max_new_tokens: int) -> PeerTarget:
    """What a loaded pair (`SpecEngine`, `PairInfo`) runs, for the peer: the child runs in a temporary
    folder, so local folders go by absolute path and hub ids as they are; the same CPU threads."""
    import torch

    def local(name):
        return name if name is None or not Path(name).exists() else str(Path(name).resolve())

    return PeerTarget(model=local(str(engine.model.name_or_path)), head=local(info.head),
                      head_family=info.head_family, dtype=info.dtype, max_new_tokens=max_new_tokens,
                      stop_token_ids=sorted(engine.eos_token_ids), threads=torch.get_num_threads())


class VllmPeer:
    """The `compare` peer: `check()` before loading this engine, then `run(target, prompt_ids)`."""

    def __init__(self, specs: list[PeerSpec], python: str):
        self.specs, self.python = specs, python
        self.found: Probe | None = None
        self.error: str | None = None  # one line: why no kind can run (vLLM missing, too old)
        self.failures: dict[str, str] = {}  # kind name -> one line: why it did not start or finish

    def check(self) -> bool:
        """Probe the interpreter; False (and `error` set) when vLLM cannot run from it."""
        self.found = probe(self.python)
        self.error = self.found.error
        return self.error is None

    def run(self, target: PeerTarget, prompt_ids: list[list[int]],
            stop: threading.Event | None = None) -> list[PeerRun]:
        """Every kind on every prompt, one child process per kind; kinds that fail go to `failures`.
        Setting `stop` ends the running child and skips the kinds after it (each noted as stopped)."""
        if (self.found is None and not self.check()) or self.error:
            return []
        runs = []
        for spec in self.specs:
            why = unsupported(spec, target)
            if why is None and stop is not None and stop.is_set():
                why = "stopped"
            if why is not None:
                self.failures[spec.name] = why
                continue
            try:
                runs.append(self._run(spec, target, prompt_ids, stop))
            except PeerFailed as err:
                self.failures[spec.name] = str(err)
        _add_speedup_vs_plain(runs)
        return runs

    def failure_lines(self) -> list[str]:
        """What to print: one line for the whole peer, or one per failed kind (one if all failed alike)."""
        if self.error:
            return [f"{ENGINE} peer skipped: {self.error}"]
        reasons = set(self.failures.values())
        if len(self.failures) > 1 and len(reasons) == 1 and len(self.failures) == len(self.specs):
            return [f"{ENGINE} peer failed to start ({', '.join(self.failures)}): {reasons.pop()}"]
        return [f"{name} failed: {why}" for name, why in self.failures.items()]

    def _request(self, spec: PeerSpec, target: PeerTarget, prompt_ids: list[list[int]]) -> dict:
        kind = "eagle" if spec.kind == "nanospec" else spec.kind
        if kind == "eagle" and target.head_family == "eagle3":
            kind = "eagle3"
        longest = max((len(p) for p in prompt_ids), default=0)
        return {"model": target.model, "dtype": target.dtype, "kind": kind, "head": target.head,
                "active_vocab": spec.kind == "nanospec",
                "num_speculative_tokens": spec.num_speculative_tokens, "prompts": prompt_ids,
                "max_new_tokens": target.max_new_tokens, "stop_token_ids": sorted(target.stop_token_ids),
                "max_model_len": longest + target.max_new_tokens + spec.num_speculative_tokens + 64,
                "kv_cache_bytes": KV_CACHE_BYTES}

    def _run(self, spec: PeerSpec, target: PeerTarget, prompt_ids: list[list[int]],
             stop: threading.Event | None = None) -> PeerRun:
        env = {**os.environ, "OMP_NUM_THREADS": str(target.threads)}  # the same threads as this engine
        env["NANOSPEC_VLLM_ACTIVE_VOCAB"] = "1" if spec.kind == "nanospec" else "0"  # the plugin, where installed
        preload = [p for p in (self.found.preload if self.found else []) if p not in env.get("LD_PRELOAD", "")]
        if preload:  # vLLM's CPU build: Intel OpenMP preloaded, as its install guide asks
            env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [env.get("LD_PRELOAD")])])
        timeout = START_TIMEOUT_S + len(prompt_ids) * target.max_new_tokens
        with tempfile.TemporaryDirectory(prefix="nanospec-vllm-") as tmp:
            request, result, log = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "worker.log")
            request.write_text(json.dumps(self._request(spec, target, prompt_ids)))
            try:
                with log.open("w") as out:
                    child = subprocess.Popen([self.python, str(WORKER), str(request), str(result)], stdout=out,
                                             stderr=subprocess.STDOUT, env=env, cwd=tmp)
            except OSError as err:
                raise PeerFailed(f"cannot run {self.python}: {_one_line(str(err))}") from None
            returncode = _wait(child, timeout, stop)
            if returncode is None:
                raise PeerFailed("stopped" if stop is not None and stop.is_set()
                                 else f"no answer within {timeout} s") from None
            if returncode != 0 or not result.is_file():
                raise PeerFailed(f"exit status {returncode}: {_last_line(log.read_text(errors='replace'))}")
            return _peer_run(spec, json.loads(result.read_text()))


class PeerFailed(Exception):
    pass


def unsupported(spec: PeerSpec, target: PeerTarget) -> str | None:
    """Why `spec` cannot run on `target` (one line), or None."""
    if spec.kind in ("eagle", "nanospec") and target.head is None:
        return "needs a draft head; this pair has none"
    return None


def _wait(child: subprocess.Popen, timeout: float, stop: threading.Event | None) -> int | None:
    """The child's exit status; None after killing it when `timeout` passed or `stop` was set."""
    end = time.monotonic() + timeout
    while True:
        try:
            return child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if time.monotonic() > end or (stop is not None and stop.is_set()):
                child.kill()
                child.wait()
                return None


def _peer_run(spec: PeerSpec, result: dict) -> PeerRun:
    prompts = result["prompts"]
    outputs = [p["output"] for p in prompts]
    tps = [len(p["output"]) / p["wall_s"] if p["wall_s"] > 0 else float("nan") for p in prompts]
    decoded = [max(len(p["output"]) - 1, 0) for p in prompts]  # the first token comes from prefill
    accepted = [p["accepted"] for p in prompts]
    draft_tokens = sum(p["draft_tokens"] for p in prompts)
    info = {k: v for k, v in result.items() if k != "prompts"}
    vocab = result.get("vocab") or {}  # the NanoSpec plugin's figures (kind "nanospec")
    info.update(engine=ENGINE, kind=spec.kind, mean_active=vocab.get("mean_active"), coverage=vocab.get("coverage"),
                num_speculative_tokens=None if spec.kind == "plain" else spec.num_speculative_tokens,
                drafts=sum(p["drafts"] for p in prompts), draft_tokens=draft_tokens, accepted=sum(accepted),
                acceptance_rate=sum(accepted) / draft_tokens if draft_tokens else None)
    taus = [_tau(d, a) for d, a in zip(decoded, accepted)]
    return PeerRun(spec, outputs, tps, taus, _tau(sum(decoded), sum(accepted)), info)


def _tau(decoded: float, accepted: float) -> float:
    """Tokens per target forward after prefill, as this engine counts τ: every decode step emits its
    accepted draft tokens plus one of the target's own, so `decoded - accepted` steps emitted `decoded`
    tokens (1.0 without speculation; NaN when nothing was decoded)."""
    steps = decoded - accepted
    return decoded / steps if steps > 0 else float("nan")


def _add_speedup_vs_plain(runs: list[PeerRun]) -> None:
    """Each run's median per-prompt tokens/s ratio to `vllm:plain`, when that ran too (same engine)."""
    plain = next((r for r in runs if r.spec.kind == "plain"), None)
    for run in runs:
        ratios = [a / b for a, b in zip(run.tokens_per_s, plain.tokens_per_s) if b > 0] if plain else []
        run.info["speedup_vs_own_plain"] = statistics.median(ratios) if ratios else None


def _version_tuple(version: str) -> tuple[int, ...]:
    """'0.32.0' -> (0, 32, 0); '0.10.1rc1+cpu' -> (0, 10, 1)."""
    return tuple(int(m.group()) for m in map(re.compile(r"\d+").match, version.split("+")[0].split(".")[:3]) if m)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _last_line(log: str) -> str:
    """The error a log ends with: its last traceback line that names an exception, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit", "Interrupt")) and " " not in head:
            return _one_line(line)
    return _one_line(lines[-1]) if lines else "(no output)"
