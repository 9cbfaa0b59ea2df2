"""See on a CPU every operation that would make a CUDA device wait for the host.

A CPU has one memory, so nothing there ever waits, and the CPU build of torch cannot run CUDA
code. What it can do is watch every tensor operation the engine makes and name the ones that,
with the same code on a GPU, would block the host until the device catches up:

- reading a value: ``.item()``, ``.tolist()``, ``.numpy()``, ``int(t)``, ``float(t)``, ``bool(t)``
  or ``if t:`` (all of them reach the aten op ``_local_scalar_dense``, or are Python methods
  watched by name);
- data-dependent shapes: ``nonzero``, ``masked_select``, boolean-mask indexing (``t[mask]``,
  ``t[mask] = v``), ``unique`` and friends: the output size lives on the device;
- host data entering the device: ``torch.tensor(list)`` / ``torch.as_tensor(number)`` and a
  Python scalar written into a tensor (``t[i] = 1.0``), which on CUDA build a CPU tensor and
  copy it with a blocking copy (aten ``lift_fresh`` / ``Tensor.__setitem__`` with a number);
- factory calls without a ``device=``: on a GPU they make a CPU tensor that must then be copied.

Two interception layers, both part of torch: a ``TorchFunctionMode`` sees Python-level calls with
their arguments as written (a missing ``device=``, a number passed to ``__setitem__``) and a
``TorchDispatchMode`` sees every aten op underneath, including those that library code (the
target's own ``transformers`` forward) makes. ``transfer.to_host``, the one allowed door, runs
with the guard paused and is counted as one read per call.

    guard = SyncGuard()
    with guard.watching():
        ...                       # guard.records: every read / wait / would-be sync, in order
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nanospec import transfer

aten = torch.ops.aten
# aten ops whose output size or value the host needs from the device
READ_OPS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}
SHAPE_OPS = {aten.nonzero.default, aten.nonzero_static.default, aten.masked_select.default,
             aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
             aten.repeat_interleave.Tensor}
HOST_DATA_OPS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
# Python-level tensor methods that read values (some never reach the dispatcher on a CPU)
READ_METHODS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__bool__,
                torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__array__,
                torch.Tensor.cpu}
FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.eye, torch.rand,
             torch.randn, torch.randint, torch.linspace, torch.tensor, torch.as_tensor}


@dataclass
class Record:
    kind: str    # "read": a transfer.to_host call (the allowed door); "wait": a timer's event wait;
                 # "sync": anything else that would make the host wait for the device
    what: str
    where: str = ""


@dataclass
class SyncGuard:
    """An ordered record of every allowed read, timer wait and would-be sync, split by `mark()`."""

    records: list[Record] = field(default_factory=list)
    marks: list[tuple[str, int]] = field(default_factory=list)  # (label, len(records) then)
    _paused: bool = False

    def note(self, what: str, kind: str = "sync") -> None:
        if self._paused and kind == "sync":
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "sync_guard" not in f.filename
                  and "/torch/" not in f.filename and "contextlib" not in f.filename]
        where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
        self.records.append(Record(kind, what, where))

    @property
    def syncs(self) -> list[Record]:
        return [r for r in self.records if r.kind == "sync"]

    def mark(self, label: str) -> None:
        """Split the record (e.g. before each decoding step)."""
        self.marks.append((label, len(self.records)))

    def per_mark(self) -> list[tuple[str, list[Record]]]:
        """(label, records) from each mark to the next (or the end)."""
        ends = [i for _, i in self.marks[1:]] + [len(self.records)]
        return [(label, self.records[i:j]) for (label, i), j in zip(self.marks, ends)]

    @contextmanager
    def paused(self):
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    @contextmanager
    def watching(self):
        real_to_host = transfer.to_host

        def to_host(*parts):
            if not self._paused:
                self.note("transfer.to_host", kind="read")
            with self.paused():
                return real_to_host(*parts)

        with mock.patch.object(transfer, "to_host", to_host), _FunctionWatch(self), _DispatchWatch(self):
            yield self


class _Watch:
    """What both interception layers share: the guard they report to."""

    def __init__(self, guard: SyncGuard):
        super().__init__()
        self.guard = guard


def _python_level_sync(func, args, kwargs) -> str | None:
    """What a Python-level call would make a GPU wait for, or None."""
    if func in READ_METHODS:
        return f"{getattr(func, '__name__', func)}() reads a device value"
    if func is torch.Tensor.__setitem__ and len(args) == 3 and not isinstance(args[2], torch.Tensor):
        return f"a Python {type(args[2]).__name__} written into a tensor (a host->device copy)"
    if func in (torch.tensor, torch.as_tensor):
        return None if isinstance(args[0] if args else None, torch.Tensor) else \
            f"{func.__name__}(host data) copies host data to the device"
    if func in FACTORIES and kwargs.get("device") is None:
        return f"{func.__name__}() without device= makes a CPU tensor on a GPU machine"
    return None


class _FunctionWatch(_Watch, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _python_level_sync(func, args, kwargs)
        if what is None:
            return func(*args, **kwargs)
        self.guard.note(what)
        with self.guard.paused():  # one note per call, not one more for the aten ops underneath
            return func(*args, **kwargs)


class _DispatchWatch(_Watch, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g = self.guard
        if func in READ_OPS:
            g.note(f"aten {func.__name__} reads a device value")
        elif func in SHAPE_OPS:
            g.note(f"aten {func.__name__} has a data-dependent output size")
        elif func in HOST_DATA_OPS:
            g.note(f"aten {func.__name__}: a tensor made from host data")
        elif func in INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                       for i in (args[1] if len(args) > 1 else ()) or ()):
            g.note(f"aten {func.__name__} with a boolean mask (data-dependent size)")
        return func(*args, **kwargs)
