"""Random-weight target + matching draft head at any shape (tests, and benchmarks at real model shapes)."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from nanospec.heads.head import EagleHead, head_config_from_target, save_head


def random_target_config(vocab: int, hidden: int, layers: int, heads: int | None = None,
                         kv_heads: int | None = None, intermediate: int | None = None,
                         max_positions: int = 4096, config_like: str | None = None) -> LlamaConfig:
    """A Llama config; with `config_like` (folder or hub id) its other fields are copied first."""
    base = {}
    if config_like:
        base = AutoConfig.from_pretrained(config_like).to_dict()
        for key in ("architectures", "model_type", "auto_map", "quantization_config", "torch_dtype", "dtype"):
            base.pop(key, None)
    heads = heads or max(1, hidden // 64)
    base.update(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                head_dim=hidden // heads, intermediate_size=intermediate or 4 * hidden,
                max_position_embeddings=base.get("max_position_embeddings", max_positions),
                tie_word_embeddings=base.get("tie_word_embeddings", False))
    base.setdefault("bos_token_id", 1)
    base.setdefault("eos_token_id", 2)
    return LlamaConfig(**{k: v for k, v in base.items() if k != "transformers_version"})


@contextmanager
def building_on(device: torch.device | str, dtype: torch.dtype):
    """Create modules directly on `device` in `dtype` (no fp32 CPU copy first); buffers that
    transformers makes in fp32 on purpose (rotary tables) stay fp32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def random_target(config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = copy.deepcopy(config)  # the caller's config stays as it was
    config._attn_implementation = "sdpa"
    with building_on(device, dtype):
        model = LlamaForCausalLM(config)
    return model.eval().requires_grad_(False)


def random_head(target_config, seed: int = 1, layers: int = 1, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> EagleHead:
    torch.manual_seed(seed)
    with building_on(device, dtype):
        head = EagleHead(head_config_from_target(target_config, layers), bias=True)
    return head.eval().requires_grad_(False)


def write_random_pair(out: str | Path, vocab: int, hidden: int, layers: int,
                      config_like: str | None = None, seed: int = 0) -> tuple[Path, Path]:
    """Write `out/target` (a transformers folder) and `out/head` (EAGLE layout)."""
    out = Path(out)
    cfg = random_target_config(vocab, hidden, layers, config_like=config_like)
    target = random_target(cfg, seed)
    target.save_pretrained(out / "target")
    if config_like:
        try:  # keep a real tokenizer when the shape source has one and the vocabulary fits
            tok = AutoTokenizer.from_pretrained(config_like)
            if len(tok) <= vocab:
                tok.save_pretrained(out / "target")
        except (OSError, ValueError):
            pass
    save_head(random_head(target.config, seed + 1), out / "head")
    return out / "target", out / "head"


def random_eagle3_head(target_config, draft_ids: torch.Tensor | None = None, seed: int = 1,
                       dtype: torch.dtype = torch.float32):
    """A random EAGLE-3 head for `target_config`; `draft_ids` (target ids) prune its draft vocabulary."""
    from nanospec.heads.head3 import Eagle3Head, d2t_from_ids, eagle3_config_from_target, t2d_from_d2t

    torch.manual_seed(seed)
    n = int(draft_ids.shape[0]) if draft_ids is not None else None
    head = Eagle3Head(eagle3_config_from_target(target_config, n))
    if draft_ids is not None:
        head.d2t = d2t_from_ids(draft_ids)
        head.t2d = t2d_from_d2t(head.d2t, target_config.vocab_size)
    return head.to(dtype).eval().requires_grad_(False)
