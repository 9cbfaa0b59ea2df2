"""Draft heads keep their rotary tables in fp32 when cast to bf16/fp16 (`nanospec/heads/rotary.py`).

A module-wide `.to(torch.bfloat16)` would cast `rotary_emb.inv_freq` (and `original_inv_freq`) too;
in bf16 the angle `position * inv_freq` is then off by up to ~1.8 rad at position ~1,000. Checked
here for every shipped head (found by globbing `assets/heads/`, so a new one is covered) loaded in
bf16 and fp16, and for random heads of both families cast every usual way; a negative control shows
that the same check fails on a plain `LlamaRotaryEmbedding` cast to bf16.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from nanospec.bench.random_pair import random_eagle3_head, random_head, random_target, random_target_config
from nanospec.heads.head import load_head
from nanospec.heads.head3 import is_eagle3_folder, load_eagle3
from nanospec.paths import ASSETS
from nanospec.heads.rotary import rotary_buffers

LOW = (torch.bfloat16, torch.float16)
MIN_POSITIONS = 4096
SHIPPED = sorted(p.parent for p in (ASSETS / "heads").glob("*/config.json"))


# ---- the check -----------------------------------------------------------------------------------


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """A 16-bit float's bits as integers ordered like the values (adjacent values differ by 1)."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dtype == b.dtype and a.dtype in LOW, (a.dtype, b.dtype)
    return (_ordered_bits(a) - _ordered_bits(b)).abs()


def _positions(module: nn.Module) -> torch.Tensor:
    limit = int(getattr(module.rotary_emb, "original_max_seq_len", 0) or 0)
    return torch.arange(max(MIN_POSITIONS, limit))


def check_buffers(module: nn.Module, reference: nn.Module) -> None:
    """Every rotary buffer is fp32 and equals the fp32 reference's."""
    bufs, ref_bufs = rotary_buffers(module), rotary_buffers(reference)
    assert ref_bufs and "rotary_emb.inv_freq" in ref_bufs, sorted(ref_bufs)
    assert sorted(bufs) == sorted(ref_bufs)
    for name, ref in ref_bufs.items():
        assert ref.dtype == torch.float32, f"reference {name} is {ref.dtype}"
        assert bufs[name].dtype == torch.float32, f"{name} is {bufs[name].dtype}, not torch.float32"
        assert torch.equal(bufs[name], ref), f"{name} differs from the fp32 reference"


def check_angles(module: nn.Module, reference: nn.Module) -> None:
    """position * inv_freq equals the fp32 reference's exactly at every position."""
    positions = _positions(reference).float()[:, None]
    angles = positions * module.rotary_emb.inv_freq.float()
    ref_angles = positions * reference.rotary_emb.inv_freq
    worst = float((angles - ref_angles).abs().max())
    assert torch.equal(angles, ref_angles), \
        f"rotary angles off by up to {worst:.3g} rad over positions 0..{positions.shape[0] - 1}"


def check_cos_sin(module: nn.Module, reference: nn.Module) -> None:
    """The cos/sin `rotary_emb` returns for a bf16 (fp16) input are the fp32 reference's cos/sin
    rounded to that dtype (at most 1 ulp away)."""
    position_ids = _positions(reference)[None]
    head_dim = 2 * reference.rotary_emb.inv_freq.numel()
    ref_cos, ref_sin = reference.rotary_emb(torch.zeros(1, 1, head_dim), position_ids)
    assert ref_cos.dtype == torch.float32
    for dtype in LOW:
        cos, sin = module.rotary_emb(torch.zeros(1, 1, head_dim, dtype=dtype), position_ids)
        for got, ref, what in ((cos, ref_cos, "cos"), (sin, ref_sin, "sin")):
            assert got.dtype == dtype, f"{what} came back in {got.dtype} for a {dtype} input"
            ulps = ulp_distance(got, ref.to(dtype))
            assert int(ulps.max()) <= 1, (f"{what} in {dtype} is up to {int(ulps.max())} ulps from the fp32 "
                                         f"{what} rounded ({int((ulps > 0).sum())} of {ulps.numel()} differ)")


def assert_rotary_fp32(module: nn.Module, reference: nn.Module) -> None:
    check_buffers(module, reference)
    check_angles(module, reference)
    check_cos_sin(module, reference)


def _check_cast(head: nn.Module, reference: nn.Module, dtype: torch.dtype) -> None:
    weight = head.fc.weight
    assert weight.dtype == dtype, f"the head was not cast: fc.weight is {weight.dtype}"
    assert reference.fc.weight.dtype == torch.float32
    assert_rotary_fp32(head, reference)


# ---- shipped heads -------------------------------------------------------------------------------


def test_shipped_heads_found():
    names = [p.name for p in SHIPPED]
    assert SHIPPED, f"no head folder under {ASSETS / 'heads'}"
    assert any(is_eagle3_folder(p) for p in SHIPPED) and any(not is_eagle3_folder(p) for p in SHIPPED), names


def _needs_target(folder: Path) -> bool:
    return bool(json.loads((folder / "config.json").read_text()).get("lm_head_from_target"))


def _target_for(folder: Path):
    """The offline default target when it is cached (a ~1 s load), else a random target of the
    shape the head's config names (only its output embedding and config are used)."""
    from nanospec.loaders.default_model import default_model_dir, is_complete

    raw = json.loads((folder / "config.json").read_text())
    cached = default_model_dir()
    if is_complete(cached):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
        c = model.config
        if (c.vocab_size, c.hidden_size, c.num_hidden_layers) == (
                raw["vocab_size"], raw.get("target_hidden_size") or raw["hidden_size"],
                raw.get("num_target_layers") or c.num_hidden_layers):
            return model.eval().requires_grad_(False)
    cfg = random_target_config(raw["vocab_size"], raw.get("target_hidden_size") or raw["hidden_size"],
                               raw.get("num_target_layers") or 30, heads=raw["num_attention_heads"],
                               kv_heads=raw["num_key_value_heads"], intermediate=raw["intermediate_size"],
                               max_positions=raw["max_position_embeddings"])
    cfg.rope_parameters = raw["rope_parameters"]
    return random_target(cfg)


@pytest.fixture(scope="module")
def shipped_targets():
    """One target per shipped head that takes its lm_head from the target (loaded once)."""
    return {folder.name: _target_for(folder) for folder in SHIPPED if _needs_target(folder)}


def _load(folder: Path, dtype: torch.dtype, targets: dict):
    if is_eagle3_folder(folder):
        return load_eagle3(folder, target=targets.get(folder.name), dtype=dtype)
    return load_head(folder, dtype=dtype)


@pytest.mark.parametrize("folder", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_head_keeps_fp32_rotary(folder, shipped_targets):
    reference = _load(folder, torch.float32, shipped_targets)
    for dtype in LOW:
        _check_cast(_load(folder, dtype, shipped_targets), reference, dtype)


# ---- random heads of both families ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_config():
    cfg = random_target_config(32000, 64, 6, heads=2, kv_heads=1, intermediate=128, max_positions=4096)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}  # as gpu_bench.py (Llama-3)
    return cfg


CASTS = {
    "to-bf16": (torch.bfloat16, lambda m: m.to(torch.bfloat16)),
    "bfloat16()": (torch.bfloat16, lambda m: m.bfloat16()),
    "to-cpu-bf16": (torch.bfloat16, lambda m: m.to("cpu", torch.bfloat16)),
    "half()": (torch.float16, lambda m: m.half()),
    "to-dtype-fp16": (torch.float16, lambda m: m.to(dtype=torch.float16)),
    "bf16-then-fp16": (torch.float16, lambda m: m.to(torch.bfloat16).half()),
}
BUILDERS = {"eagle": random_head, "eagle3": random_eagle3_head}


@pytest.mark.parametrize("family", sorted(BUILDERS))
@pytest.mark.parametrize("cast", sorted(CASTS))
def test_random_head_cast_keeps_fp32_rotary(family, cast, tiny_config):
    reference = BUILDERS[family](tiny_config)
    dtype, apply = CASTS[cast]
    head = copy.deepcopy(reference)
    returned = apply(head)
    assert returned is head
    _check_cast(head, reference, dtype)


def test_random_head_built_in_bf16_keeps_fp32_rotary(tiny_config):
    """`random_head(dtype=...)` builds under a bf16 default dtype instead of casting afterwards."""
    _check_cast(random_head(tiny_config, dtype=torch.bfloat16), random_head(tiny_config), torch.bfloat16)


def test_wrapped_head_cast_keeps_fp32_rotary(tiny_config):
    """A cast applied to a module that holds the head still goes through the head's guard."""
    reference = random_eagle3_head(tiny_config)
    holder = nn.ModuleDict({"head": copy.deepcopy(reference)}).to(torch.bfloat16)
    _check_cast(holder["head"], reference, torch.bfloat16)


# ---- negative control ----------------------------------------------------------------------------


class _Bare(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.rotary_emb = LlamaRotaryEmbedding(config)


def test_negative_control_plain_rotary_is_cast(tiny_config):
    from nanospec.heads.head import head_config_from_target

    config = head_config_from_target(tiny_config)
    reference, bare = _Bare(config), _Bare(config).to(torch.bfloat16)
    assert bare.rotary_emb.inv_freq.dtype == torch.bfloat16
    positions = torch.arange(990, 1011).float()[:, None]
    error = (positions * bare.rotary_emb.inv_freq.float() - positions * reference.rotary_emb.inv_freq).abs()
    assert float(error.max()) > 0.1, f"bf16 inv_freq error at position ~1000 only {float(error.max()):.3g} rad"
    # each of the three checks fails on it by itself
    with pytest.raises(AssertionError, match="rotary_emb.inv_freq is torch.bfloat16"):
        check_buffers(bare, reference)
    with pytest.raises(AssertionError, match="rotary angles off"):
        check_angles(bare, reference)
    with pytest.raises(AssertionError, match="ulps from the fp32"):
        check_cos_sin(bare, reference)
