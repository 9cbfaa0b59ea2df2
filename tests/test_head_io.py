"""EAGLE-1/2 checkpoint layout: save/load round trip, public-layout key names, missing input norm."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from nanospec.heads.head import load_head, save_head
from nanospec.bench.random_pair import random_head


def test_roundtrip_and_layout(tiny_pair, tmp_path):
    target, head = tiny_pair
    save_head(head, tmp_path / "h", dtype=torch.float16)
    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("input_layernorm" in k for k in keys)          # layer 0 has no input norm
    assert json.loads((tmp_path / "h" / "config.json").read_text())["bias"] is True
    loaded = load_head(tmp_path / "h", target=target, dtype=torch.float32)
    x = torch.randn(1, 3, 64)
    pos = torch.arange(3)[None]
    assert torch.allclose(loaded(x, x, pos), head(x, x, pos), atol=1e-2)


def test_loads_public_layout_with_bin_and_embedding(tiny_pair, tmp_path):
    """A public head ships pytorch_model.bin, may carry embed_tokens and may use `model.` prefixes."""
    target, _ = tiny_pair
    head = random_head(target.config, seed=9)
    folder = tmp_path / "public"
    save_head(head, folder)
    state = load_file(str(folder / "model.safetensors"))
    state["embed_tokens.weight"] = torch.randn(32000, 64)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_head(folder, target=target)
    assert loaded.embed_tokens is not None
    assert torch.equal(loaded.fc.weight, head.fc.weight)


def test_bad_head_folder(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_head(tmp_path)
