"""EAGLE-3 draft head: fc(low, mid, high target states) -> one decoder layer on concat(embed, hidden) -> norm -> lm_head.

Architecture (as published by EAGLE-3): ``fc`` maps the concatenation of the target's three hidden
states (the inputs of layers 2, L//2 and L-3, see :mod:`nanospec.heads.features`) from 3H to H. The one
decoder layer ("midlayer") normalises the token embedding (``input_layernorm``) and the hidden
state (``hidden_norm``), concatenates them (2H) for attention (q/k/v read 2H), adds the *un-normed*
hidden state as the residual, then the usual post-attention norm + MLP. Its output (before
``norm``) is the hidden state fed back at the next drafting step; ``lm_head(norm(out))`` scores a
draft vocabulary of ``draft_vocab_size`` ids, mapped to target ids by ``d2t``
(target = draft + d2t[draft]); ``t2d`` [V] marks the target ids that have a draft id.

Checkpoint layouts (both load; ours is saved in EAGLE's):
- EAGLE: ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``;
- SGLang/SpecForge: ``model.layers.0.*``, ``model.fc.weight``, ``model.norm.weight``, ``lm_head.weight``
  (``d2t``/``t2d`` at the top or under ``model.``; optional ``model.embed_tokens.weight``).
Config: a Llama ``config.json`` plus ``draft_vocab_size`` and optional ``target_hidden_size``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from nanospec.heads.rotary import Fp32RotaryModule
from nanospec.heads.head import read_state, reuse_target_embedding, head_config_from_target, llama_config_from_json

ARCH = "LlamaForCausalLMEagle3"


class Eagle3Layer(nn.Module):
    """The EAGLE-3 decoder layer: attention over concat(input_layernorm(embed), hidden_norm(hidden))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn = self.self_attn
        bias = bool(getattr(config, "attention_bias", False))
        attn.q_proj = nn.Linear(2 * h, attn.q_proj.out_features, bias=bias)
        attn.k_proj = nn.Linear(2 * h, attn.k_proj.out_features, bias=bias)
        attn.v_proj = nn.Linear(2 * h, attn.v_proj.out_features, bias=bias)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings, mask, cache) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=mask, cache=cache)
        x = hidden + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(Fp32RotaryModule):
    """Keeps its rotary tables in fp32 whatever dtype it is cast to (`rotary.py`)."""

    family = "eagle3"

    def __init__(self, config: LlamaConfig, with_embedding: bool = False):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        h = config.hidden_size
        th = int(getattr(config, "target_hidden_size", None) or h)
        dv = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        self.draft_vocab_size = dv
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embedding else None
        self.fc = nn.Linear(3 * th, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, dv, bias=False)
        self.register_buffer("d2t", torch.zeros(dv, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool) if dv == config.vocab_size
                             else torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.notes: list[str] = []          # what loading decided (shown by PairInfo.notes)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def feature_size(self) -> int:
        return self.fc.in_features

    def forward(
        self,
        token_embeds: torch.Tensor,          # [B, q, H] embeddings of x[t+1]
        features: torch.Tensor,              # [B, q, 3H'] target features, or [B, q, H] the head's own output
        position_ids: torch.Tensor,          # [B, q]
        cache=None,
        mask: torch.Tensor | None = None,    # [B, 1, q, kv] bool
    ) -> torch.Tensor:
        dtype = self.fc.weight.dtype
        hidden = features.to(dtype)
        if hidden.shape[-1] == self.fc.in_features and self.fc.in_features != self.hidden_size:
            hidden = self.fc(hidden)
        pos_emb = self.rotary_emb(hidden, position_ids=position_ids)
        return self.midlayer(token_embeds.to(dtype), hidden, pos_emb, mask, cache)   # pre-norm output

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [.., draft_vocab_size]."""
        return self.lm_head(self.norm(hidden))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def eagle3_config_from_target(target_config, draft_vocab_size: int | None = None) -> LlamaConfig:
    cfg = head_config_from_target(target_config, 1)
    cfg.draft_vocab_size = int(draft_vocab_size or target_config.vocab_size)
    cfg.target_hidden_size = int(target_config.hidden_size)
    return cfg


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The bool membership [V] that a d2t offset table implies."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.shape[0]) + d2t.cpu()] = True
    return t2d


def d2t_from_ids(target_ids: torch.Tensor) -> torch.Tensor:
    """Sorted target ids of a draft vocabulary -> the d2t offsets (target = draft + d2t[draft])."""
    ids = torch.sort(target_ids.to(torch.long)).values
    return ids - torch.arange(ids.shape[0])


# ---- checkpoint I/O ------------------------------------------------------------------------------


def is_eagle3_folder(folder: str | Path) -> bool:
    """True when the folder's config names EAGLE-3 (architecture or draft_vocab_size)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    raw = json.loads(path.read_text())
    return "draft_vocab_size" in raw or any("eagle3" in str(a).lower() for a in raw.get("architectures") or [])


def _eagle_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename SGLang/SpecForge keys into EAGLE's layout; drop rotary buffers."""
    out = {}
    for key, value in state.items():
        if "rotary_emb." in key:
            continue
        if key.startswith("model.layers.0."):
            key = "midlayer." + key.removeprefix("model.layers.0.")
        elif key.startswith("model."):
            key = key.removeprefix("model.")
        out[key] = value
    return out


def save_eagle3(head: Eagle3Head, folder: str | Path, dtype: torch.dtype | None = None,
                lm_head_from_target: bool = False) -> Path:
    """config.json + model.safetensors in EAGLE's layout (d2t/t2d kept in their own dtypes).

    `lm_head_from_target`: leave ``lm_head.weight`` out and mark the config so that `load_eagle3`
    takes the target's output embedding instead (a full-vocabulary head whose LM head is the
    target's: the shipped head is then ~56 MB smaller for SmolLM2)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if lm_head_from_target and head.draft_vocab_size != head.config.vocab_size:
        raise ValueError(f"lm_head_from_target needs a full-vocabulary head; this one drafts over "
                         f"{head.draft_vocab_size} of {head.config.vocab_size} ids")
    folder.mkdir(parents=True, exist_ok=True)
    cfg = head.config.to_dict()
    cfg["architectures"] = [ARCH]
    cfg["draft_vocab_size"] = head.draft_vocab_size
    cfg.pop("lm_head_from_target", None)
    if lm_head_from_target:
        cfg["lm_head_from_target"] = True
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    state = {}
    for k, v in head.state_dict().items():
        if k.startswith("rotary_emb.") or (lm_head_from_target and k == "lm_head.weight"):
            continue
        floating = v.is_floating_point()
        state[k] = v.detach().to(dtype if (dtype is not None and floating) else v.dtype).contiguous()
    save_file(state, str(folder / "model.safetensors"))
    return folder


def load_eagle3(folder: str | Path, target=None, device: torch.device | str = "cpu",
                dtype: torch.dtype | None = None) -> Eagle3Head:
    """Load an EAGLE-3 head in either published layout; with `target`, check it fits (ValueError if not)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"EAGLE-3 head folder {folder} must contain config.json")
    raw = json.loads((folder / "config.json").read_text())
    config = llama_config_from_json(raw)
    config.draft_vocab_size = int(raw.get("draft_vocab_size") or config.vocab_size)
    state = _eagle_layout(read_state(folder))
    if "d2t" not in state:
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError(f"EAGLE-3 head {folder}: draft_vocab_size {config.draft_vocab_size} < vocab_size "
                             f"{config.vocab_size} needs a d2t table, and the checkpoint has none")
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    state["d2t"] = state["d2t"].to(torch.long)
    if "t2d" not in state:
        state["t2d"] = t2d_from_d2t(state["d2t"], config.vocab_size)
    state["t2d"] = state["t2d"].to(torch.bool)
    check_eagle3(config, state, target.config if target is not None else None)
    notes = reuse_target_embedding(state, target) if target is not None else []
    if "lm_head.weight" not in state and raw.get("lm_head_from_target"):
        notes.append(_target_lm_head(state, config, target, folder))
    head = Eagle3Head(config, with_embedding="embed_tokens.weight" in state)
    head.notes = notes
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"EAGLE-3 head {folder}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    float_dtype = dtype or state["fc.weight"].dtype
    head.to(device=device, dtype=float_dtype)
    head.d2t, head.t2d = head.d2t.to(device, torch.long), head.t2d.to(device, torch.bool)
    head.eval().requires_grad_(False)
    return head


def _target_lm_head(state: dict[str, torch.Tensor], config: LlamaConfig, target, folder: Path) -> str:
    """A head saved with `lm_head_from_target`: its lm_head is the target's output embedding."""
    if target is None:
        raise ValueError(f"EAGLE-3 head {folder} takes its lm_head from the target (config lm_head_from_target): "
                         "load it with the target model")
    if config.draft_vocab_size != config.vocab_size:
        raise ValueError(f"EAGLE-3 head {folder}: lm_head_from_target needs draft_vocab_size == vocab_size "
                         f"({config.draft_vocab_size} != {config.vocab_size})")
    state["lm_head.weight"] = target.get_output_embeddings().weight.detach()
    return "lm_head: the target's output embedding (the head was saved without its own copy)"


def check_eagle3_head(head: Eagle3Head, target_config) -> None:
    """check_eagle3 for a built head (the engine's constructor)."""
    check_eagle3(head.config, {"d2t": head.d2t.cpu(), "t2d": head.t2d.cpu()}, target_config)


def check_eagle3(config: LlamaConfig, state: dict[str, torch.Tensor], target_config=None) -> None:
    """Shape checks that need no model work: ValueError naming the field that does not fit."""
    d2t, dv, v = state["d2t"], config.draft_vocab_size, config.vocab_size
    if d2t.shape != (dv,):
        raise ValueError(f"EAGLE-3 head: d2t has shape {tuple(d2t.shape)}, expected ({dv},) = draft_vocab_size")
    targets = torch.arange(dv) + d2t.cpu()
    if dv and (int(targets.min()) < 0 or int(targets.max()) >= v):
        raise ValueError(f"EAGLE-3 head: d2t maps draft ids to target ids {int(targets.min())}..{int(targets.max())}, "
                         f"outside the target vocabulary 0..{v - 1}")
    if state["t2d"].shape != (v,):
        raise ValueError(f"EAGLE-3 head: t2d has shape {tuple(state['t2d'].shape)}, expected ({v},) = vocab_size")
    if target_config is None:
        return
    th = int(getattr(config, "target_hidden_size", None) or config.hidden_size)
    if th != target_config.hidden_size:
        raise ValueError(f"EAGLE-3 head target_hidden_size {th} does not match the target's hidden_size "
                         f"{target_config.hidden_size}; a head must be trained for this target")
    if config.hidden_size != target_config.hidden_size:
        raise ValueError(f"EAGLE-3 head hidden_size {config.hidden_size} does not match the target's "
                         f"{target_config.hidden_size}; this engine feeds the target's embeddings to the head")
    if v != target_config.vocab_size:
        raise ValueError(f"EAGLE-3 head vocab_size {v} does not match the target's vocab_size "
                         f"{target_config.vocab_size}; a head must be trained for this target")
    layers = int(getattr(config, "num_target_layers", None) or target_config.num_hidden_layers)
    if layers != target_config.num_hidden_layers or target_config.num_hidden_layers < 6:
        raise ValueError(f"EAGLE-3 head expects a target with num_hidden_layers={layers} (>= 6), the target has "
                         f"{target_config.num_hidden_layers}")
