"""Heads in every public EAGLE-1/2 layout, loaded the way a hub id is (only the download replaced).

Every method on every such pair must give exactly `ar`'s greedy tokens.
"""

from __future__ import annotations

import pytest
import torch

from nanospec import hub
from nanospec.config import METHODS
from nanospec.data.freq_table import save_table
from nanospec.pair import load_pair

from .hub_folders import VOCAB, FakeHub, write_head, write_target

LAYOUTS = ["llama3", "llama-embed", "qwen2", "own-embed", "no-fc-bias"]
SMALL = dict(capacity=64, static_size=96, core_size=16, depth=3, top_k=3, total_tokens=10)


@pytest.fixture(scope="module")
def hub_repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    targets = {kind: write_target(root / f"target-{kind}", kind) for kind in ("llama", "qwen2")}
    repos = {"test-org/llama-target": root / "target-llama", "test-org/qwen2-target": root / "target-qwen2"}
    for layout in LAYOUTS:
        target = targets["qwen2" if layout in ("qwen2", "own-embed") else "llama"]
        write_head(root / f"head-{layout}", target, layout)
        repos[f"test-org/head-{layout}"] = root / f"head-{layout}"
    narrow = write_target(root / "target-narrow", "llama", hidden=32)
    write_head(root / "head-narrow", narrow, "llama3")
    repos["test-org/head-narrow"] = root / "head-narrow"
    table = root / "freq.safetensors"
    save_table(torch.randint(0, 50, (VOCAB,)), table, {})
    return repos, table


@pytest.fixture()
def fake_hub(hub_repos, monkeypatch):
    fake = FakeHub(hub_repos[0])
    monkeypatch.setattr(hub, "DOWNLOAD", fake)
    return fake


def _load(layout: str, table):
    target = "test-org/qwen2-target" if layout in ("qwen2", "own-embed") else "test-org/llama-target"
    messages = []
    engine, info = load_pair(target, f"test-org/head-{layout}", device="cpu", dtype="float32", freq_table=table,
                             progress=lambda m, f: messages.append(m))
    return engine, info, messages


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_is_lossless_through_the_hub_path(layout, hub_repos, fake_hub):
    engine, info, messages = _load(layout, hub_repos[1])
    assert fake_hub.calls[-2:] == [info.target, f"test-org/head-{layout}"]
    assert any("draft head" in m for m in messages)
    for prompt in ([5, 17, 17, 40, 9, 17, 40], list(range(2, 30))):
        ref = engine.generate(prompt, method="ar", max_new_tokens=10).token_ids
        for method in METHODS:
            out = engine.generate(prompt, method=method, max_new_tokens=10, **SMALL).token_ids
            assert out == ref, f"{layout}/{method} diverged from ar on {prompt[:4]}"


def test_qwen2_head_has_qkv_biases_and_reuses_the_target_embedding(hub_repos, fake_hub):
    engine, info, _ = _load("qwen2", hub_repos[1])
    attn = engine.head.layers[0].self_attn
    assert all(getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj"))
    assert attn.o_proj.bias is None
    written = torch.load(hub_repos[0]["test-org/head-qwen2"] / "pytorch_model.bin", weights_only=True)
    assert torch.equal(attn.q_proj.bias, written["layers.0.self_attn.q_proj.bias"])
    assert engine.head.embed_tokens is None  # the target's is used: no duplicate
    assert engine.head.config.rope_parameters["rope_theta"] == 1_000_000.0  # from the Qwen2-style config
    assert any("equals the target's" in note for note in info.notes)
    from app.models import EngineProvider

    provider = EngineProvider(lambda progress=None: (engine, info))
    provider.get()
    assert "equals the target's" in provider.describe()  # the page's pair line says so


def test_a_different_head_embedding_is_kept_and_reported(hub_repos, fake_hub):
    engine, info, _ = _load("own-embed", hub_repos[1])
    assert engine.head.embed_tokens is not None
    target_embedding = engine.model.get_input_embeddings().weight
    assert torch.equal(engine.head.embed_tokens.weight, target_embedding + 0.5)
    assert any("differs from the target's" in note for note in info.notes)


def test_hub_failures_are_clear_value_errors(hub_repos, fake_hub):
    with pytest.raises(ValueError, match="could not fetch draft head 'test-org/no-such-head'.*no such repository"):
        load_pair("test-org/llama-target", "test-org/no-such-head", device="cpu")
    with pytest.raises(ValueError, match="hidden size 32 does not match the target's 64"):
        load_pair("test-org/llama-target", "test-org/head-narrow", device="cpu")
    with pytest.raises(ValueError, match="neither an existing folder nor a hub id"):
        load_pair("test-org/llama-target", "not a head", device="cpu")


def test_gated_and_offline_messages():
    gated = type("GatedRepoError", (Exception,), {})("401")
    assert "gated" in hub.describe_hub_error("meta-llama/Llama-3.1-8B-Instruct", "target", gated)
    offline = type("LocalEntryNotFoundError", (Exception,), {})("offline")
    message = hub.describe_hub_error("yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "draft head", offline)
    assert "cannot be reached" in message and "huggingface-cli download yuhuili/EAGLE-LLaMA3.1-Instruct-8B" in message


def test_fr_spec_ranked_list_as_the_table(hub_repos, fake_hub, tmp_path):
    ranked = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[:200]
    torch.save(ranked.tolist(), tmp_path / "freq_200.pt")  # FR-Spec's layout: a list of ids, most frequent first
    engine, _ = load_pair("test-org/llama-target", "test-org/head-llama3", device="cpu", dtype="float32",
                          freq_table=tmp_path / "freq_200.pt")
    assert torch.equal(engine.frequent_ids[:200], ranked)
    prompt = [5, 17, 17, 40, 9, 17, 40]
    ref = engine.generate(prompt, method="ar", max_new_tokens=8).token_ids
    for method in ("static", "hybrid"):
        assert engine.generate(prompt, method=method, max_new_tokens=8, **SMALL).token_ids == ref
