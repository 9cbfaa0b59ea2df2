"""Stand-in for Hugging Face's `spaces` package (ZeroGPU), for tests: it records every call and fails
on a broken rule.

- `GPU(duration=...)` records the decorated function and, per call, the duration asked for; while a
  decorated function (or its generator) runs, `inside_gpu()` is true in that thread.
- What a decorated function returns or yields must be plain CPU data: no torch tensor, module or
  device anywhere inside (checked recursively through dataclasses, dicts, lists and tuples).
- `guard_model(model)` makes every forward of `model` outside a decorated call fail.
- `guard_cuda_moves()` makes `Module.to("cuda")` off the main thread fail; on the main thread the move
  is recorded (and skipped: these tests run without a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading

import torch

calls: list[dict] = []          # one entry per decorated call: function name, duration, thread
cuda_moves: list[str] = []      # thread names that moved a module to CUDA
violations: list[str] = []
_state = threading.local()


class ZeroGPURuleBroken(AssertionError):
    pass


def inside_gpu() -> bool:
    return getattr(_state, "depth", 0) > 0


def _fail(message: str):
    violations.append(message)
    raise ZeroGPURuleBroken(message)


def _check_plain(value, where: str) -> None:
    if isinstance(value, (torch.Tensor, torch.nn.Module, torch.device, torch.dtype)):
        _fail(f"{where} holds a torch object ({type(value).__name__}); yield plain CPU data only")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _check_plain(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")


def GPU(fn=None, *, duration=60):  # noqa: N802 — the real package's name
    def decorate(func):
        def record(args, kwargs):
            seconds = duration(*args, **kwargs) if callable(duration) else duration
            if not isinstance(seconds, (int, float)) or seconds <= 0:
                _fail(f"{func.__name__}: duration must be a positive number of seconds, got {seconds!r}")
            calls.append({"function": func.__name__, "duration": seconds, "thread": threading.current_thread().name})

        def enter():
            _state.depth = getattr(_state, "depth", 0) + 1

        def leave():
            _state.depth -= 1

        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def gen_wrapper(*args, **kwargs):
                record(args, kwargs)
                inner = func(*args, **kwargs)
                try:
                    while True:
                        enter()
                        try:
                            item = next(inner)
                        except StopIteration:
                            return
                        finally:
                            leave()
                        _check_plain(item, f"{func.__name__} yielded")
                        yield item
                finally:
                    enter()
                    try:
                        inner.close()
                    finally:
                        leave()
            return gen_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            record(args, kwargs)
            enter()
            try:
                result = func(*args, **kwargs)
            finally:
                leave()
            _check_plain(result, f"{func.__name__} returned")
            return result
        return wrapper

    return decorate(fn) if fn is not None else decorate


def guard_model(model: torch.nn.Module):
    """Fail any forward of `model` that runs outside a decorated call; returns the hook handle."""
    def check(module, args):
        if not inside_gpu():
            _fail(f"{type(module).__name__} ran a forward outside a spaces.GPU function")
    return model.register_forward_pre_hook(check)


_original_to = torch.nn.Module.to


def _guarded_to(self, *args, **kwargs):
    device = kwargs.get("device", args[0] if args else None)
    if device is not None and not isinstance(device, torch.dtype) and torch.device(device).type == "cuda":
        if threading.current_thread() is not threading.main_thread():
            _fail(f"{type(self).__name__} moved to CUDA on thread {threading.current_thread().name}, "
                  "not the main thread")
        cuda_moves.append(threading.current_thread().name)
        return self
    return _original_to(self, *args, **kwargs)


def guard_cuda_moves() -> None:
    torch.nn.Module.to = _guarded_to


def reset() -> None:
    calls.clear()
    cuda_moves.clear()
    violations.clear()
    torch.nn.Module.to = _original_to
