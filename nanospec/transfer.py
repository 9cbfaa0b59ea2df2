"""The decoding hot path's one door to the host.

Every value the host must read during a decoding step goes through `to_host`, packed into one
copy: a speculative step calls it exactly once (the accepted path, the bonus token, the Ext count
and the tree for the event), an autoregressive step once (its token). On CUDA each call is one
synchronising device->host copy; any other read of a tensor's value (`.item()`, `.tolist()`,
`int(t)`, `bool(t)`, a host->device `torch.tensor(...)`) would be a hidden sync, and a test
checks that the hot-path modules contain none.
"""

from __future__ import annotations

import torch


def to_host(*parts: torch.Tensor) -> list[list]:
    """1-D (or 0-d) tensors on one device -> Python lists, in one copy.

    Integer tensors come back as ints, bool tensors as bools, floats as floats (values pass
    through float64, exact for ids and counts below 2**53)."""
    flat = torch.cat([p.reshape(-1).to(torch.float64) for p in parts]).tolist()
    out, start = [], 0
    for p in parts:
        chunk = flat[start:start + p.numel()]
        start += p.numel()
        if p.dtype == torch.bool:
            chunk = [v != 0 for v in chunk]
        elif not p.is_floating_point():
            chunk = [int(v) for v in chunk]
        out.append(chunk)
    return out
