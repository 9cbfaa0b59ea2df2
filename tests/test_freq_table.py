"""nanospec.data.freq_table: top-N selection, counting with budgets, and the shipped table."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nanospec.data import freq_table
from nanospec.data.freq_table import CorpusSource, count_tokens, load_frequency_table, top_ids


def test_top_ids_orders_by_count_then_lower_id():
    counts = torch.tensor([5, 9, 5, 0, 9, 1])
    assert top_ids(counts, 6).tolist() == [1, 4, 0, 2, 5, 3]
    assert top_ids(counts, 3).tolist() == [1, 4, 0]
    assert top_ids(counts, 0).tolist() == []
    assert top_ids(counts, 2).dtype == torch.long


def test_top_ids_validates():
    with pytest.raises(ValueError, match="n must be"):
        top_ids(torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="1-D"):
        top_ids(torch.ones(2, 2, dtype=torch.long), 1)


class CharTokenizer:
    """Each character becomes its ordinal (mod 16): enough to check counting."""

    def __call__(self, texts, add_special_tokens=False, verbose=False):
        return {"input_ids": [[ord(c) % 16 for c in text] for text in texts]}


def source(name, docs, unlimited=False):
    return CorpusSource(name, name, lambda: iter(docs), unlimited=unlimited)


def test_count_tokens_budget_split_and_cut():
    prompts = source("prompts", ["aa"], unlimited=True)
    first = source("first", ["bbbb", "bbbb", "bbbb"])  # 12 tokens available
    second = source("second", ["c"])  # runs short: 1 token
    counts = count_tokens(CharTokenizer(), [prompts, first, second], max_tokens=10, vocab_size=16)
    # prompts take 2 (unlimited), the other 8 split 4/4; 'first' is cut mid-document
    assert (prompts.tokens, first.tokens, second.tokens) == (2, 4, 1)
    assert first.documents_used == 1
    assert counts[ord("a") % 16] == 2 and counts[ord("b") % 16] == 4 and counts[ord("c") % 16] == 1
    assert int(counts.sum()) == 7 and counts.dtype == torch.int64 and counts.shape == (16,)


def test_prompts_source_uses_only_train_prompts():
    from nanospec.data.prompts import load_prompts

    class Template:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "\n".join(m["content"] for m in messages)

    docs = list(freq_table.prompts_source(Template()).documents())
    train, heldout = load_prompts(split="train"), load_prompts(split="heldout")
    assert len(docs) == len(train)
    corpus = "\n".join(docs)
    for item in heldout:
        text = item.get("prompt") or item["turns"][-1]["content"]
        assert text not in corpus


def test_stdlib_source_is_deterministic():
    first = freq_table.stdlib_source().documents()
    second = freq_table.stdlib_source().documents()
    assert [next(first) for _ in range(3)] == [next(second) for _ in range(3)]


def test_load_npy_and_bad_tables(tmp_path):
    np.save(tmp_path / "c.npy", np.array([3, 1, 2], dtype=np.int32))
    counts = load_frequency_table(tmp_path / "c.npy")
    assert counts.dtype == torch.int64 and counts.tolist() == [3, 1, 2]
    np.save(tmp_path / "f.npy", np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="integer"):
        load_frequency_table(tmp_path / "f.npy")
    with pytest.raises(FileNotFoundError, match="freq-table"):
        load_frequency_table(tmp_path / "missing.safetensors")


def test_save_and_load_roundtrip(tmp_path):
    counts = torch.tensor([0, 7, 7, 1], dtype=torch.int64)
    freq_table.save_table(counts, tmp_path / "t.safetensors", {"k": "v"})
    assert torch.equal(load_frequency_table(tmp_path / "t.safetensors"), counts)


def test_shipped_table():
    path = freq_table.DEFAULT_TABLE_PATH
    assert path.stat().st_size < 1_000_000
    counts = load_frequency_table()
    assert counts.shape == (49152,) and counts.dtype == torch.int64 and int(counts.min()) >= 0
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    assert int(meta["total_tokens"]) == int(counts.sum()) >= 1_000_000
    sources = json.loads(meta["sources"])
    assert "python-stdlib" in sources and "prompts-train" in sources
    assert sum(s["tokens"] for s in sources.values()) == int(counts.sum())
    # chat-template tokens are counted (<|im_start|> = 1, <|im_end|> = 2); <|endoftext|> never is
    assert counts[1] > 0 and counts[2] > 0 and counts[0] == 0
    assert f"{int(meta['total_tokens']):,}" in (freq_table.ASSET_DIR / "README.md").read_text()


def test_main_rejects_bad_budget():
    with pytest.raises(SystemExit):
        freq_table.main(["--max-tokens", "0"])
