"""Rotary tables that stay fp32 in a head cast to bf16 or fp16.

transformers computes a rotary embedding's `inv_freq` (and `original_inv_freq`) in fp32, but a
module-wide `.to(torch.bfloat16)` casts every floating buffer. In bf16 `inv_freq` keeps 8 bits of
mantissa, so the angle `position * inv_freq` at position ~1,000 is off by up to ~1.8 rad (theta
5e5): the head would see positions wrongly at the lengths it is used at. Both draft heads
(`head.EagleHead`, `head3.Eagle3Head`) inherit this guard.
"""

from __future__ import annotations

import torch
from torch import nn


class Fp32RotaryModule(nn.Module):
    """An `nn.Module` whose `rotary_emb` buffers follow the module's device but never its dtype."""

    rotary_emb: nn.Module

    def _apply(self, fn, recurse=True):
        # .to() / .half() / .bfloat16() / .cuda() all land here: move the rotary buffers, never cast them
        kept = {name: buf.float() for name, buf in self.rotary_emb.named_buffers(recurse=False)}
        super()._apply(fn, recurse)
        for name, fp32 in kept.items():
            moved = getattr(self.rotary_emb, name)
            setattr(self.rotary_emb, name, fp32.to(device=moved.device))
        return self


def rotary_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every rotary buffer of `module` and its submodules, by name (for checks)."""
    return {name: buf for name, buf in module.named_buffers() if "rotary_emb." in name}
