"""The target's cost curve for the draft budget: its forward time by verified tokens, measured once
per pair and device and cached.

c(n) is the median ms of one target forward over n tokens after `CONTEXT` cached ones, at every size
from 1 to the largest tree (not assumed to be a line: some sizes cost less or more than the average
on some devices). It is cached as JSON under the model cache's `cost/`, one file per pair and device
kind; the rest of its key (dtype, threads, torch, kernels, `CURVE_VERSION`) is checked inside. A
missing, stale or malformed file is measured again with a log line, and a curve measured while the
machine was busy is used but not cached. `budget.DraftBudget` prices nodes with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nanospec.decoding.attention import attention_name
from nanospec.loaders.cpu_linear import one_row_mode, packed_kernel
from nanospec.timing import MIN_CPU_SHARE, metered

log = logging.getLogger(__name__)

CURVE_VERSION = 4  # 4: several rows on MKL packed sgemm, tree attention without KV copies, buffered KV cache; 3: one-row linears on MKL (cpu_linear.py); 2: every size from 1 to the largest tree; 1: powers of two
CONTEXT = 256          # cached positions before the verified tokens when the curve is measured
REPEATS = 5
BUSY_CHECK_S = 0.2     # a measurement shorter than this is too short to judge the machine's load by


@dataclass
class CostCurve:
    """Median ms of one target forward over n tokens (after `CONTEXT` cached ones), per size."""

    sizes: list[int]
    ms: list[float]
    key: dict

    @property
    def per_token_ms(self) -> float:
        """The marginal cost of one more verified token: the least-squares slope of ms against
        size (noise in single medians would make differences of neighbours meaningless), >= 0."""
        n, x, y = len(self.sizes), self.sizes, self.ms
        mx, my = sum(x) / n, sum(y) / n
        var = sum((a - mx) ** 2 for a in x)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / var if var else 0.0
        return max(slope, 0.0)

    @property
    def one_token_ms(self) -> float:
        return self.ms_at(1)

    def ms_at(self, n: int) -> float:
        """The forward's ms over n tokens: the measured median at a measured size, linear between two
        measured sizes, and past the largest one the slope `per_token_ms` on from there."""
        pts = sorted(zip(self.sizes, self.ms))
        if n <= pts[0][0]:
            return pts[0][1]
        for (s0, m0), (s1, m1) in zip(pts, pts[1:]):
            if n <= s1:
                return m0 + (m1 - m0) * (n - s0) / (s1 - s0)
        return pts[-1][1] + self.per_token_ms * (n - pts[-1][0])

    def extra_ms(self, t: int) -> list[float]:
        """[t]: how much longer than a plain step (one token) a verification of 1 + k tokens takes, k = 0..t-1,
        from the closest curve that never falls (isotonic least squares over every measured size):
        neighbouring medians differ by noise, and more tokens never take less time."""
        times = monotone([self.ms_at(n) for n in range(1, max(t, max(self.sizes)) + 1)])
        return [m - times[0] for m in times[:t]]

    def describe(self) -> str:
        points = ", ".join(f"{s}: {m:.1f}" for s, m in zip(self.sizes, self.ms))
        return (f"target forward ms by verified tokens ({points}); {self.per_token_ms:.2f} ms per extra "
                f"token on {self.key.get('device', '?')}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        sizes, ms, key = d["sizes"], d["ms"], d["key"]
        if (not isinstance(sizes, list) or not isinstance(ms, list) or len(sizes) != len(ms) or len(sizes) < 2
                or not all(isinstance(s, int) and s >= 1 for s in sizes)
                or not all(isinstance(m, (int, float)) and m > 0 for m in ms) or not isinstance(key, dict)):
            raise ValueError("sizes and ms must be lists of the same length (>= 2) of positive numbers")
        return cls([int(s) for s in sizes], [float(m) for m in ms], key)


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent violators)."""
    pools: list[list[float]] = []   # [sum, count] per pool
    for v in values:
        pools.append([v, 1])   # (a count: a Python int)
        while len(pools) > 1 and pools[-2][0] / pools[-2][1] > pools[-1][0] / pools[-1][1]:
            s, c = pools.pop()
            pools[-1][0] += s
            pools[-1][1] += c
    return [s / c for s, c in pools for _ in range(c)]


def curve_key(model, device: torch.device, packed: bool) -> dict:
    """What a cost curve was measured for: another pair, dtype, device, thread count or torch makes it stale."""
    cfg = model.config
    conf = cfg.to_json_string(use_diff=False) if hasattr(cfg, "to_json_string") else repr(cfg)
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"version": CURVE_VERSION, "model": str(getattr(cfg, "_name_or_path", "") or type(model).__name__),
            "config": hashlib.sha256(conf.encode()).hexdigest()[:16], "dtype": str(next(model.parameters()).dtype),
            "device": f"{dev.type}:{name}", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "packed": (packed_kernel() if packed_kernel() == "mkl" else f"onednn, one row {one_row_mode(model)}")
            if packed else False,
            "attention": attention_name(model)}


def curve_sizes(max_nodes: int) -> list[int]:
    """Sizes measured: every size from 1 to the largest tree (at least 16, so the slope has a range).
    Every size, because the curve is not a line on every device (see the module docstring)."""
    return list(range(1, max(16, max_nodes) + 1))


@torch.inference_mode()
def measure_cost_curve(model, device, sizes: list[int], key: dict, context: int = CONTEXT,
                       repeats: int = REPEATS) -> CostCurve:
    """Time the target's forward over each size, interleaved across sizes, median of `repeats`."""
    from nanospec.decoding.kv import crop_cache, new_cache
    from nanospec.timing import sync
    from nanospec.decoding.verify import target_forward

    context = max(1, min(context, int(getattr(model.config, "max_position_embeddings", 1 << 30)) - max(sizes) - 1))
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = new_cache()
    target_forward(model, prefix, torch.arange(context, device=device)[None], cache, with_logits=False)
    top = max(sizes)
    tokens = torch.randint(0, vocab, (1, top), generator=gen).to(device)
    causal = torch.ones(top, top, dtype=torch.bool, device=device).tril()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(repeats + 1):  # the first round warms up
        for n in sizes:
            mask = torch.cat([torch.ones(n, context, dtype=torch.bool, device=device), causal[:n, :n]], 1)[None, None]
            pos = torch.arange(context, context + n, device=device)[None]
            sync(device)
            t0 = time.perf_counter()
            target_forward(model, tokens[:, :n], pos, cache, mask)
            sync(device)
            if rep:
                times[n].append((time.perf_counter() - t0) * 1e3)
            crop_cache(cache, context)
    return CostCurve(list(sizes), [statistics.median(times[n]) for n in sizes], key)


def curve_path(key: dict, root: Path | None = None) -> Path:
    """One file per pair (model and its config) and device kind; the rest of the key is checked inside."""
    if root is None:
        from nanospec.loaders.default_model import cache_root
        root = cache_root()
    ident = hashlib.sha256(f"{key['model']}|{key['config']}|{key['device']}".encode()).hexdigest()[:16]
    return Path(root) / "cost" / f"{ident}.json"


def load_or_measure(model, device, packed: bool, max_nodes: int, root: Path | None = None) -> CostCurve:
    """The cached curve when it matches this pair, device and settings; otherwise measure it (a few
    seconds), say why in a log line, and cache it. A missing, stale or malformed file is never trusted,
    and a curve measured while the machine was busy (on a CPU: this process computed less than
    `MIN_CPU_SHARE` of the time) is used but not cached."""
    key = curve_key(model, device, packed)
    sizes = curve_sizes(max_nodes)
    path = curve_path(key, root)
    why = "none cached"
    if path.exists():
        try:
            curve = CostCurve.from_dict(json.loads(path.read_text()))
            if curve.key != key:
                changed = sorted(k for k in key if curve.key.get(k) != key[k])
                why = f"the cached one is stale ({', '.join(changed)} changed)"
            elif max(curve.sizes) < max(sizes):
                why = f"the cached one stops at {max(curve.sizes)} tokens; trees here reach {max(sizes)}"
            else:
                return curve
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"the cached file {path.name} is unreadable ({exc})"
    log.warning("nanospec: measuring the target's cost curve for the draft budget (%s)", why)
    with metered() as meter:
        curve = measure_cost_curve(model, device, sizes, key)
    if torch.device(device).type == "cpu" and meter.wall_s >= BUSY_CHECK_S and meter.cpu_share < MIN_CPU_SHARE:
        # another job shared the cores: its times are too slow for this machine, so use it for this run only
        log.warning("nanospec: the machine was busy while the cost curve was measured (this process computed "
                    "%.0f%% of the time): used for now, not cached", 100 * meter.cpu_share)
        return curve
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(curve.to_dict(), indent=1))
    except OSError as exc:
        log.warning("nanospec: could not cache the cost curve in %s (%s); it will be measured again", path, exc)
    return curve
