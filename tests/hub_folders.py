"""Random-weight folders laid out like published hub repositories, and a stand-in download function.

Targets are `transformers` folders (Llama or Qwen2) with a small word-level tokenizer. Heads use the
key names of EAGLE's public checkpoints (SafeAILab/EAGLE `eagle/model/cnets1.py`, the module whose
state dict the published EAGLE-1/2 heads hold): `fc.weight`/`fc.bias`, `layers.0.self_attn.{q,k,v,o}_proj.*`
(q/k/v biases when the config says `"qkv_bias": true`, never an o_proj bias), `layers.0.mlp.*`,
`layers.0.post_attention_layernorm.weight`, no `layers.0.input_layernorm`, optionally
`embed_tokens.weight` and old per-layer `rotary_emb.inv_freq` buffers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from nanospec.heads.head import EagleHead, head_config_from_target

VOCAB, HIDDEN = 320, 64


def write_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab)}}
    raw = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(folder)


def write_target(folder: Path, kind: str = "llama", seed: int = 0, hidden: int = HIDDEN) -> torch.nn.Module:
    """A 2-layer random target (`kind`: llama | qwen2) saved with its tokenizer."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, eos_token_id=1, bos_token_id=None)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(rope_theta=1_000_000.0, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(rope_theta=500_000.0, **common))
    model.eval()
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return model


def eagle_state(target, seed: int, qkv_bias: bool, fc_bias: bool = True) -> tuple[dict, LlamaConfig]:
    """A random head's tensors under EAGLE's published key names."""
    torch.manual_seed(seed)
    config = head_config_from_target(target.config)
    head = EagleHead(config, bias=fc_bias, qkv_bias=qkv_bias)
    state = {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()
             if not k.startswith("rotary_emb.")}
    return state, config


def write_head(folder: Path, target, layout: str, seed: int = 1) -> dict:
    """Write one public layout; returns the tensors written.

    llama3      - Llama-3.x heads: Llama config, `bias` true, model.safetensors, no embedding
    llama-embed - older Llama heads: pytorch_model.bin with `embed_tokens.weight` (= the target's) and
                  per-layer `rotary_emb.inv_freq` buffers
    qwen2       - Qwen2 heads: Qwen2-style config with `"qkv_bias": true`, pytorch_model.bin, q/k/v biases,
                  no o_proj bias, `embed_tokens.weight` (= the target's)
    own-embed   - like qwen2 but the head's embedding differs from the target's
    no-fc-bias  - `"bias": false`, no `fc.bias`
    """
    qkv_bias = layout in ("qwen2", "own-embed")
    state, config = eagle_state(target, seed, qkv_bias=qkv_bias, fc_bias=layout != "no-fc-bias")
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": layout != "no-fc-bias",
           **{k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
                                              "vocab_size", "hidden_act")},
           "num_hidden_layers": 1, "rope_theta": target.config.rope_parameters["rope_theta"],
           "torch_dtype": "float16", "tie_word_embeddings": False}
    if qkv_bias:
        raw.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", qkv_bias=True, use_sliding_window=False,
                   sliding_window=None, max_window_layers=28)
    embedding = target.get_input_embeddings().weight.detach().clone()
    if layout in ("llama-embed", "qwen2"):
        state["embed_tokens.weight"] = embedding
    if layout == "own-embed":
        state["embed_tokens.weight"] = embedding + 0.5
    if layout == "llama-embed":
        head_dim = config.hidden_size // config.num_attention_heads
        state["layers.0.self_attn.rotary_emb.inv_freq"] = 1.0 / (500_000.0 ** (torch.arange(0, head_dim, 2) / head_dim))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    if layout in ("llama3", "no-fc-bias"):
        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return state


class FakeHub:
    """Stands in for `nanospec.hub.DOWNLOAD`: repo id -> folder, recording every call."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = repos
        self.calls: list[str] = []

    def __call__(self, repo_id: str, progress=None) -> Path:
        self.calls.append(repo_id)
        if repo_id not in self.repos:
            raise type("RepositoryNotFoundError", (Exception,), {})(f"404 {repo_id}")
        if progress is not None:
            progress(f"Downloading {repo_id}", 1.0)
        return self.repos[repo_id]
