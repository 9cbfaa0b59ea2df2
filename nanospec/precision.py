"""Exactness at low precision: identical outputs, near-ties, and real divergences told apart.

In fp32 (TF32 off) every method's greedy output equals `ar`'s token for token, and any difference
is a bug. In bf16/fp16 a tree forward and a one-token forward run different kernels, so the same
logits differ in their last bits; where the target's two best tokens are that close (a near-tie)
the greedy choice can flip, and from there the outputs part. That is the precision's doing, not
the method's. So a low-precision run reports the share of outputs identical to `ar` and, for each
first divergence, the step, the two tokens and the target's logit margin between them, measured
with one plain forward over the prompt and `ar`'s tokens before that point. A divergence is
explained when the margin is within `NEAR_TIE_ULPS` units of the dtype's spacing at those logits.

    divergence(engine, prompt_ids, output, ar_output, steps) -> Divergence | None
    exactness(divergences, dtype) -> "identical" | "near-tie" | "differs"
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from nanospec.decoding.kv import new_cache
from nanospec.decoding.verify import target_forward

EXACT_DTYPES = (torch.float32, torch.float64)
# how many units of the dtype's spacing two kernels' logits may differ by after a whole forward
# (rounding accumulates over every layer; bf16 keeps 8 bits of mantissa)
NEAR_TIE_ULPS = 8


@dataclass
class Divergence:
    position: int          # index of the first differing generated token
    step: int | None       # the decoding step that emitted it (0 = prefill), when known
    ar_token: int          # what plain decoding emitted there (-1: its output had ended)
    token: int             # what the method emitted there (-1: its output had ended)
    margin: float          # target logit of ar_token minus that of token at that point (nan if either ended)
    resolution: float      # NEAR_TIE_ULPS x the dtype's spacing at those logits
    near_tie: bool         # margin <= resolution in a low-precision dtype

    def describe(self) -> str:
        where = f"step {self.step}, " if self.step is not None else ""
        return (f"first differs at token {self.position} ({where}ar {self.ar_token} vs {self.token}): "
                f"target logit margin {self.margin:.4g} "
                + ("<=" if self.near_tie else ">") + f" {self.resolution:.3g} "
                + ("(a near-tie at this precision)" if self.near_tie else "(not explained by precision)"))

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(output: list[int], ar_output: list[int]) -> int | None:
    """Index of the first differing token, or None when the outputs are equal."""
    for i, (a, b) in enumerate(zip(output, ar_output)):
        if a != b:
            return i
    return None if len(output) == len(ar_output) else min(len(output), len(ar_output))


def spacing(dtype: torch.dtype, magnitude: float) -> float:
    """The gap between neighbouring values of `dtype` around `magnitude`."""
    info = torch.finfo(dtype)
    m = max(abs(magnitude), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(m))


def step_of(position: int, emitted_per_step: list[int] | None) -> int | None:
    """The step (0 = prefill) whose tokens include generated token `position`."""
    if not emitted_per_step:
        return None
    total = 0
    for step, n in enumerate(emitted_per_step):
        total += n
        if position < total:
            return step
    return None


@torch.inference_mode()
def divergence(engine, prompt_ids: list[int], output: list[int], ar_output: list[int],
               emitted_per_step: list[int] | None = None) -> Divergence | None:
    """Where `output` first parts from `ar_output`, and whether the target's margin there is a near-tie."""
    pos = first_difference(output, ar_output)
    if pos is None:
        return None
    step = step_of(pos, emitted_per_step)
    a = ar_output[pos] if pos < len(ar_output) else -1
    b = output[pos] if pos < len(output) else -1
    dtype = engine.model.dtype
    if a < 0 or b < 0:  # one output stopped (EOS) where the other went on: no two tokens to weigh
        return Divergence(pos, step, a, b, float("nan"), 0.0, False)
    ids = torch.tensor([list(prompt_ids) + list(ar_output[:pos])], device=engine.device)
    positions = torch.arange(ids.shape[1], device=engine.device)[None]
    logits = target_forward(engine.model, ids, positions, new_cache()).logits[-1]   # [V] fp32
    la, lb = float(logits[a]), float(logits[b])
    resolution = NEAR_TIE_ULPS * spacing(dtype, max(abs(la), abs(lb)))
    margin = la - lb
    near = dtype not in EXACT_DTYPES and abs(margin) <= resolution
    return Divergence(pos, step, a, b, margin, resolution, near)


def exactness(divergences: list[Divergence | None], dtype: torch.dtype) -> str:
    """'identical' (every output equals ar's), 'near-tie' (every difference is a near-tie of a
    low-precision dtype) or 'differs' (any other difference; in fp32 every difference)."""
    found = [d for d in divergences if d is not None]
    if not found:
        return "identical"
    if dtype in EXACT_DTYPES or not all(d.near_tie for d in found):
        return "differs"
    return "near-tie"
