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


# ---- tables for other tokenizers, FR-Spec ranked ids ---------------------------------------------


def write_word_tokenizer(folder, extra_added=()):
    """A tiny word-level tokenizer.json (+ tokenizer_config.json with a chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "the", "cat", "sat", "<s>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>"])
    tokenizer.add_tokens(list(extra_added))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}<s> {{ m['content'] }} {% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>"}))
    return folder


def test_tokenizer_from_file_counts_and_drops_added_tokens(tmp_path):
    from nanospec.data.tokenizer_files import tokenizer_from_file

    folder = write_word_tokenizer(tmp_path / "tok", extra_added=("<think>",))
    full = tokenizer_from_file(folder)
    assert full("the <think> cat", add_special_tokens=False)["input_ids"] == [1, 5, 2]
    trimmed = tokenizer_from_file(folder / "tokenizer.json", keep_ids_below=5)
    assert len(trimmed) == 5
    assert 5 not in trimmed("the <think> cat", add_special_tokens=False)["input_ids"]
    rendered = trimmed.apply_chat_template([{"role": "user", "content": "cat"}], tokenize=False)
    assert rendered.startswith("<s> cat")
    counts = count_tokens(trimmed, [source("s", ["the cat sat the"])], max_tokens=100, vocab_size=8)
    assert counts.tolist() == [0, 2, 1, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="vocab-size"):
        count_tokens(full, [source("s", ["<think>"])], max_tokens=100, vocab_size=3)
    with pytest.raises(ValueError, match="tokenizer.json"):
        tokenizer_from_file(tmp_path / "nowhere")


def test_main_with_a_tokenizer_json(tmp_path, monkeypatch):
    folder = write_word_tokenizer(tmp_path / "tok")
    monkeypatch.setattr(freq_table, "stdlib_source", lambda: source("python-stdlib", ["the cat sat"] * 3))
    out = tmp_path / "t.safetensors"
    assert freq_table.main(["--tokenizer", str(folder), "--out", str(out), "--vocab-size", "6",
                            "--sources", "stdlib", "--max-tokens", "7"]) == 0
    counts = load_frequency_table(out)
    assert counts.tolist() == [0, 3, 2, 2, 0, 0]  # 7 tokens: the document cut mid-way
    meta = freq_table.table_metadata(out)
    assert json.loads(meta["sources"])["python-stdlib"]["tokens"] == 7
    assert "--tokenizer" in meta["command"] and "--vocab-size 6" in meta["command"]
    with pytest.raises(SystemExit):
        freq_table.main(["--tokenizer", str(folder)])  # a path needs --out
    with pytest.raises(SystemExit):
        freq_table.main(["--sources", "stdlib,web"])


def test_fr_spec_ranked_ids(tmp_path):
    torch.save([7, 2, 5], tmp_path / "freq_3.pt")  # FR-Spec's layout: a list, most frequent first
    counts = load_frequency_table(tmp_path / "freq_3.pt", vocab_size=9)
    assert counts.shape == (9,) and top_ids(counts, 3).tolist() == [7, 2, 5]
    assert top_ids(counts, 5).tolist() == [7, 2, 5, 0, 1]
    torch.save(torch.tensor([1, 0]), tmp_path / "freq_2.pt")
    assert top_ids(load_frequency_table(tmp_path / "freq_2.pt", vocab_size=4), 2).tolist() == [1, 0]
    with pytest.raises(ValueError, match="vocabulary size"):
        load_frequency_table(tmp_path / "freq_3.pt")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 6\)"):
        load_frequency_table(tmp_path / "freq_3.pt", vocab_size=6)
    torch.save([1, 1], tmp_path / "freq_dup.pt")
    with pytest.raises(ValueError, match="repeat"):
        load_frequency_table(tmp_path / "freq_dup.pt", vocab_size=4)
    (tmp_path / "t.txt").write_text("1 2")
    with pytest.raises(ValueError, match="safetensors"):
        load_frequency_table(tmp_path / "t.txt")


@pytest.mark.parametrize("name, vocab, ids_below", [("llama3", 128_256, 128_256), ("qwen2", 152_064, 151_646)])
def test_shipped_large_vocabulary_tables(name, vocab, ids_below):
    from nanospec.data.tokenizer_files import SPECS

    path = SPECS[name].out
    assert path.stat().st_size < 700_000
    counts = load_frequency_table(path)
    assert counts.shape == (vocab,) and int(counts.min()) >= 0
    assert int(counts[ids_below:].sum()) == 0
    meta = freq_table.table_metadata(path)
    sources = json.loads(meta["sources"])
    assert {"python-stdlib", "prompts-train"} <= set(sources)
    assert sum(s["tokens"] for s in sources.values()) == int(counts.sum()) >= 1_000_000
    assert f"`{path.name}`" in (freq_table.ASSET_DIR / "README.md").read_text()
