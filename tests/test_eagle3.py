"""EAGLE-3 heads: both published layouts, pruned (d2t/t2d) and full draft vocabularies, features, lossless decoding."""

from __future__ import annotations

import json

import pytest
import torch

from nanospec.bench.random_pair import random_eagle3_head, random_target, random_target_config
from nanospec.config import METHODS
from nanospec.heads.draft_vocab import DraftVocab
from nanospec.decoding.engine import SpecEngine
from nanospec.heads.features import eagle3_layer_ids, recording
from nanospec.heads.head3 import (Eagle3Head, d2t_from_ids, eagle3_config_from_target, is_eagle3_folder, load_eagle3,
                            save_eagle3, t2d_from_d2t)
from nanospec.decoding.kv import new_cache
from nanospec.decoding.tree import ancestor_mask, tree_attention_mask, tree_position_ids
from nanospec.decoding.verify import target_forward

VOCAB = 32000
DRAFT = 3000
SPEC_METHODS = [m for m in METHODS if m != "ar"]
SMALL = dict(capacity=256, static_size=1024, core_size=128)


@pytest.fixture(scope="module")
def target():
    cfg = random_target_config(VOCAB, 64, 6, heads=2, kv_heads=1, intermediate=128, max_positions=512)
    return random_target(cfg, seed=0)


@pytest.fixture(scope="module")
def draft_ids():
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(7))[:DRAFT]


@pytest.fixture(scope="module")
def heads(target, draft_ids, tmp_path_factory):
    """{'pruned-eagle', 'pruned-sglang', 'full'}: heads loaded back from disk in each layout."""
    folder = tmp_path_factory.mktemp("eagle3")
    pruned = random_eagle3_head(target.config, draft_ids, seed=1)
    save_eagle3(pruned, folder / "eagle")
    write_sglang_layout(pruned, folder / "sglang")
    save_eagle3(random_eagle3_head(target.config, None, seed=2), folder / "full")
    return {"pruned-eagle": load_eagle3(folder / "eagle", target=target),
            "pruned-sglang": load_eagle3(folder / "sglang", target=target),
            "full": load_eagle3(folder / "full", target=target)}


def write_sglang_layout(head: Eagle3Head, folder) -> None:
    """The SGLang/SpecForge key layout: model.layers.0.*, model.fc, model.norm, lm_head (+ d2t, t2d)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    renamed = {}
    for key, value in head.state_dict().items():
        if key.startswith("rotary_emb."):
            continue
        if key.startswith("midlayer."):
            key = "model.layers.0." + key.removeprefix("midlayer.")
        elif key.startswith(("fc.", "norm.")):
            key = "model." + key
        renamed[key] = value.contiguous()
    save_file(renamed, str(folder / "model.safetensors"))
    cfg = head.config.to_dict()
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=head.draft_vocab_size)
    (folder / "config.json").write_text(json.dumps(cfg, default=str))


def test_both_layouts_load_the_same_weights(heads):
    a, b = heads["pruned-eagle"].state_dict(), heads["pruned-sglang"].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert heads["pruned-eagle"].draft_vocab_size == DRAFT and heads["full"].draft_vocab_size == VOCAB
    assert not heads["full"].d2t.any() and heads["full"].t2d.all()


def test_saved_layout_is_eagles(target, tmp_path):
    save_eagle3(random_eagle3_head(target.config, None), tmp_path / "h")
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.self_attn.q_proj.weight"} <= keys
    assert not any(k.startswith("model.") for k in keys)
    assert is_eagle3_folder(tmp_path / "h")


def test_d2t_t2d_round_trip(draft_ids):
    d2t = d2t_from_ids(draft_ids)
    t2d = t2d_from_d2t(d2t, VOCAB)
    assert int(t2d.sum()) == DRAFT and t2d[draft_ids].all()
    targets = torch.arange(DRAFT) + d2t
    assert torch.equal(targets, torch.sort(draft_ids).values)
    index = DraftVocab.index_of(d2t, VOCAB)
    assert torch.equal(index[targets], torch.arange(DRAFT))
    outside = torch.nonzero(~t2d).reshape(-1)[:50]
    assert (index[outside] == DRAFT).all() and int(index[VOCAB]) == DRAFT


def test_three_features_equal_output_hidden_states(target):
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    low, mid, high = eagle3_layer_ids(target.config.num_hidden_layers)
    assert (low, mid, high) == (2, 3, 3)
    with recording(target) as rec:
        cache = new_cache()
        out = target_forward(target, ids, torch.arange(9)[None], cache, with_logits=False)
        feats = rec.take()
        ref = target.model(ids, output_hidden_states=True).hidden_states
        assert torch.allclose(feats, torch.cat([ref[low], ref[mid], ref[high]], -1), atol=1e-5)
        # a tree verification call: the hooks see the tree's positions and mask too
        parents, depths = torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2])
        tree = torch.tensor([[5, 6, 7, 8]])
        target_forward(target, tree, tree_position_ids(depths, 9), cache, tree_attention_mask(ancestor_mask(parents), 9))
        tree_feats = rec.take()
    path = torch.cat([ids, tree[:, [0, 1, 3]]], 1)             # root -> node 1 -> node 3 as a plain sequence
    ref = target.model(path, output_hidden_states=True).hidden_states
    want = torch.cat([ref[low], ref[mid], ref[high]], -1)[0, 9:]
    assert torch.allclose(tree_feats[0, [0, 1, 3]], want, atol=1e-4)
    assert out.hidden.shape == (9, 64)


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    engine = SpecEngine(target, None, None, eos_token_ids=[])
    return [engine.generate(p, method="ar", max_new_tokens=8).token_ids for p in prompts]


# the SGLang-layout head holds the same weights as the EAGLE-layout one (checked above): one method suffices
@pytest.mark.parametrize("kind,methods", [("pruned-eagle", SPEC_METHODS), ("full", SPEC_METHODS),
                                          ("pruned-sglang", ["nanospec"])])
def test_greedy_equals_autoregressive(target, heads, prompts, ar_outputs, kind, methods):
    frequent = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))
    engine = SpecEngine(target, None, heads[kind], frequent_ids=frequent, eos_token_ids=[])
    assert len(prompts) >= 20
    for prompt, ref in zip(prompts, ar_outputs):
        for method in methods:
            out = engine.generate(prompt, method=method, max_new_tokens=8, depth=3, top_k=4, total_tokens=12,
                                  **SMALL)
            assert out.token_ids == ref, f"{kind}/{method} diverged on prompt {prompt[:5]}..."


def test_nanospec_membership_is_context_within_draft_vocabulary(target, heads, draft_ids):
    head = heads["pruned-eagle"]
    engine = SpecEngine(target, None, head, eos_token_ids=[], pack_linears=False)
    cfg_opts = dict(method="nanospec", max_new_tokens=1, capacity=4096)
    inside = draft_ids[:6].tolist()
    outside = [t for t in range(VOCAB) if t not in set(draft_ids.tolist())][:6]
    prompt = inside + outside + inside[:2]
    engine.generate(prompt, **cfg_opts)
    vocab = next(iter(engine._vocabs.values()))
    assert isinstance(vocab, DraftVocab)
    hidden = target_forward(target, torch.tensor([prompt]), torch.arange(len(prompt))[None], new_cache()).logits
    top = torch.topk(hidden, 3, dim=-1).indices.reshape(-1).tolist()      # ctx_topk default: 3
    t2d = head.t2d
    expected = {t for t in prompt + top if bool(t2d[t])}
    active = set(vocab.active_target_ids().tolist())
    assert active == expected and not (active & set(outside))
    # the rows are the head's own lm_head rows for those ids
    slots = torch.arange(vocab.size)
    d = vocab.inner.ids[slots]
    assert torch.equal(vocab.inner.buffer[slots], head.lm_head.weight[d])
    assert vocab.contains(torch.tensor(outside)).sum() == 0


def test_bad_heads_raise_before_model_work(target, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(target.model, "forward", lambda *a, **k: calls.append(1))
    wide = random_target_config(VOCAB, 96, 6, heads=3, kv_heads=1, intermediate=128)
    with pytest.raises(ValueError, match="hidden_size"):
        SpecEngine(target, None, random_eagle3_head(wide))
    small_vocab = random_target_config(1000, 64, 6, heads=2, kv_heads=1, intermediate=128)
    with pytest.raises(ValueError, match="vocab_size"):
        SpecEngine(target, None, random_eagle3_head(small_vocab))
    deep = random_eagle3_head(target.config)
    deep.config.num_target_layers = 12
    with pytest.raises(ValueError, match="num_hidden_layers"):
        SpecEngine(target, None, deep)
    bad = random_eagle3_head(target.config, torch.arange(100))
    bad.d2t[-1] = VOCAB                                          # draft id 99 -> target id VOCAB + 99
    save_eagle3(bad, tmp_path / "bad")
    with pytest.raises(ValueError, match="d2t"):
        load_eagle3(tmp_path / "bad", target=target)
    with pytest.raises(ValueError, match="d2t"):
        SpecEngine(target, None, bad)
    assert calls == []


def test_eagle3_config_fields(target):
    cfg = eagle3_config_from_target(target.config, 500)
    assert cfg.draft_vocab_size == 500 and cfg.target_hidden_size == 64
    head = Eagle3Head(cfg)
    assert head.fc.in_features == 3 * 64 and head.lm_head.out_features == 500
    assert head.midlayer.self_attn.q_proj.in_features == 128


def test_sampling_with_a_pruned_eagle3_head_matches_target_distribution():
    from .test_sampling import CHI2_001, RUNS, V, chi_square, exact_marginals

    cfg = random_target_config(V, 32, 6, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    model = random_target(cfg, seed=4)
    model.lm_head.weight.mul_(6.0)
    head = random_eagle3_head(model.config, torch.tensor([0, 2, 3, 5, 8, 9, 11, 12, 14, 15]), seed=5)
    with torch.no_grad():
        head.lm_head.weight.copy_(model.lm_head.weight[torch.arange(V)[head.t2d]])   # drafts often right
    engine = SpecEngine(model, None, head, eos_token_ids=[])
    # a device where verifying more tokens costs nothing: the budget (on by default on a CPU) keeps every
    # node instead of pruning by this machine's timing of a tiny model, so rejection is always exercised
    from nanospec.decoding.cost_curve import CostCurve
    engine.use_cost_curve(CostCurve([1, 2, 4, 8, 16, 32], [10.0] * 6, {"device": "test"}))
    prompt = [3, 9, 1, 14, 3]
    p2, p3 = exact_marginals(model, prompt, 1.0, 1.0)
    c2, c3, accepted = torch.zeros(V), torch.zeros(V), 0
    for seed in range(RUNS):
        r = engine.generate(prompt, method="nanospec", max_new_tokens=3, temperature=1.0, seed=seed,
                            depth=2, top_k=3, total_tokens=6, capacity=8)
        c2[r.token_ids[1]] += 1
        c3[r.token_ids[2]] += 1
        accepted += sum(len(e.accepted_tokens) for e in r.events)
    assert accepted > RUNS * 0.2, "drafts were rarely accepted: the test would not exercise rejection"
    for counts, probs in ((c2, p2), (c3, p3)):     # tokens outside the draft vocabulary are sampled too
        stat, df = chi_square(counts, probs)
        assert stat < CHI2_001[df - 1], f"chi2={stat:.1f} df={df}: empirical {counts / RUNS} vs exact {probs}"
