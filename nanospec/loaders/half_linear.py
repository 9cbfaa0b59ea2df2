"""Half-precision CPU linears whose one-row result is the row's result in any batch.

A verification forward feeds a tree of several rows; plain decoding (`ar`) feeds one. For speculation
to reproduce `ar` token for token, a row's logits must not depend on how many rows come with it. In
fp32 the engine's kernels keep that (cpu_linear.py); in bf16 and fp16 PyTorch's CPU `F.linear` sends
one row to a matrix-vector kernel whose summation order differs from the matrix kernel's (seen on an
AMD EPYC with AVX-512 BF16 and no AMX, for the MLP's down projection, K = 1536), while any count of
two or more rows gives the same bits per row. So a single row is
computed as two copies of itself, on the same kernel as a tree; at these shapes two rows cost what
one does (`python -m nanospec.loaders.half_linear` checks and times it on this machine).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanospec.loaders.cpu_linear import LinearView, one_row_in_copies, replace_linears

HALF = (torch.bfloat16, torch.float16)


def needs_row_stable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype in HALF


class RowStableLinear(LinearView):
    """`nn.Linear` whose single rows go through the several-row kernel (see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features:
            return F.linear(x, self.weight, self.bias)
        return one_row_in_copies(lambda rows: F.linear(rows, self.weight, self.bias), x, self.out_features)


def stabilize_linears(module: nn.Module) -> int:
    """Replace, in place, every half-precision CPU `nn.Linear` below `module` with a `RowStableLinear`;
    returns how many were replaced. Idempotent; a no-op in fp32 and off the CPU."""
    return replace_linears(module, needs_row_stable, RowStableLinear)


def rows_differing(out_features: int, in_features: int, dtype: torch.dtype, stable: bool, trials: int = 10,
                   max_rows: int = 24, seed: int = 0) -> int:
    """How many rows differ between a batch of M rows (M = 2..max_rows) and the row alone, for
    PyTorch's `F.linear` (stable=False) or a `RowStableLinear` (stable=True)."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    linear = _with_weight(w) if stable else (lambda x: F.linear(x, w))
    bad = 0
    for _ in range(trials):
        x = torch.randn(max_rows, in_features, generator=gen).to(dtype)
        one = torch.cat([linear(x[i:i + 1]) for i in range(max_rows)])
        for m in range(2, max_rows + 1):
            bad += int((linear(x[:m]) != one[:m]).any(1).sum())
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--shapes", default="576x576,1536x576,576x1536,49152x576", help="OUTxIN,... (default pair's)")
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)

    print(f"{a.dtype} on the CPU ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads")
    print(f"{'shape':>12} {'F.linear rows differing':>24} {'row-stable differing':>21} {'1 row ms':>9} {'2 rows ms':>10}")
    for shape in a.shapes.split(","):
        out_f, in_f = (int(v) for v in shape.split("x"))
        plain = rows_differing(out_f, in_f, dtype, stable=False)
        fixed = rows_differing(out_f, in_f, dtype, stable=True)
        w = torch.randn(out_f, in_f).to(dtype)
        t1, t2 = (_time_ms(F.linear, torch.randn(m, in_f).to(dtype), w) for m in (1, 2))
        print(f"{shape:>12} {plain:>24} {fixed:>21} {t1:>9.3f} {t2:>10.3f}")
    return 0


def _with_weight(w: torch.Tensor) -> RowStableLinear:
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(w, requires_grad=False)
    return RowStableLinear(linear)


def _time_ms(fn, x: torch.Tensor, w: torch.Tensor, calls: int = 200) -> float:
    for _ in range(20):
        fn(x, w)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x, w)
    return (time.perf_counter() - t0) / calls * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
