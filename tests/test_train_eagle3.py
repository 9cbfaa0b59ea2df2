"""EAGLE-3 training: data splitting, real-text tasks, the training-time-test loss, checkpoints and resume."""

from __future__ import annotations

import json

import pytest
import torch

from nanospec.bench.random_pair import random_target, random_target_config
from nanospec.heads.features import recording
from nanospec.heads.head3 import load_eagle3, save_eagle3
from nanospec.training.eagle3_data import Sample3, answer_start, generation_marker, load_data_file, split_batch
from nanospec.training.eagle3_train import (LoopConfig, collate3, init_eagle3_from_target, resume_head, train_loop,
                                            ttt_loss)
from nanospec.training.real_tasks import TextPools, make_real_tasks

V = 256


@pytest.fixture(scope="module")
def tiny_target():
    cfg = random_target_config(V, 32, 6, heads=2, kv_heads=1, intermediate=64, max_positions=256)
    model = random_target(cfg, seed=0)
    model.lm_head.weight.mul_(8.0)              # a peaked target: its greedy token is learnable
    return model


@pytest.fixture(scope="module")
def samples(tiny_target):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(24):
        ids = torch.randint(0, V, (1, 12 + i % 9), generator=g)
        with recording(tiny_target) as rec:
            last = tiny_target.model(ids).last_hidden_state
            feats = rec.take()
        top1 = tiny_target.lm_head(last).argmax(-1)
        out.append(Sample3(ids[0], feats[0, :-1].half(), last[0, :-1].half(), top1[0, :-1]))
    return out


def test_split_batch_keeps_prompt_answer_and_eos():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])               # row 0 left-padded
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out_ids = torch.cat([ids, torch.tensor([[10, 2, 2], [11, 12, 13]])], 1)
    m = out_ids.shape[1] - 1
    feats, last = torch.randn(2, m, 6), torch.randn(2, m, 2)
    top1 = torch.arange(2 * m).reshape(2, m)
    s = split_batch(ids, mask, out_ids, feats, last, top1, eos_id=2)
    assert s[0].ids.tolist() == [5, 6, 10, 2] and s[1].ids.tolist() == [7, 8, 9, 11, 12, 13]
    assert (s[0].answer, s[1].answer) == (2, 3)                 # index of the first generated token
    assert torch.equal(s[0].top1, top1[0, 1:4]) and torch.allclose(s[0].feats.float(), feats[0, 1:4], atol=1e-2)
    with pytest.raises(ValueError, match="do not fit"):
        split_batch(ids, mask, out_ids, feats[:, :2], last, top1, eos_id=2)


def test_answer_start_from_the_generation_marker(tmp_path):
    assert answer_start([1, 9, 4, 5, 7, 9, 4, 5, 8, 8], [9, 4, 5]) == 8     # after the last occurrence
    with pytest.raises(ValueError, match="does not occur"):
        answer_start([1, 2, 3], [9, 4])

    class ChatML:                                    # the default target's template, character-level ids
        def apply_chat_template(self, chat, add_generation_prompt, tokenize):
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
            return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [ord(c) for c in text]}

    marker = generation_marker(ChatML())
    assert "".join(map(chr, marker)) == "<|im_start|>assistant\n"
    # a file written before samples had `answer`: the loader finds it from the marker
    ids = torch.tensor([ord(c) for c in "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok"])
    n = len(ids) - 1
    old = {"ids": ids, "feats": torch.zeros(n, 6).half(), "last": torch.zeros(n, 2).half(),
           "top1": torch.zeros(n, dtype=torch.long), "start": 0}
    torch.save([old], tmp_path / "batch-0000.pt")
    assert load_data_file(tmp_path / "batch-0000.pt", marker)[0].answer == len(ids) - 2
    assert load_data_file(tmp_path / "batch-0000.pt")[0].answer == -1


def test_prompt_weight_zero_trains_on_answer_positions_only(tiny_target, samples):
    head = init_eagle3_from_target(tiny_target)
    embed = tiny_target.get_input_embeddings()
    with_answers = [Sample3(s.ids, s.feats, s.last, s.top1, answer=len(s.ids) // 2) for s in samples[:4]]
    batch = list(collate3(with_answers))
    answer = batch[5]
    assert answer.any() and not answer.all()
    changed = list(batch)
    changed[2] = torch.where(answer[..., None], batch[2], torch.randn_like(batch[2]))  # new targets at prompt positions
    frequent = torch.arange(32)
    with torch.no_grad():
        a0, _ = ttt_loss(head, embed, *batch, frequent, steps=3, prompt_weight=0.0)
        b0, _ = ttt_loss(head, embed, *changed, frequent, steps=3, prompt_weight=0.0)
        a1, _ = ttt_loss(head, embed, *batch, frequent, steps=3, prompt_weight=1.0)
        b1, _ = ttt_loss(head, embed, *changed, frequent, steps=3, prompt_weight=1.0)
    assert torch.allclose(a0, b0) and not torch.allclose(a1, b1)


def test_real_tasks_are_seeded_varied_and_exclude():
    pools = TextPools(passages=[f"Passage number {i} about rivers and Mountains and their long history." for i in range(30)],
                      functions=[f"def f{i}(x):\n    if x == {i}:\n        return x + 1\n    return x" for i in range(30)],
                      pairs=[(f"Open the file number {i} now", f"Ouvrir le fichier {i}", "fr") for i in range(30)])
    a = make_real_tasks(60, pools, seed=0, open_maker=lambda k: [[{"role": "user", "content": f"q{j}"}] for j in range(k)])
    assert a == make_real_tasks(60, pools, seed=0, open_maker=lambda k: [[{"role": "user", "content": f"q{j}"}]
                                                                      for j in range(k)])
    texts = [m[-1]["content"] for m in a]
    assert len(a) == 60 and any("Passage number" in t for t in texts) and any("```python" in t for t in texts)
    assert any("French" in t or "English" in t for t in texts)
    banned = [m for m in a if "```python" in m[-1]["content"]][:3]
    b = make_real_tasks(60, pools, seed=0, exclude=banned)
    assert not any(m in banned for m in b)
    with pytest.raises(ValueError):
        make_real_tasks(-1, pools)


def test_ttt_loss_has_every_step_and_training_lowers_it(tiny_target, samples, tmp_path):
    torch.manual_seed(0)
    head = init_eagle3_from_target(tiny_target)
    assert not head.lm_head.weight.requires_grad and head.draft_vocab_size == V and not head.d2t.any()
    embed = tiny_target.get_input_embeddings()
    batch = collate3(samples[:6])
    frequent = torch.arange(32)
    before, stats = ttt_loss(head, embed, *batch, frequent, steps=3)
    assert {"ce1", "ce2", "ce3", "acc1", "acc2", "acc3"} <= stats.keys() and stats["n3"] > 0
    cfg = LoopConfig(steps=3, lr=3e-3, batch_tokens=128, epochs=6, time_budget_s=1e6, checkpoint_every_s=1e9,
                     warmup=5, val=samples[:3])
    result = train_loop(head, tiny_target, lambda: samples[3:], frequent, cfg, tmp_path, log=lambda m: None)
    with torch.no_grad():
        after, _ = ttt_loss(head, embed, *batch, frequent, steps=3)
    assert after.item() < 0.97 * before.item()
    assert result["steps"] > 0 and {"val_acc1", "val_acc2", "val_acc3", "val_ans_acc1"} <= result["history"][-1].keys()
    # checkpoint: EAGLE-3 head + optimizer + state; resume gives the same weights and the step count
    assert (tmp_path / "latest" / "head" / "config.json").is_file() and (tmp_path / "best" / "optimizer.pt").is_file()
    again, opt_state, state = resume_head(tmp_path / "latest", tiny_target)
    assert state["step"] == result["steps"] and opt_state is not None
    for name, value in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


def test_training_is_seeded(tiny_target, samples, tmp_path):
    def run(folder):
        torch.manual_seed(0)
        head = init_eagle3_from_target(tiny_target, seed=3)
        cfg = LoopConfig(steps=3, lr=1e-3, batch_tokens=128, epochs=1, time_budget_s=1e6, checkpoint_every_s=1e9,
                         seed=3, val=samples[:2])
        train_loop(head, tiny_target, lambda: samples[2:10], torch.arange(16), cfg, folder, log=lambda m: None)
        return head.state_dict()
    a, b = run(tmp_path / "a"), run(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_arch_eagle3_validates_and_exports(tiny_target, tmp_path):
    from nanospec.training.eagle3_train import save_checkpoint
    from nanospec.training.train_head import main

    with pytest.raises(ValueError, match="--steps"):
        main(["--arch", "eagle3", "--steps", "0"])
    with pytest.raises(ValueError, match="--out"):
        main(["--arch", "eagle3", "--export", str(tmp_path)])
    head = init_eagle3_from_target(tiny_target)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad])
    save_checkpoint(head, opt, {"step": 7, "elapsed_s": 1.0, "history": []}, tmp_path / "ckpt")
    assert main(["--arch", "eagle3", "--export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 0
    loaded = load_eagle3(tmp_path / "out", target=tiny_target)
    assert loaded.fc.weight.dtype == torch.float16
    assert json.loads((tmp_path / "out" / "training_state.json").read_text())["step"] == 7


def test_export_without_lm_head_loads_the_targets(tiny_target, tmp_path):
    from nanospec.training.eagle3_cli import export

    head = init_eagle3_from_target(tiny_target)
    save_eagle3(head, tmp_path / "ckpt")
    export(tmp_path / "ckpt", tmp_path / "small", target=tiny_target)
    export(tmp_path / "ckpt", tmp_path / "whole")
    small, whole = (tmp_path / "small" / "model.safetensors"), (tmp_path / "whole" / "model.safetensors")
    assert small.stat().st_size < whole.stat().st_size
    a, b = load_eagle3(tmp_path / "small", target=tiny_target), load_eagle3(tmp_path / "whole", target=tiny_target)
    emb = tiny_target.get_output_embeddings().weight
    assert torch.equal(a.lm_head.weight, emb.to(a.lm_head.weight.dtype)) and torch.equal(a.lm_head.weight, b.lm_head.weight)
    with pytest.raises(ValueError, match="load it with the target"):
        load_eagle3(tmp_path / "small")
    with torch.no_grad():
        head.lm_head.weight[0, 0] += 1.0
    save_eagle3(head, tmp_path / "trained")
    with pytest.raises(ValueError, match="differs from the target"):
        export(tmp_path / "trained", tmp_path / "bad", target=tiny_target)


def test_train_plans_and_data_folders(tmp_path, monkeypatch):
    from nanospec.training.eagle3_cli import _data_dir, build_parser, train_plans

    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    args = build_parser().parse_args([])
    assert train_plans(args) == [("real", 6000, 32)]
    mixed = build_parser().parse_args(["--train-plans", "real:6000, templated:2400:64", "--tasks", "10"])
    assert train_plans(mixed) == [("real", 6000, 32), ("templated", 2400, 64)]
    assert train_plans(build_parser().parse_args(["--train-plans", "templated"])) == [("templated", 6000, 32)]
    for bad in ("foo:10", "real:many", "real:1:2:3", "real:0"):
        with pytest.raises(ValueError, match="PLAN"):
            train_plans(build_parser().parse_args(["--train-plans", bad]))
    # the real plan keeps the cache key it had before plans existed; each plan has its own folder
    real = _data_dir(args, "T")
    assert json.loads((real / "key.json").read_text()) == ["eagle3-data", 1, "T", 6000, 128, 640, 32, 0]
    assert _data_dir(args, "T", "templated") != real != _data_dir(args, "T", "real", 10)
    assert _data_dir(args, "T", "real", 6000, 32) == real != _data_dir(args, "T", "real", 6000, 64)
