"""The retrieval commands on a tiny answer folder written with the project's own chunk writer."""

from __future__ import annotations

import numpy as np
import pytest

from nanospec.retrieval import RetrievalIndex, load_store
from nanospec.retrieval import bench as bench_cli
from nanospec.retrieval import build as build_cli
from nanospec.training.answer_chunks import AnswerRecord, write_chunk, write_manifest


def record(pool_index: int, answer: list[int], sampled: bool = False) -> AnswerRecord:
    prompt = [1, 100 + pool_index % 7, 2]
    return AnswerRecord(ids=prompt + answer, answer_start=len(prompt), pool_index=pool_index, sampled=sampled,
                        finished=True, source=0)


def answer_folder(tmp_path):
    """Three chunks under tokenizer tok-a (pool index 13 is held out), one foreign, one listed but missing."""
    folder = tmp_path / "answers"
    folder.mkdir()
    common = [40, 41, 42, 43, 44]
    entries = [write_chunk(folder, "answers-00000.npz", [record(0, common + [50]), record(1, common + [51]),
                                                         record(1, common + [50], sampled=True)], "tok-a"),
               write_chunk(folder, "answers-00001.npz", [record(13, common + [52, 53]), record(2, [60, 61, 62])],
                           "tok-a"),
               write_chunk(folder, "answers-00002.npz", [record(3, [70, 71, 72])], "tok-b")]
    missing = dict(entries[0], file="answers-00003.npz")
    write_manifest(folder, {"tokenizer": "tok-a", "target": "tiny", "chunks": entries + [missing]})
    return folder


def test_build_reads_the_listed_chunks_and_skips_bad_ones(tmp_path, capsys):
    folder = answer_folder(tmp_path)
    out = tmp_path / "store" / "tiny.npz"
    assert build_cli.main(["--data", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    warnings = [line for line in printed if line.startswith("warning")]
    assert len(warnings) == 2                                               # the foreign and the missing chunk
    assert any("answers-00002.npz" in w and "foreign" in w for w in warnings)
    assert any("answers-00003.npz" in w and "missing" in w for w in warnings)
    assert printed[-1].startswith(f"wrote {out}: ")
    store = load_store(out, "tok-a")
    assert store is not None and store.n_documents == 4                     # 3 + 1 (the held-out answer left out)
    assert store.manifest["held_out_answers"] == 1
    assert [s["file"] for s in store.manifest["sources"]] == ["answers-00000.npz", "answers-00001.npz"]
    assert store.manifest["settings"] == {"prompt_tail": -1, "holdout": True, "max_tokens": 0}
    docs = [store.document(i).tolist() for i in range(store.n_documents)]
    assert docs[0] == [1, 100, 2, 40, 41, 42, 43, 44, 50]
    tree = RetrievalIndex(store).lookup([42, 43, 44])
    assert dict(zip(tree.tokens.tolist(), tree.counts.tolist())) == {50: 2, 51: 1}   # never 52: held out


def test_prompt_tail_and_token_cap(tmp_path):
    folder = answer_folder(tmp_path)
    out = tmp_path / "s.npz"
    build_cli.build(folder, out, prompt_tail=1, warn=lambda line: None)
    store = load_store(out)
    assert store.document(0).tolist() == [2, 40, 41, 42, 43, 44, 50]
    build_cli.build(folder, out, max_tokens=20, warn=lambda line: None)
    assert load_store(out).n_documents == 2


def test_build_refuses_an_oversized_store_and_writes_nothing(tmp_path):
    folder = answer_folder(tmp_path)
    out = tmp_path / "s.npz"
    with pytest.raises(ValueError, match="MB cap"):
        build_cli.build(folder, out, max_mb=1e-4, warn=lambda line: None)
    assert not out.exists() and not list(tmp_path.glob("s.npz*"))


def test_build_without_usable_chunks_fails_with_one_message(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build_cli.main(["--data", str(empty), "--out", str(tmp_path / "s.npz")]) == 1
    assert "no manifest.json" in capsys.readouterr().err


def test_status_says_when_new_chunks_arrived(tmp_path, capsys):
    folder = answer_folder(tmp_path)
    out = tmp_path / "s.npz"
    build_cli.build(folder, out, warn=lambda line: None)
    lines = build_cli.status(out, folder, warn=lambda line: None)
    assert "2 listed chunk(s) not in the store" in lines[-1]                     # the foreign and the missing one
    rewritten = write_chunk(folder, "answers-00000.npz", [record(0, [9, 8])], "tok-a")
    write_manifest(folder, {"tokenizer": "tok-a", "chunks": [rewritten]})
    assert "answers-00000.npz" in build_cli.status(out, folder, warn=lambda line: None)[-1]
    assert build_cli.main(["--status", "--out", str(tmp_path / "nothing.npz")]) == 0
    out_lines = capsys.readouterr().out.splitlines()
    assert len(out_lines) == 2 and "nothing.npz" in out_lines[0]             # one warning + one status line


def test_bench_reports_times_and_match_lengths(tmp_path, capsys):
    folder = answer_folder(tmp_path)
    out = tmp_path / "s.npz"
    build_cli.build(folder, out, warn=lambda line: None)
    assert bench_cli.main(["--store", str(out), "--data", str(folder), "--queries", "50"]) == 0
    text = capsys.readouterr().out
    assert "lookup: median" in text and "p95" in text and "match length" in text
    assert bench_cli.main(["--store", str(tmp_path / "nothing.npz"), "--data", str(folder)]) == 1


def test_accepted_length_walks_the_tree_along_the_truth():
    index = RetrievalIndex(None)
    index.add_document([1, 2, 3, 4, 5])
    tree = index.lookup([1, 2])
    assert bench_cli.accepted_length(tree, np.array([3, 4, 9])) == 2
    assert bench_cli.accepted_length(tree, np.array([7])) == 0
