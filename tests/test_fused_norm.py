"""RMS norms on the fused kernel: swapped only where they give the model's own numbers bit for bit."""

from __future__ import annotations

import torch
import torch.nn as nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from nanospec.loaders.fused_norm import FusedRMSNorm, fuse_rms_norms


def test_fused_norm_equals_llama_norm_bit_for_bit():
    torch.manual_seed(0)
    norm = LlamaRMSNorm(96, eps=1e-5)
    norm.weight.data.normal_()
    fused = FusedRMSNorm(norm.weight, norm.variance_epsilon)
    for shape in [(1, 1, 96), (1, 4, 96), (2, 16, 96), (96,)]:
        x = torch.randn(*shape) * 3
        assert torch.equal(norm(x), fused(x))


def test_fusing_a_model_keeps_its_logits_and_weights():
    from nanospec.bench.random_pair import random_target, random_target_config

    cfg = random_target_config(1000, 64, 2, heads=2, kv_heads=1, intermediate=128, max_positions=128)
    model, fused_model = random_target(cfg, seed=0), random_target(cfg, seed=0)  # the shared pair may be packed
    n_norms = sum(type(m).__name__.endswith("RMSNorm") for m in model.modules())
    assert fuse_rms_norms(fused_model) == n_norms > 0
    assert fuse_rms_norms(fused_model) == 0  # idempotent
    assert set(fused_model.state_dict()) == set(model.state_dict())
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(1)).to(next(model.parameters()).device)
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, fused_model(input_ids=ids).logits)


class _OnePlusWeightNorm(LlamaRMSNorm):
    """Another formula (Gemma's scale is 1 + weight): the fused kernel would change its numbers."""

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(var + self.variance_epsilon)) * (1.0 + self.weight)


def test_other_formulas_and_hooked_norms_are_left_alone():
    torch.manual_seed(0)
    other = _OnePlusWeightNorm(32)
    other.weight.data.normal_()
    hooked = LlamaRMSNorm(32)
    hooked.register_forward_hook(lambda *a: None)
    plain = LlamaRMSNorm(32)
    holder = nn.ModuleDict({"other": other, "hooked": hooked, "plain": plain})
    assert fuse_rms_norms(holder) == 1
    assert holder["other"] is other and holder["hooked"] is hooked
    assert isinstance(holder["plain"], FusedRMSNorm) and holder["plain"].weight is plain.weight
