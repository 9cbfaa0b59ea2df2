"""Tree attention through transformers' attention interface: the stock model, a cheaper kernel call.

With grouped-query attention (SmolLM2: 9 query heads on 3 key/value heads) and a tree mask, transformers'
`sdpa` path copies the whole cache `num_key_value_groups` times per layer (`repeat_kv`) before calling
`scaled_dot_product_attention`; at 4 tree tokens and a few hundred cached ones that copy was about a
fifth of a CPU verification forward (docs/benchmarks.md, "Verification forward by part"). PyTorch's
kernel takes grouped heads itself (`enable_gqa=True`), with the same result bit for bit on a CPU.

`use_tree_attention(module)` registers that function under `TREE_SDPA` (with sdpa's mask function, so
mask creation is unchanged) and points a model's config at it. It applies on a CPU only: on CUDA a mask
with `enable_gqa` leaves the fused kernels, which is why transformers copies there. Every other call
(one query, no mask, no grouping) goes to transformers' own sdpa function.

In bf16 or fp16 on a CPU every call (one query, a tree, a prompt) runs the kernel in fp64 and rounds its
output back once. A row's attention then no longer depends on how many rows share the call: the kernel
blocks its sums by the number of queries and keys, so a row verified among 16 (masked keys in between)
and the same row decoded alone add the same numbers in another order. In fp32 that changes the last bit
and almost never a token; in bf16 it flips near-ties, so speculation would not reproduce `ar`. In fp64
the two orders differ by ~1e-16 relative, far below bf16's spacing, so both round to the same bf16
value (the linears, norms and rotary already give a row the same bits at any row count on a CPU). It
costs both `ar` and verification the same (docs/benchmarks.md, "bf16 on a CPU").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

TREE_SDPA = "nanospec_sdpa"
WIDENED = (torch.bfloat16, torch.float16)  # on a CPU their attention runs in fp64 (bit-stable rows)


def tree_sdpa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """Several queries under a mask with grouped key/value heads: one kernel call, no copies of the
    cache. query: [B, H, q, D]; key, value: [B, H_kv, kv, D]; mask: [B, 1, q, kv] bool (True = attend)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if widened(query.dtype, query.device) and kwargs.get("softcap") is None:
        return _widened(query, key, value, attention_mask, dropout, scaling, groups > 1)
    if (attention_mask is None or groups == 1 or query.shape[2] == 1 or query.device.type != "cpu"
            or key.shape[-1] != value.shape[-1] or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)  # [B, H, q, D]
    return out.transpose(1, 2).contiguous(), None                         # [B, q, H, D]


def widened(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether attention in `dtype` on `device` runs in fp64 inside (see the module's docstring)."""
    return dtype in WIDENED and torch.device(device).type == "cpu"


def attention_name(model) -> str:
    """The attention a model runs with, as the engine reports it and the cost curve's key records it."""
    weight = next(model.parameters())
    return (str(getattr(model.config, "_attn_implementation", ""))
            + (" (fp64 inside)" if widened(weight.dtype, weight.device) else ""))


def _widened(query, key, value, attention_mask, dropout, scaling, grouped: bool) -> tuple[torch.Tensor, None]:
    """Half precision on a CPU: the kernel in fp64, its output rounded once (see the module's docstring)."""
    causal = attention_mask is None and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=attention_mask,
                                         dropout_p=dropout, is_causal=causal, scale=scaling, enable_gqa=grouped)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _register() -> None:
    AttentionInterface.register(TREE_SDPA, tree_sdpa_forward)
    AttentionMaskInterface.register(TREE_SDPA, sdpa_mask)


def use_tree_attention(config) -> bool:
    """Point `config` (a model's or a draft head's) at `TREE_SDPA` when it uses sdpa; True if it does now."""
    if getattr(config, "_attn_implementation", None) not in ("sdpa", TREE_SDPA):
        return False
    _register()
    config._attn_implementation = TREE_SDPA
    return True


def takes_bool_mask(impl: str | None) -> bool:
    """Whether an attention implementation reads the tree mask as bool (sdpa and ours) rather than additive."""
    return impl in ("sdpa", TREE_SDPA, None)
