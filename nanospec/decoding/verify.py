"""Target forward through the stock transformers model, and the lossless acceptance rules."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from nanospec.decoding.attention import takes_bool_mask


@dataclass
class HostTree:
    """A drafted tree as Python lists (what a `StepEvent` records)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]
    in_active: list[bool]
    sources: list[int] = field(default_factory=list)  # copy_branch.ROOT/HEAD/COPY/BOTH/PAD per node


@dataclass
class Acceptance:
    """What verification decided in one speculative step."""

    path: list[int]         # accepted tree nodes, root (node 0) first
    bonus: int              # the target's own token after the last accepted node
    bonus_in_active: bool   # the bonus token was in the active set when the tree was drafted
    n_new: int              # Ext: how many proposed ids the vocabulary commits
    tree: HostTree
    keep: torch.Tensor      # [len(path)] long, the path's nodes on the device (KV compaction, drafter update)
    bonus_dev: torch.Tensor  # [1] long, the bonus token on the device (the next step's root)
    proposal: object = None  # the vocabulary's Ext proposal (vocab.Proposal), committed after compaction
    figures: object = None  # the caller's figures (a dataclass), their tensor fields read in the same transfer


@dataclass
class TargetOutput:
    hidden: torch.Tensor         # [q, H] last hidden state after the final norm (what the LM head reads)
    logits: torch.Tensor | None  # [q, V] full-vocabulary logits, fp32


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; accept either.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def model_mask(mask: torch.Tensor | None, model, dtype: torch.dtype) -> torch.Tensor | None:
    """Bool [1,1,q,kv] (True = attend) -> the form the model's attention implementation reads."""
    if mask is None:
        return None
    if takes_bool_mask(getattr(model.config, "_attn_implementation", "sdpa")):
        return mask
    # eager & friends add the mask to the scores.
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, torch.finfo(dtype).min)


@torch.inference_mode()
def target_forward(
    model,
    input_ids: torch.Tensor,             # [1, q]
    position_ids: torch.Tensor,          # [1, q]
    cache,
    mask: torch.Tensor | None = None,    # [1, 1, q, kv] bool, None = causal
    with_logits: bool = True,
) -> TargetOutput:
    base = model.base_model
    kwargs = {_cache_kwarg(base): cache}
    out = base(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=model_mask(mask, model, model.dtype),
        use_cache=True,
        **kwargs,
    )
    hidden = out.last_hidden_state[0]  # [q, H]
    logits = model.get_output_embeddings()(hidden).float() if with_logits else None
    return TargetOutput(hidden=hidden, logits=logits)


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """The greedy choice over the last dimension; every greedy pick (prefill, AR, tree) uses it.

    `argmax` returns the lowest index among exactly tied maxima on CPU and CUDA alike, while
    `topk(...)[..., 0]` may return another one (ties are frequent in bf16)."""
    return torch.argmax(logits, dim=-1)


def check_attention_supported(config) -> None:
    """Reject targets with sliding-window or hybrid attention: the tree verifier passes a custom 4-D
    mask and keeps a full-attention cache, so such a model would lose exactness past its window."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(text, "model_type", None) or type(text).__name__
    layer_types = set(getattr(text, "layer_types", None) or ())
    if layer_types - {"full_attention"}:
        raise ValueError(f"{kind} targets with layer types {sorted(layer_types)} are not supported: the tree "
                         "verifier needs full attention in every layer (sliding-window layers would lose "
                         "exactness past the window)")
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True):
        raise ValueError(f"{kind} targets with a sliding attention window ({window} tokens) are not supported: "
                         "the tree verifier needs full attention (outputs would drift past the window)")


def warp_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Target sampling distribution: softmax(logits / T), then nucleus (top-p) truncation."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    # keep the smallest prefix whose mass reaches top_p (the first token always stays)
    drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)
