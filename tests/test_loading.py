"""nanospec.loaders.loading: device/dtype resolution, input validation, and loading a tiny local model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nanospec.loaders import loading


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 1-layer Llama with a word-level tokenizer, saved like any hub folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_llama")
    words = ["<unk>", "<s>", "</s>", "hello", "world", "the", "cat"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    config = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def default_points_to_tiny(monkeypatch, tiny_model_dir):
    calls: list[object] = []

    def ensure(progress=None, cache_dir=None):
        calls.append(progress)
        return tiny_model_dir

    monkeypatch.setattr(loading, "ensure_default_model", ensure)
    return calls


def test_resolve_device_defaults_and_validation():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert loading.resolve_device(None).type == expected
    assert loading.resolve_device("cpu") == torch.device("cpu")
    assert loading.resolve_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "tpu", "cuda:x", ""):
        with pytest.raises(ValueError, match="device"):
            loading.resolve_device(bad)
    with pytest.raises(ValueError, match="device"):
        loading.resolve_device(3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_resolve_device_cuda_unavailable():
    with pytest.raises(ValueError, match="CUDA is not available"):
        loading.resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resolve_device_cuda_gets_an_index():
    assert loading.resolve_device("cuda").index is not None


@pytest.mark.parametrize("name, expected", [
    ("float32", torch.float32), ("fp32", torch.float32), ("FP32", torch.float32),
    ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
    ("float16", torch.float16), ("fp16", torch.float16), (torch.float16, torch.float16),
])
def test_resolve_dtype_names(name, expected):
    assert loading.resolve_dtype(name, "cpu") is expected


def test_resolve_dtype_defaults():
    assert loading.resolve_dtype(None, "cpu") is torch.float32
    assert loading.resolve_dtype("auto", "cpu") is torch.float32
    if torch.cuda.is_available():
        assert loading.resolve_dtype(None, "cuda") in (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("bad", ["int8", "float64x", "", torch.int8, torch.float64, 32])
def test_resolve_dtype_rejects_unknown(bad):
    with pytest.raises(ValueError, match="dtype") as info:
        loading.resolve_dtype(bad, "cpu")
    assert "bf16" in str(info.value)  # the message lists what is allowed


def test_load_local_folder_defaults(tiny_model_dir):
    target = loading.load_target(str(tiny_model_dir), device="cpu")
    assert isinstance(target, loading.LoadedTarget)
    assert target.source == "local" and target.name == str(tiny_model_dir)
    assert target.device == torch.device("cpu") and target.dtype is torch.float32
    assert next(target.model.parameters()).dtype is torch.float32
    assert not target.model.training
    assert not any(p.requires_grad for p in target.model.parameters())
    assert target.model.config._attn_implementation == "sdpa"
    assert target.tokenizer("hello world")["input_ids"] == [3, 4]


def test_load_local_folder_dtype_override(tiny_model_dir):
    target = loading.load_target(str(tiny_model_dir), device="cpu", dtype="bf16")
    assert target.dtype is torch.bfloat16
    assert {p.dtype for p in target.model.parameters()} == {torch.bfloat16}


def test_trust_remote_code_is_off_unless_asked(tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    seen: list[bool] = []
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def spy(real):
        def wrapper(*args, **kwargs):
            seen.append(kwargs.get("trust_remote_code", False))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy(real_model))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy(real_tok))
    loading.load_target(str(tiny_model_dir), device="cpu")
    assert seen == [False, False]
    seen.clear()
    loading.load_target(str(tiny_model_dir), device="cpu", trust_remote_code=True)
    assert seen == [True, True]


@pytest.mark.parametrize("alias", [None, "default", "smollm2-135m-instruct", "SmolLM2-135M-Instruct"])
def test_aliases_load_the_offline_default(alias, default_points_to_tiny):
    progress = lambda message, fraction: None  # noqa: E731
    target = loading.load_target(alias, device="cpu", progress=progress)
    assert target.source == "default" and target.name == "SmolLM2-135M-Instruct"
    assert default_points_to_tiny == [progress]  # progress reaches ensure_default_model


def test_hub_id_falls_back_to_default_when_offline(monkeypatch, tmp_path, default_points_to_tiny):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    monkeypatch.setattr(loading, "_hub_can_serve", lambda repo: False)
    target = loading.load_target("HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu")
    assert target.source == "default" and len(default_points_to_tiny) == 1


def test_hub_check_respects_offline_mode(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                        lambda *a, **k: pytest.fail("offline mode must not touch the network"))
    assert loading._hub_can_serve("HuggingFaceTB/SmolLM2-135M-Instruct") is False


def test_hub_check_unreachable(monkeypatch):
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    assert loading._hub_can_serve("HuggingFaceTB/SmolLM2-135M-Instruct") is False


def test_local_folder_named_like_the_hub_id_wins(tiny_model_dir, monkeypatch, default_points_to_tiny):
    parent = tiny_model_dir.parent
    (parent / "HuggingFaceTB").mkdir(exist_ok=True)
    link = parent / "HuggingFaceTB" / "SmolLM2-135M-Instruct"
    if not link.exists():
        link.symlink_to(tiny_model_dir, target_is_directory=True)
    monkeypatch.chdir(parent)
    target = loading.load_target("HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu")
    assert target.source == "local" and default_points_to_tiny == []


@pytest.mark.parametrize("bad, message", [
    ("./no/such/folder", "neither an existing folder nor a hub id"),
    ("/definitely/not/here", "neither an existing folder nor a hub id"),
    ("owner/name/extra", "neither an existing folder nor a hub id"),
    ("bad id with spaces", "neither an existing folder nor a hub id"),
    ("   ", "must not be empty"),
])
def test_bad_model_names(bad, message):
    with pytest.raises(ValueError, match=message):
        loading.load_target(bad, device="cpu")


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="is a file"):
        loading.load_target(str(tmp_path / "config.json"), device="cpu")


def test_bad_device_is_rejected_before_loading(default_points_to_tiny):
    with pytest.raises(ValueError, match="device"):
        loading.load_target(None, device="gpu")
    assert default_points_to_tiny == []  # nothing was fetched or loaded
