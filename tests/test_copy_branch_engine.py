"""The copy branch inside the engine: lossless for every policy, and fully accepted where it should be."""

from __future__ import annotations

import pytest
import torch

from nanospec.bench.random_pair import random_target, random_target_config
from nanospec.config import METHODS
from nanospec.decoding.engine import SpecEngine
from nanospec.decoding.tree import DraftTree

SPEC_METHODS = [m for m in METHODS if m != "ar"]
SMALL = dict(capacity=256, static_size=4096, core_size=128)


def self_repeating_prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat themselves: a short phrase many times, and a phrase with variations."""
    g = torch.Generator().manual_seed(5)
    out = []
    for n in (3, 5, 8):
        phrase = torch.randint(0, vocab, (n,), generator=g).tolist()
        out.append(phrase * 6)
    phrase = torch.randint(0, vocab, (10,), generator=g).tolist()
    out.append(phrase + phrase[:4] + [7] + phrase + phrase[2:])
    return out


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["cpu-shape", "fixed-shape"])
@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_with_copy_branch_equals_autoregressive(engine, prompts, method, fixed_shape):
    """Both tree shapes: PAD nodes dropped (a CPU's default) or kept (a GPU's, `fixed_shape`)."""
    every = prompts + self_repeating_prompts(engine.vocab_size)
    assert len(every) >= 20
    copied = 0
    for prompt in every:
        ref = engine.generate(prompt, method="ar", max_new_tokens=16)
        out = engine.generate(prompt, method=method, max_new_tokens=16, depth=3, top_k=4, total_tokens=12,
                              copy_branch=4, fixed_shape=fixed_shape, **SMALL)
        assert out.token_ids == ref.token_ids, f"{method} + copy branch diverged on prompt {prompt[:5]}..."
        for e in out.events[1:]:
            assert "pad" not in e.tree_sources and len(e.tree_sources) == len(e.tree_tokens)
            assert set(e.tree_sources[1:]) <= {"head", "copy", "both"}
        copied += out.summary.accepted_by_source["copy"] + out.summary.accepted_by_source["both"]
    assert copied > 0, "the copy chain was never accepted: the test would not exercise it"


# -- a hand-built case: a target that counts, a drafter that drafts garbage --------------------------
V = 16


def counting_target():
    """Greedy next token = (token + 1) mod V, whatever came before: the layers add nothing to the
    residual stream, embeddings are orthonormal and LM-head row y is embedding y - 1."""
    model = random_target(random_target_config(V, 32, 1, heads=2, kv_heads=1, intermediate=32, max_positions=256))
    q, _ = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.model.embed_tokens.weight.copy_(q[:V])
    model.lm_head.weight.copy_(10 * q[:V].roll(1, dims=0))
    return model


class GarbageDrafter:
    """Drafts a chain of tokens the counting target never emits next (token + 5)."""

    def begin(self, prompt_ids, features, next_token: int) -> None:
        pass

    def update(self, features, next_tokens, timer) -> None:
        pass

    def draft(self, root, vocab, tree, timer) -> DraftTree:
        root_token = int(root)
        tokens = [root_token] + [(root_token + 5 * (d + 1)) % V for d in range(tree.depth)]
        n = len(tokens)
        t = torch.tensor(tokens)
        return DraftTree(t, torch.arange(-1, n - 1), torch.arange(n), -torch.arange(n).float(), vocab.contains(t))


@pytest.mark.parametrize("n_copy", [1, 3, 6])
def test_copy_chain_fully_accepted_gives_tau_n_plus_one(n_copy):
    model = counting_target()
    engine = SpecEngine(model, None, None, eos_token_ids=[], drafter_factory=GarbageDrafter)
    prompt = list(range(V)) + list(range(4))          # one full cycle, then the start of the next
    ref = engine.generate(prompt, method="ar", max_new_tokens=60)
    assert ref.token_ids[:3] == [4, 5, 6]
    plain = engine.generate(prompt, method="full", max_new_tokens=60, depth=3, copy_branch=0)
    assert plain.token_ids == ref.token_ids and plain.summary.tau == 1.0  # the drafter never helps
    # the whole chain every step: the draft budget (which would learn that it pays) stays off
    out = engine.generate(prompt, method="nanospec", max_new_tokens=60, depth=3, copy_branch=n_copy, capacity=64,
                          budget=False)
    assert out.token_ids == ref.token_ids
    for e in out.events[1:-1]:  # the last step is cut by the budget
        assert len(e.accepted_tokens) == n_copy
        assert [e.tree_sources[i] for i in e.accepted_path[1:]] == ["copy"] * n_copy
    steps = out.events[1:-1]
    assert sum(e.n_emitted for e in steps) / len(steps) == n_copy + 1
    accepted = sum(len(e.accepted_tokens) for e in out.events[1:])
    assert out.summary.accepted_by_source == {"head": 0, "copy": accepted, "both": 0, "retrieved": 0}
