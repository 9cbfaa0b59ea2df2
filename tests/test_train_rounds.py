"""Training in rounds: the prompt pool never holds an evaluation prompt, answer chunks round-trip and bad
ones are skipped, generation resumes at its cursor, training resumes exactly (tiny random target)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nanospec.bench.random_pair import random_target, random_target_config
ROOT = Path(__file__).resolve().parents[1]
from nanospec.training.answer_chunks import (AnswerRecord, iter_chunks, read_manifest, tokenizer_fingerprint,
                                             write_chunk, write_manifest)
from nanospec.training.answers import GenerateConfig, run_generation, status
from nanospec.training.prompt_pool import (FAMILY_WEIGHTS, LeakGuard, build_part, evaluation_conversations,
                                           read_part)
from nanospec.training.real_tasks import TextPools
from nanospec.training.round_card import data_summary
from nanospec.training.round_data import is_validation, load_round_data, pad_batch, parse_repeat, plan_epoch
from nanospec.training.rounds import CHECKPOINT, RoundConfig, run_round

VOCAB, HIDDEN = 512, 64


class CharTokenizer:
    """Enough of a Hugging Face tokenizer for the jobs: one id per character, a chat template, eos id 2."""

    eos_token, pad_token, chat_template = "<eos>", "<eos>", "toy"

    def get_vocab(self) -> dict:
        return {"<eos>": 2, **{chr(32 + i): 3 + i for i in range(95)}}

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.get_vocab()[token]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"[{m['role'][0]}]{m['content']}" for m in messages) + ("[a]" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens=False) -> dict:
        return {"input_ids": [3 + (ord(c) - 32) % 95 for c in text]}


def tiny_pools() -> TextPools:
    words = "river stone market lantern orchard harbour meadow bridge tower garden forest valley".split()
    passages = [" ".join(words[(i + j) % 12] for j in range(30)) + f" Number {i}." for i in range(40)]
    functions = [f"def f{i}(x):\n    y = x + {i}\n    if y == 3:\n        return 0\n    return y" for i in range(40)]
    pairs = [(f"Open the file number {i} now", f"Ouvrez le fichier {i}", "fr") for i in range(60)]
    return TextPools(passages, functions, pairs)


@pytest.fixture(scope="module")
def tiny_target():
    cfg = random_target_config(VOCAB, HIDDEN, 2, heads=2, kv_heads=1, intermediate=128, max_positions=1024)
    return random_target(cfg, seed=0)


def gen_config(out: Path, **kw) -> GenerateConfig:
    base = dict(out=str(out), minutes=0.0, part_size=40, window=8, gen_batch=4, max_new_tokens=6,
                max_prompt_tokens=400, sample_every=3, chunk_answers=10, chunk_minutes=60.0, max_prompts=16)
    return GenerateConfig(**{**base, **kw})


# ---- the prompt pool --------------------------------------------------------------------------------


def test_pool_mixes_every_family_and_never_leaks_an_evaluation_prompt():
    evaluation = evaluation_conversations()
    guard = LeakGuard(evaluation)
    assert len(evaluation) >= 80 and all(guard.leaks(c) for c in evaluation)
    # a copied passage leaks even inside another request
    passage = evaluation[-1][-1]["content"]
    assert guard.leaks([{"role": "user", "content": "Summarize this please.\n\n" + passage[-200:]}])
    items = build_part(0, 400, seed=0, exclude=[], guard=guard, pools=tiny_pools())
    assert len(items) == 400 and {it["source"] for it in items} == set(FAMILY_WEIGHTS)
    assert not any(guard.leaks(it["messages"]) for it in items)
    assert items == build_part(0, 400, seed=0, exclude=[], guard=guard, pools=tiny_pools())   # seeded


def test_later_parts_are_new_conversations_though_chats_share_follow_up_questions():
    guard = LeakGuard(evaluation_conversations())
    first = build_part(0, 400, seed=0, exclude=[], guard=guard, pools=tiny_pools())
    second = build_part(1, 400, seed=0, exclude=[], guard=guard, pools=tiny_pools(),
                        earlier=[it["messages"] for it in first])
    key = lambda m: tuple((t["role"], t["content"]) for t in m)  # noqa: E731
    assert not {key(it["messages"]) for it in first} & {key(it["messages"]) for it in second}
    chats = [it["messages"] for it in second if it["source"] == "multi_turn"]
    earlier_follow_ups = {it["messages"][-1]["content"] for it in first if len(it["messages"]) > 1}
    assert any(len(m) > 1 and m[-1]["content"] in earlier_follow_ups for m in chats)


def test_committed_pool_parts_hold_no_evaluation_prompt():
    guard = LeakGuard(evaluation_conversations())
    parts = sorted((ROOT / "train_data").glob("*/pool-*.jsonl.gz"))
    for path in parts:
        leaked = [it["messages"][-1]["content"][:80] for it in read_part(path) if guard.leaks(it["messages"])]
        assert not leaked, f"{path}: {leaked[:3]}"


# ---- chunks -----------------------------------------------------------------------------------------


def records(n: int, first: int = 0) -> list[AnswerRecord]:
    return [AnswerRecord([5, 6, 7 + i, 60000, 2], 3, first + i, i % 2 == 1, True, i % 3) for i in range(n)]


def test_chunks_round_trip_and_bad_chunks_are_skipped_with_one_line(tmp_path):
    entries = [write_chunk(tmp_path, f"answers-{k:05d}.npz", records(4, 10 * k), "tok-a") for k in range(4)]
    write_manifest(tmp_path, {"tokenizer": "tok-a", "chunks": entries})
    chunks = list(iter_chunks(tmp_path, "tok-a", warn=pytest.fail))
    assert [len(c) for c in chunks] == [4] * 4
    assert chunks[1].sequence(2).tolist() == [5, 6, 9, 60000, 2] and chunks[1].pool_index.tolist() == [10, 11, 12, 13]
    assert chunks[0].tokens.dtype == np.uint16
    # truncate one, delete one, replace one by a chunk of another tokenizer (its manifest entry updated)
    raw = (tmp_path / "answers-00001.npz").read_bytes()
    (tmp_path / "answers-00001.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "answers-00002.npz").unlink()
    entries[3] = write_chunk(tmp_path, "answers-00003.npz", records(4, 30), "tok-b")
    write_manifest(tmp_path, {"tokenizer": "tok-a", "chunks": entries})
    warnings = []
    kept = list(iter_chunks(tmp_path, "tok-a", warn=warnings.append))
    assert [c.name for c in kept] == ["answers-00000.npz"]
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    for name, why in (("00001", "sha256"), ("00002", "missing"), ("00003", "tok-b")):
        assert any(f"answers-{name}.npz" in w and why in w for w in warnings), warnings
    with pytest.raises(ValueError, match="uint16"):
        write_chunk(tmp_path, "x.npz", [AnswerRecord([70000], 0, 0, False, True, 0)], "tok-a")


# ---- generation -------------------------------------------------------------------------------------


def test_generation_writes_chunks_and_resumes_at_its_cursor(tmp_path, tiny_target, monkeypatch):
    tok = CharTokenizer()
    m = run_generation(gen_config(tmp_path), tiny_target, tok, "tiny", log=lambda s: None, pools=tiny_pools())
    assert m["cursor"] == 16 and sum(c["answers"] for c in m["chunks"]) == 16 + 6   # greedy + every 3rd sampled
    assert read_manifest(tmp_path)["cursor"] == 16 and (tmp_path / "pool-000.jsonl.gz").exists()
    # a job killed after its first chunk of the next run keeps that chunk and its cursor
    import nanospec.training.answers as answers

    real, calls = answers.answer_window, []

    def dying(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real(*a, **kw)

    monkeypatch.setattr(answers, "answer_window", dying)
    with pytest.raises(KeyboardInterrupt):
        run_generation(gen_config(tmp_path, max_prompts=40), tiny_target, tok, "tiny", log=lambda s: None,
                       pools=tiny_pools())
    after_kill = read_manifest(tmp_path)
    assert after_kill["cursor"] == 32          # two windows flushed (10 answers per chunk), the third lost
    monkeypatch.setattr(answers, "answer_window", real)
    m = run_generation(gen_config(tmp_path, max_prompts=48), tiny_target, tok, "tiny", log=lambda s: None,
                       pools=tiny_pools())
    assert m["cursor"] == 80 and (tmp_path / "pool-001.jsonl.gz").exists()     # parts of 40: a second part
    seen = [(int(i), int(s)) for c in iter_chunks(tmp_path, tokenizer_fingerprint(tok), pytest.fail)
            for i, s in zip(c.pool_index, c.sampled)]
    assert sorted(seen) == sorted(set(seen)) and {i for i, _ in seen} == set(range(80))   # each prompt once
    assert status(tmp_path)["readable_answers"] == len(seen)
    with pytest.raises(ValueError, match="other data settings"):
        run_generation(gen_config(tmp_path, max_new_tokens=7), tiny_target, tok, "tiny", log=lambda s: None)


# ---- training rounds --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def answer_folder(tmp_path_factory, tiny_target):
    folder = tmp_path_factory.mktemp("answers")
    run_generation(gen_config(folder, max_new_tokens=12, max_prompts=48, gen_batch=8, chunk_answers=20,
                              part_size=60),
                   tiny_target, CharTokenizer(), "tiny", log=lambda s: None, pools=tiny_pools())
    return folder


def round_config(run: Path, data: Path, **kw) -> RoundConfig:
    base = dict(run_dir=str(run), data=str(data), epochs=2, batch_tokens=1024, distill_k=4, frequent=64,
                unroll=2, max_val=8, checkpoint_minutes=0.0, teacher_cache=str(run.parent / "teacher"))
    return RoundConfig(**{**base, **kw})


def test_round_data_split_and_batches(answer_folder):
    data = load_round_data([answer_folder], tokenizer_fingerprint(CharTokenizer()), warn=pytest.fail)
    assert data.val and all(is_validation(s.pool_index) and not s.sampled for s in data.val)
    assert not any(is_validation(s.pool_index) for s in data.train)
    lengths = [len(s.ids) for s in data.train]
    plan = plan_epoch(lengths, 1024, seed=0, epoch=0)
    assert sorted(j for b in plan for j in b) == list(range(len(lengths))) and plan == plan_epoch(lengths, 1024, 0, 0)
    ids, attention, mask = pad_batch(data.train[:3], prompt_loss=False)
    assert mask[0].sum() == len(data.train[0].ids) - 1 - max(data.train[0].answer_start - 2, 0)


def test_a_repeated_source_is_trained_more_often_and_the_card_counts_it_apart(answer_folder, tmp_path):
    tok_hash = tokenizer_fingerprint(CharTokenizer())
    plain = load_round_data([answer_folder], tok_hash, warn=pytest.fail)
    assert {s.source for s in plain.train} <= set(FAMILY_WEIGHTS) and plain.copies == 0
    source = sorted({s.source for s in plain.train})[0]
    n = sum(s.source == source for s in plain.train)
    tripled = load_round_data([answer_folder], tok_hash, warn=pytest.fail, repeat=parse_repeat(f"{source}=3"))
    assert tripled.copies == 2 * n and len(tripled.train) == len(plain.train) + 2 * n
    assert sum(s.source == source for s in tripled.train) == 3 * n and len(tripled.val) == len(plain.val)
    assert data_summary(tripled)["train_answers"] == len(plain.train)
    with pytest.raises(ValueError, match="unknown prompt sources"):
        load_round_data([answer_folder], tok_hash, warn=pytest.fail, repeat={"poetry": 2})
    for bad in ("templated", "templated=0", "templated=x"):
        with pytest.raises(ValueError, match="SOURCE=TIMES"):
            round_config(tmp_path, answer_folder, repeat=bad)


def test_round_resumes_exactly_where_it_stopped(tmp_path, tiny_target, answer_folder):
    tok_hash = tokenizer_fingerprint(CharTokenizer())
    straight = run_round(round_config(tmp_path / "a", answer_folder), tiny_target, tok_hash, log=lambda s: None)
    assert straight["done"] and straight["step"] == straight["total_steps"] > 4
    first = run_round(round_config(tmp_path / "b", answer_folder, max_steps=3), tiny_target, tok_hash,
                      log=lambda s: None)
    assert not first["done"] and first["step"] == 3 and (tmp_path / "b" / CHECKPOINT).exists()
    assert "in progress" in (tmp_path / "b" / "MODEL_CARD.md").read_text()
    resumed = run_round(round_config(tmp_path / "b", answer_folder), tiny_target, tok_hash, log=lambda s: None)
    assert resumed["done"] and resumed["step"] == straight["step"]
    a = torch.load(tmp_path / "a" / CHECKPOINT, weights_only=False)["head"]
    b = torch.load(tmp_path / "b" / CHECKPOINT, weights_only=False)["head"]
    assert all(torch.equal(a[k], b[k]) for k in a)       # the interruption changed nothing
    card = json.loads((tmp_path / "b" / "card.json").read_text())
    assert card["status"] == "done" and [h["epoch"] for h in card["history"]] == [0, 1, 2]
    assert 0 <= card["history"][-1]["val_top1"] <= card["history"][-1]["val_top3"] <= 1
    assert (tmp_path / "b" / "head" / "config.json").exists()
    assert "--unroll 2" in (tmp_path / "b" / "MODEL_CARD.md").read_text()
    with pytest.raises(ValueError, match="other settings"):
        run_round(dataclasses.replace(round_config(tmp_path / "b", answer_folder), lr=1e-2), tiny_target, tok_hash)


def test_round_loss_decreases(tmp_path, tiny_target, answer_folder):
    logs = []
    run_round(round_config(tmp_path, answer_folder, epochs=3, unroll=1, lr=3e-3), tiny_target,
              tokenizer_fingerprint(CharTokenizer()), log=logs.append)
    card = json.loads((tmp_path / "card.json").read_text())
    assert card["history"][-1]["val_top1"] >= card["history"][0]["val_top1"]
    assert any(line.startswith("step") for line in logs)


def test_sigterm_writes_the_pending_answers_then_stops(tmp_path, tiny_target):
    import os
    import signal

    from nanospec.training.background import StopFlag

    def log(line: str) -> None:
        if line.startswith("prompts 0-8"):
            os.kill(os.getpid(), signal.SIGTERM)       # as `kill PID` would, mid-run

    with StopFlag() as stop:
        m = run_generation(gen_config(tmp_path, chunk_answers=1000, max_prompts=0), tiny_target, CharTokenizer(),
                           "tiny", log=log, stop=stop, pools=tiny_pools())
    assert m["cursor"] == 8 and len(m["chunks"]) == 1 and m["runs"][-1]["stopped_by"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) != stop._handle   # the handler is restored


def test_later_epochs_and_rounds_read_the_target_view_from_the_teacher_cache(tmp_path, tiny_target, answer_folder,
                                                                            monkeypatch):
    from nanospec.training import teacher_cache

    calls = []
    real = teacher_cache.teacher_forward
    monkeypatch.setattr(teacher_cache, "teacher_forward", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    tok_hash = tokenizer_fingerprint(CharTokenizer())
    state = run_round(round_config(tmp_path / "a", answer_folder), tiny_target, tok_hash, log=lambda s: None)
    per_epoch = state["total_steps"] // 2
    assert state["done"] and 0 < len(calls) <= per_epoch     # the first epoch's batches only
    calls.clear()
    run_round(round_config(tmp_path / "b", answer_folder, epochs=1), tiny_target, tok_hash, log=lambda s: None)
    assert calls == []                                        # another round over the same chunks: no forward
    run_round(round_config(tmp_path / "c", answer_folder, epochs=1, teacher_cache=""), tiny_target, tok_hash,
              log=lambda s: None)
    assert len(calls) > 0                                     # cache off: every batch runs the target
