"""Linear layers with weights pre-packed once: the fast fp32 CPU path for decoding.

PyTorch's default fp32 `F.linear` on CPU goes to MKL's sgemm, which re-packs the weight on every
call. For the few rows a verification tree or a draft level feeds (4 to ~24), that repacking
dominates the matmul; a weight packed once avoids it. Two packed kernels exist in PyTorch's CPU build:
MKL's packed sgemm (`torch.ops.mkl._mkl_linear`, what Inductor's freezing uses) and oneDNN's
(`torch.ops.mkldnn._linear_pointwise`). MKL's is the one used where it exists: on an Intel Xeon with
AVX-512 it was 1.1-1.2x faster than oneDNN's at 4-16 rows, its per-call overhead is lower, and a row's
result does not depend on how many rows come with it there. That last property is probed once
(`mkl_rows_stable`): on an AMD EPYC it failed, and there oneDNN's kernel is used.

A single row (a plain decoding step, a one-token drafter update) goes where its bits match the rows of a
verified tree, so that `ar` and verification agree exactly and `ar` gets the fastest one-row path:
- with MKL's kernel, to `F.linear` (MKL's sgemm), as fast or faster at one row on the Xeons measured;
- with oneDNN's, to the packed kernel: alone where its one-row path gives a row the bits its several-row
  path does at that layer's shape (`onednn_one_row_stable`, probed once per shape: so on an AMD EPYC with
  AVX2 only, where plain decoding ran 1.14x faster than with copies), else as four copies of itself: on an
  AMD EPYC where oneDNN's one-row path summed the MLP's down projection (576 x 1536) in another order,
  while any count of two or more rows gives a row the same bits (`F.linear` also gives a row other bits
  than oneDNN's several rows). Four, not two: there oneDNN was slower below four rows; plain decoding of
  one prompt (96 tokens, two runs each) ran at 17.6-17.9 tok/s with four copies, 15.0-15.6 with two and
  14.9-15.1 on `F.linear`.
`python -m nanospec.loaders.cpu_linear` measures the kernels on this machine (docs/benchmarks.md,
"Linear kernels", has runs).

`pack_linears(module)` swaps every `nn.Linear` inside a module for a `PackedLinear` that keeps the
original weight (so code that reads `.weight` -- tied embeddings, the drafter's LM-head rows --
sees the same tensor) and adds the packed copy. Only fp32 on an x86-64 CPU, only where the ops exist,
and only for inference: with autograd recording it falls back to `F.linear`. Results equal
`F.linear`'s up to float rounding (a different summation order), like any change of BLAS kernel.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN's packed-weight linear ops, on x86-64 (where it was measured;
    on Arm, e.g. Apple silicon, PyTorch's default BLAS path is left alone)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ones(4, 8)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8), packed, None, "none", [], "")
        return bool(torch.allclose(y, torch.full((2, 4), 8.0)))
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def mkl_packed_available() -> bool:
    """True when this torch build has MKL's packed sgemm (`torch.ops.mkl._mkl_linear`) on x86-64 and it
    computes a small product right."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkl.is_available():
        return False
    try:
        w = torch.ones(4, 8)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 2)
        y = torch.ops.mkl._mkl_linear(torch.ones(2, 8), packed, w, None, 2)
        return bool(torch.allclose(y, torch.full((2, 4), 8.0)))
    except (AttributeError, RuntimeError):
        return False


def packed_kernel() -> str:
    """The kernel several rows go to: MKL's packed sgemm where it exists and is row-stable, else oneDNN's
    (override for a measurement with NANOSPEC_PACKED_KERNEL=onednn, or =mkl where MKL's exists)."""
    choice = os.environ.get("NANOSPEC_PACKED_KERNEL", "")
    if choice == "onednn" or not mkl_packed_available():
        return "onednn"
    return "mkl" if choice == "mkl" or mkl_rows_stable() else "onednn"


def _same_bits_at_any_row_count(rows, singles: tuple[int, ...] = ()) -> bool:
    """The row-stability probe both packed kernels share: `rows(n, start)` is the kernel's output for rows
    start..start+n of a fixed 24-row input; True when the first n rows (n = 2, 3, 4, 9, 16) and each row
    of `singles` alone get the bits they get among all 24."""
    with torch.inference_mode():
        full = rows(24, 0)
        return (all(torch.equal(rows(1, i), full[i:i + 1]) for i in singles)
                and all(torch.equal(rows(n, 0), full[:n]) for n in (2, 3, 4, 9, 16)))


@functools.cache
def mkl_rows_stable() -> bool:
    """Whether MKL's packed sgemm gives a row the same bits at any row count on this CPU (true on the Intel
    Xeons measured; not on an AMD EPYC, where oneDNN's packed kernel is used instead). Probed once."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(1536, 576, generator=gen), torch.randn(24, 576, generator=gen)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 16)
    return _same_bits_at_any_row_count(
        lambda n, start: torch.ops.mkl._mkl_linear(x[start:start + n], packed, w, None, n))


_ONE_ROW_STABLE: dict[tuple[int, int, bool], bool] = {}  # (out, in, bias) -> the probe's answer


def onednn_one_row_stable(out_features: int, in_features: int, bias: bool = False,
                          packed: torch.Tensor | None = None, bias_values: torch.Tensor | None = None) -> bool:
    """Whether oneDNN's packed kernel gives a single row the bits it gives that row among 2..24 rows, at this
    weight shape on this CPU (the kernel's path depends on the shape and the CPU's instructions, not on the
    values). Probed once per shape on random rows, with the layer's own packed weight when given (else a
    random one); a few rows alone suffice, as the path does not depend on which."""
    key = (out_features, in_features, bool(bias))
    if key not in _ONE_ROW_STABLE:
        gen = torch.Generator().manual_seed(0)
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(torch.rand(out_features, in_features, generator=gen) - 0.5,
                                                              None)
            bias_values = torch.randn(out_features, generator=gen) if bias else None
        x = torch.randn(24, in_features, generator=gen)
        def rows(n: int, start: int) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x[start:start + n], packed, bias_values, "none", [], "")
        _ONE_ROW_STABLE[key] = _same_bits_at_any_row_count(rows, singles=(0, 5, 23))
    return _ONE_ROW_STABLE[key]


def one_row_copies(out_features: int, in_features: int, bias: bool = False, packed: torch.Tensor | None = None,
                   bias_values: torch.Tensor | None = None) -> int:
    """How many copies of a single row go to oneDNN's packed kernel at this shape: 1 (the row alone) where
    that gives it a verified tree's bits, else `ONE_ROW_COPIES` (module doc). NANOSPEC_ONE_ROW_COPIES=N sets
    N for a measurement (N = 4 where the probe says 1: what the engine did before the probe)."""
    forced = os.environ.get("NANOSPEC_ONE_ROW_COPIES", "")
    if forced:
        return max(1, int(forced))
    return 1 if onednn_one_row_stable(out_features, in_features, bias, packed, bias_values) else ONE_ROW_COPIES


def kernel_summary(packed: int, device: torch.device | str = "cpu", model: nn.Module | None = None) -> str:
    """One line saying which linear kernels decoding runs on (what the engine logs once, and benchmarks print);
    `model`: the packed target, whose layers say how one row goes (`one_row_mode`)."""
    if torch.device(device).type != "cpu" or not packed:
        return "linears: PyTorch's default kernel for every row count"
    if packed_kernel() == "mkl":
        return f"linears: one row on PyTorch's F.linear, several rows on MKL's packed sgemm ({packed} layers packed)"
    return (f"linears: every row count on oneDNN's packed kernel, one row {one_row_mode(model)} "
            f"({packed} layers packed)")


def one_row_mode(model: nn.Module | None) -> str:
    """How a single row goes to oneDNN's kernel in `model`'s packed layers (what a cost curve's key and the
    kernel line record): 'alone', or 'as N copies' where any layer sends copies (module doc)."""
    layers = model.modules() if model is not None else ()
    copies = max((m.copies for m in layers if isinstance(m, PackedLinear)), default=1)
    return "alone" if copies == 1 else f"as {copies} copies"


def can_pack(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_linear_available()


class LinearView(nn.Module):
    """Base of the inference linears that stand in for an `nn.Linear`: the same weight and bias objects,
    so tied weights stay tied and code reading `.weight` sees the original tensor."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: tied weights stay tied
        self.bias = linear.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def one_row_in_copies(linear, x: torch.Tensor, out_features: int, copies: int = 2) -> torch.Tensor:
    """`linear` of the single row `x` ([.., in] with one row), computed on `copies` copies of it: for kernels
    whose one-row path sums in another order than their several-row path."""
    rows = x.reshape(1, x.shape[-1]).expand(copies, x.shape[-1]).contiguous()
    return linear(rows)[:1].reshape(*x.shape[:-1], out_features)


ONE_ROW_COPIES = 4  # how many copies of a single row go to oneDNN's packed kernel (module doc)


class PackedLinear(LinearView):
    """`nn.Linear` for inference with its weight also held in the packed layout of `packed_kernel()` (MKL's
    or oneDNN's); a single row goes as the module doc says."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.kernel = packed_kernel()
        with torch.no_grad():
            w = linear.weight.detach()
            if self.kernel == "mkl":  # MKL's packed format does not depend on the row count it is called with
                packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 16)
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.copies = 1 if self.kernel == "mkl" else one_row_copies(
            self.out_features, self.in_features, self.bias is not None, packed,
            None if self.bias is None else self.bias.detach())

    @classmethod
    def from_rows(cls, rows: torch.Tensor) -> "PackedLinear":
        """x -> x @ rows.T for a fixed [R, H] matrix (e.g. a fixed set of LM-head rows)."""
        linear = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
        linear.weight = nn.Parameter(rows.detach(), requires_grad=False)
        return cls(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)  # the packed op has no backward
        if x.numel() != self.in_features:
            return self.packed(x)
        if self.kernel == "mkl":
            return F.linear(x, self.weight, self.bias)  # one row: MKL's sgemm, as fast or faster (module doc)
        if self.copies == 1:  # one row on oneDNN, alone where that gives it a verified tree's bits (module doc)
            return self.packed(x)
        # else as copies of itself, so it gets the bits it gets in a verified tree (module doc)
        return one_row_in_copies(self.packed, x, self.out_features, self.copies)

    def packed(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T + b on the packed weight, whatever the number of rows (inference only)."""
        lead = x.shape[:-1]
        bias = None if self.bias is None else self.bias.detach()
        rows = x.reshape(-1, self.in_features)                                  # [N, in]
        if self.kernel == "mkl":
            y = torch.ops.mkl._mkl_linear(rows, self.packed_weight, self.weight.detach(), bias, rows.shape[0])
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, bias, "none", [], "")  # [N, out]
        return y.reshape(*lead, self.out_features)


def replace_linears(module: nn.Module, wanted, make) -> int:
    """Replace, in place, every `nn.Linear` below `module` (its descendants, not `module` itself) whose
    weight passes `wanted(weight)` with `make(linear)`; returns how many were replaced."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            if wanted(child.weight):
                setattr(module, name, make(child))
                count += 1
        else:
            count += replace_linears(child, wanted, make)
    return count


def pack_linears(module: nn.Module) -> int:
    """Every fp32 CPU `nn.Linear` below `module` as a `PackedLinear`; returns how many were replaced.
    Idempotent; a no-op elsewhere."""
    return replace_linears(module, can_pack, PackedLinear)


def _sweep_ms(calls, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    for call in calls:
        call(x)
    return 1000 * (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nanospec.loaders.cpu_linear", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30, help="distinct weights per sweep (so they stream from memory)")
    ap.add_argument("--shape", default="1536x576", help="out x in features of each weight")
    ap.add_argument("--rows", default="1,4,12,24", help="rows per call")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    if not onednn_linear_available():
        raise SystemExit("this torch build has no oneDNN packed linear; nothing to compare")
    out_f, in_f = (int(s) for s in a.shape.split("x"))
    torch.manual_seed(0)
    plain = [nn.Linear(in_f, out_f, bias=False).eval() for _ in range(a.layers)]
    kernels = {"F.linear": plain}
    chosen = os.environ.get("NANOSPEC_PACKED_KERNEL")
    for name in ("mkl", "onednn") if mkl_packed_available() else ("onednn",):
        os.environ["NANOSPEC_PACKED_KERNEL"] = name
        kernels[name] = [PackedLinear(layer).packed for layer in plain]  # the packed kernel itself, one row included
    if chosen is None:
        os.environ.pop("NANOSPEC_PACKED_KERNEL", None)
    else:
        os.environ["NANOSPEC_PACKED_KERNEL"] = chosen
    kernels["engine"] = [PackedLinear(layer) for layer in plain]  # what decoding runs: one row as the module doc says
    print(f"{a.layers} x {out_f}x{in_f} fp32 weights ({a.layers * out_f * in_f * 4 / 1e6:.0f} MB), "
          f"{torch.get_num_threads()} threads; median ms per sweep over {a.repeats} interleaved repeats")
    with torch.inference_mode():
        for rows in (int(r) for r in a.rows.split(",")):
            x = torch.randn(rows, in_f)
            times = {name: [] for name in kernels}
            for _ in range(a.repeats):  # interleaved, so machine noise hits every kernel alike
                for name, calls in kernels.items():
                    times[name].append(_sweep_ms(calls, x))
            med = {name: statistics.median(v) for name, v in times.items()}
            print(f"  {rows:3d} rows: " + "   ".join(f"{name} {ms:7.2f} ms" for name, ms in med.items())
                  + "   ratio to F.linear " + " ".join(f"{med[n] / med['F.linear']:.2f}" for n in med if n != "F.linear"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
