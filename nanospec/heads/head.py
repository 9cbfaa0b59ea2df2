"""EAGLE-1/2 draft head: fc(concat(embed(x[t+1]), f[t])) -> Llama decoder layer(s) -> next feature.

Checkpoint layout (public EAGLE-1/2 heads and ours): a folder with a Llama-style `config.json`
(optional `"bias"` for `fc`, default true; optional `"qkv_bias"`, as in EAGLE's `cnets1.py`: the
Qwen2 heads' q/k/v projections carry biases, their o_proj none) and `model.safetensors` or
`pytorch_model.bin` with `fc.weight` [H, 2H] (input order: embedding, then feature), `fc.bias`,
`layers.N.*` (layer 0 has no `input_layernorm`) and optionally `embed_tokens.weight`. A head's
own embedding is dropped in favour of the target's when the two are equal (an 8B head's copy
would cost 1 GB); when they differ the head keeps its own and `EagleHead.notes` says so.
Logits come from the target's own LM head, applied by the vocabulary policy.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from nanospec.heads.rotary import Fp32RotaryModule

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class EagleHead(Fp32RotaryModule):
    """The head keeps its rotary tables in fp32 whatever dtype it is cast to (`rotary.py`)."""

    def __init__(self, config: LlamaConfig, bias: bool = True, with_embedding: bool = False,
                 qkv_bias: bool = False):
        super().__init__()
        config = copy.deepcopy(config)  # the caller's config stays as it was
        config._attn_implementation = "sdpa"
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embedding else None
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE: the first layer reads fc's output raw
        if qkv_bias:  # Qwen2-style: biases on q/k/v only (transformers' attention_bias would add o_proj's too)
            for layer in self.layers:
                for name in ("q_proj", "k_proj", "v_proj"):
                    old = getattr(layer.self_attn, name)
                    setattr(layer.self_attn, name, nn.Linear(old.in_features, old.out_features, bias=True))
        self.qkv_bias = qkv_bias
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.notes: list[str] = []  # what loading decided (e.g. about the head's own embedding)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def forward(
        self,
        token_embeds: torch.Tensor,          # [1, q, H] embeddings of x[t+1]
        features: torch.Tensor,              # [1, q, H] target (or head) features f[t]
        position_ids: torch.Tensor,          # [1, q]
        cache=None,
        mask: torch.Tensor | None = None,    # [1, 1, q, kv] bool; None only when q == 1 or no cache
    ) -> torch.Tensor:
        x = self.fc(torch.cat([token_embeds, features], dim=-1).to(self.fc.weight.dtype))
        pos_emb = self.rotary_emb(x, position_ids=position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=position_ids, cache=cache,
                      use_cache=cache is not None, position_embeddings=pos_emb)
        return x  # [1, q, H] predicted next features


def head_config_from_target(target_config, num_layers: int = 1) -> LlamaConfig:
    """A Llama config for a head matching the target's width, heads and rope."""
    tc = target_config
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", tc.num_attention_heads),
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5),
        rope_parameters=getattr(tc, "rope_parameters", None),
        hidden_act=getattr(tc, "hidden_act", "silu"),
    )
    return cfg


def save_head(head: EagleHead, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json + model.safetensors in the EAGLE layout."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = head.config.to_dict()
    cfg["bias"] = head.fc.bias is not None
    if head.qkv_bias:
        cfg["qkv_bias"] = True
    cfg["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    state = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in head.state_dict().items()
             if not k.startswith("rotary_emb.")}
    save_file(state, str(folder / "model.safetensors"))
    return folder


def read_state(folder: Path) -> dict[str, torch.Tensor]:
    """A head folder's weights (`model.safetensors` or `pytorch_model.bin`) on the CPU, as saved."""
    st = folder / "model.safetensors"
    if st.exists():
        from safetensors.torch import load_file
        return load_file(str(st))
    pt = folder / "pytorch_model.bin"
    if pt.exists():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise ValueError(f"draft head folder {folder} has none of {', '.join(WEIGHT_FILES)}")


def llama_config_from_json(raw: dict) -> LlamaConfig:
    """A head's config.json as a LlamaConfig (its `architectures` / `model_type` name the head, not Llama)."""
    return LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})


def load_head(folder: str | Path, target=None, device: torch.device | str = "cpu",
              dtype: torch.dtype | None = None) -> EagleHead:
    """Load an EAGLE-1/2 head folder; when `target` is given, check it matches (ValueError if not)."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ValueError(f"draft head folder {folder} must contain config.json (EAGLE-1/2 layout)")
    raw = json.loads((folder / "config.json").read_text())
    bias = bool(raw.pop("bias", True))
    qkv_bias = bool(raw.pop("qkv_bias", False))
    config = llama_config_from_json(raw)
    state = read_state(folder)
    # older public heads carry per-layer `rotary_emb.inv_freq` buffers; rotary tables are recomputed here
    state = {k.removeprefix("model."): v for k, v in state.items() if "rotary_emb." not in k}
    notes: list[str] = []
    if target is not None:
        check_head_matches(config, target.config)
        notes = reuse_target_embedding(state, target)
    head = EagleHead(config, bias=bias, with_embedding="embed_tokens.weight" in state, qkv_bias=qkv_bias)
    head.notes = notes
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ValueError(f"draft head {folder}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    head.to(device=device, dtype=dtype or next(iter(state.values())).dtype)
    head.eval().requires_grad_(False)
    return head


def reuse_target_embedding(state: dict[str, torch.Tensor], target) -> list[str]:
    """Drop the head's `embed_tokens.weight` from `state` when it equals the target's input embedding."""
    own = state.get("embed_tokens.weight")
    if own is None:
        return []
    theirs = target.get_input_embeddings().weight
    size_mb = own.numel() * own.element_size() / 2**20
    if tuple(own.shape) == tuple(theirs.shape) and same_values(own, theirs):
        del state["embed_tokens.weight"]
        return [f"the head's own embed_tokens {list(own.shape)} equals the target's: using the target's "
                f"({size_mb:,.0f} MB not duplicated)"]
    return [f"the head's own embed_tokens {list(own.shape)} differs from the target's "
            f"{list(theirs.shape)}: the head uses its own ({size_mb:,.0f} MB extra)"]


def same_values(a: torch.Tensor, b: torch.Tensor, rows: int = 4096) -> bool:
    """Exact equality compared in fp32 on b's device, a block of rows at a time (no second full copy)."""
    for start in range(0, a.shape[0], rows):
        block_a = a[start:start + rows].to(device=b.device, dtype=torch.float32)
        if not torch.equal(block_a, b[start:start + rows].float()):
            return False
    return True


def check_head_placement(head: EagleHead, target) -> None:
    """The head must sit on the target's device, in its dtype (a CPU head with a CUDA target
    would fail mid-draft)."""
    tp, hp = next(target.parameters()), head.fc.weight
    if hp.device != tp.device or hp.dtype != tp.dtype:
        raise ValueError(f"draft head is on {hp.device} in {hp.dtype} but the target is on {tp.device} in "
                         f"{tp.dtype}: move it first, e.g. head.to(device={str(tp.device)!r}, dtype={tp.dtype})")


def check_head_matches(head_config, target_config) -> None:
    if head_config.hidden_size != target_config.hidden_size:
        raise ValueError(f"draft head hidden size {head_config.hidden_size} does not match the target's "
                         f"{target_config.hidden_size}; a head must be trained for this target")
    if head_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"draft head vocabulary {head_config.vocab_size} does not match the target's "
                         f"{target_config.vocab_size}; a head must be trained for this target")
