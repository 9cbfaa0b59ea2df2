"""Engine contracts and the CUDA-path defects that can be checked on any device (issues 13, 16)."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, MistralConfig, MistralForCausalLM, Qwen2Config

from nanospec.bench import forward_cost
from nanospec.bench.random_pair import random_head, random_target, random_target_config
from nanospec.config import TreeConfig, default_tree
from nanospec.decoding.engine import SpecEngine
from nanospec.heads.head import EagleHead, head_config_from_target
from nanospec.decoding.verify import check_attention_supported, greedy_token

from .conftest import DEVICE
from .oracle import OracleDrafter

SMALL = dict(capacity=256, static_size=4096, core_size=128)


def test_head_rotary_tables_stay_fp32(tiny_pair):
    target, _ = tiny_pair
    cfg = head_config_from_target(target.config)
    fp32 = random_head(target.config, seed=1)
    bf16 = random_head(target.config, seed=1).to(torch.bfloat16)
    assert bf16.fc.weight.dtype == torch.bfloat16
    for name in ("inv_freq", "original_inv_freq"):
        assert getattr(bf16.rotary_emb, name).dtype == torch.float32
        assert torch.equal(getattr(bf16.rotary_emb, name), getattr(fp32.rotary_emb, name))
    x = torch.zeros(1, 3, cfg.hidden_size)
    pos = torch.tensor([[0, 500, 1000]])
    cos32, sin32 = fp32.rotary_emb(x, pos)
    cos16, sin16 = bf16.rotary_emb(x, pos)  # same fp32 angles, cast to x's dtype at the end
    assert torch.equal(cos16, cos32) and torch.equal(sin16, sin32)


def test_constructors_copy_configs(tiny_pair):
    target, _ = tiny_pair
    cfg = head_config_from_target(target.config)
    cfg._attn_implementation = "eager"
    EagleHead(cfg)
    assert cfg._attn_implementation == "eager"
    tcfg = random_target_config(64, 16, 1, heads=2)
    tcfg._attn_implementation = "eager"
    random_target(tcfg)
    assert tcfg._attn_implementation == "eager"


def test_greedy_token_takes_the_lowest_index_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    assert greedy_token(logits).tolist() == [1, 0]


def test_tied_logits_are_lossless(prompts):
    """Every token's LM-head row is shared with a neighbour: each argmax is an exact tie."""
    cfg = random_target_config(512, 32, 2, heads=2, kv_heads=1, intermediate=64, max_positions=256)
    target = random_target(cfg, seed=7).to(DEVICE)
    w = target.lm_head.weight
    w[1::2] = w[0::2]
    eng = SpecEngine(target, None, random_head(target.config, seed=8).to(DEVICE),
                     frequent_ids=torch.arange(512), eos_token_ids=[])
    for prompt in [[x % 512 for x in p] for p in prompts[:4]]:
        ref = eng.generate(prompt, method="ar", max_new_tokens=10)
        for method in ("full", "nanospec", "hybrid"):
            out = eng.generate(prompt, method=method, max_new_tokens=10, capacity=64, core_size=32)
            assert out.token_ids == ref.token_ids, method


def test_head_must_sit_with_the_target(tiny_pair):
    target, _ = tiny_pair
    head = random_head(target.config, seed=1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"draft head is on .*bfloat16.*head\.to"):
        SpecEngine(target, None, head)


def test_sliding_window_targets_are_rejected():
    mistral = MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, sliding_window=8)
    with pytest.raises(ValueError, match="mistral .*sliding attention window"):
        SpecEngine(MistralForCausalLM(mistral), None, None)
    with pytest.raises(ValueError, match="gemma2 .*sliding_attention"):
        check_attention_supported(Gemma2Config(num_hidden_layers=2))
    check_attention_supported(Qwen2Config(num_hidden_layers=2, use_sliding_window=False))
    with pytest.raises(ValueError, match="qwen2"):
        check_attention_supported(Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=16,
                                              max_window_layers=0))


def test_default_tree_depends_on_the_device(engine, prompts):
    gpu = default_tree("cuda")
    assert (gpu.depth, gpu.top_k, gpu.total_tokens, gpu.copy_branch) == (6, 10, 60, 0)
    assert default_tree("cpu") == TreeConfig()
    run = engine.stream(prompts[0], method="full", max_new_tokens=4)
    assert run.config.tree == default_tree(engine.device)
    run = engine.stream(prompts[0], method="full", max_new_tokens=4, depth=2)
    assert (run.config.tree.depth, run.config.tree.top_k) == (2, TreeConfig().top_k)


def test_before_step_hook_sees_every_decoding_step(tiny_pair, frequent_ids, prompts):
    target, head = tiny_pair
    seen = []
    eng = SpecEngine(target, None, head, frequent_ids=frequent_ids, eos_token_ids=[],
                     before_step=lambda step, method: seen.append((step, method)))
    for method in ("ar", "nanospec"):
        seen.clear()
        out = eng.generate(prompts[1], method=method, max_new_tokens=6, **SMALL)
        steps = [e.step for e in out.events[1:]]
        assert seen == [(s, method) for s in steps] and steps == list(range(1, len(out.events)))

    def stop_after_two(step, method):
        if step > 2:
            raise KeyboardInterrupt
    eng.before_step = stop_after_two
    with pytest.raises(KeyboardInterrupt):
        eng.generate(prompts[1], method="full", max_new_tokens=30)


def test_drafter_factory_without_a_head(tiny_pair, engine, prompts):
    target, _ = tiny_pair
    ref = engine.generate(prompts[2], method="ar", max_new_tokens=12)
    eng = SpecEngine(target, None, None, eos_token_ids=[],
                     drafter_factory=lambda: OracleDrafter(ref.token_ids, target.config.vocab_size))
    out = eng.generate(prompts[2], method="nanospec", max_new_tokens=12, depth=4, top_k=3, total_tokens=13,
                       capacity=256)
    assert out.token_ids == ref.token_ids
    assert out.summary.tau > 2


def test_encode_prompt_is_public(engine):
    assert engine.encode_prompt([3, 4, 5]) == [3, 4, 5]
    assert engine.encode_prompt(torch.tensor([[3, 4]])) == [3, 4]
    with pytest.raises(ValueError, match="token ids"):
        engine.encode_prompt([3, 10**9])


def test_forward_cost_synchronises_around_the_clock(tiny_pair, monkeypatch):
    target, _ = tiny_pair
    calls = []
    monkeypatch.setattr(forward_cost, "sync", lambda device: calls.append(device))
    ids = torch.tensor([[1, 2, 3]], device=DEVICE)
    forward_cost.forward_ms(target, ids, 2, repeats=3)
    assert calls == [ids.device] * 6
