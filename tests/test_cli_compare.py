"""`python -m nanospec compare` on a user's prompt file: methods the pair cannot run are skipped with a
printed reason, before the model loads where that is known then, and never as a failure after it."""

from __future__ import annotations

import json

import nanospec.__main__ as cli
from app.devtools import tiny_loader
from nanospec import SpecEngine

ARGS = ["--max-new-tokens", "4", "--depth", "2", "--top-k", "2", "--total-tokens", "4"]


def _spec_bench_file(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"the draft tree {c}", "again"]})
                              for i, c in [(81, "writing"), (101, "reasoning")]) + "\n")
    return path


def test_compare_skips_static_without_a_frequency_table_before_loading(tmp_path, monkeypatch, capsys):
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    no_table = SpecEngine(engine.model, engine.tokenizer, engine.head, eos_token_ids=[])
    seen_at_load = {}

    def load(a):
        seen_at_load["err"] = capsys.readouterr().err
        return no_table, info

    monkeypatch.setattr(cli, "_load", load)
    out_json = tmp_path / "table.json"
    rc = cli.main(["compare", "--prompts", str(_spec_bench_file(tmp_path)), "--methods", "full,static,hybrid",
                   "--freq-table", str(tmp_path / "missing.safetensors"), "--json", str(out_json), *ARGS])
    assert rc == 0
    assert "skipping static: needs a token-frequency table" in seen_at_load["err"]  # printed before loading
    assert "skipping hybrid" in seen_at_load["err"]
    assert [r["method"] for r in json.loads(out_json.read_text())] == ["ar", "full"]


def test_compare_skips_after_loading_when_only_the_engine_knows(tmp_path, monkeypatch, capsys):
    """A table that exists but does not fit the target: the loaded engine has none; skipped, not failed."""
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    no_table = SpecEngine(engine.model, engine.tokenizer, engine.head, eos_token_ids=[])
    monkeypatch.setattr(cli, "_load", lambda a: (no_table, info))
    table = tmp_path / "exists.safetensors"
    table.write_bytes(b"")
    out_json = tmp_path / "table.json"
    rc = cli.main(["compare", "--prompts", str(_spec_bench_file(tmp_path)), "--methods", "static,nanospec",
                   "--freq-table", str(table), "--json", str(out_json), *ARGS])
    assert rc == 0
    assert "skipping static: method 'static' needs a token-frequency table" in capsys.readouterr().err
    assert [r["method"] for r in json.loads(out_json.read_text())] == ["ar", "nanospec"]


def test_fixed_shape_flag_reaches_the_engine(monkeypatch):
    """`--fixed-shape` (the GPU's tree shape on any device) is a run option like the tree's others."""
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    monkeypatch.setattr(cli, "_load", lambda a: (cli._fill_tree(a, engine.device), (engine, info))[1])
    seen = []
    real = engine.stream
    monkeypatch.setattr(engine, "stream", lambda prompt, config=None, **kw: seen.append(config.tree) or real(prompt, config))
    assert cli.main(["generate", "a b c a b c", "--method", "nanospec", "--fixed-shape", "--copy-branch", "3",
                     *ARGS]) == 0
    assert seen and seen[-1].fixed_shape is True and seen[-1].copy_branch == 3
    assert cli.main(["generate", "a b c a b c", "--method", "nanospec", *ARGS]) == 0
    assert seen[-1].fixed_shape is False
