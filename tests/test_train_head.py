"""Draft-head training: data shapes, a few steps reduce the loss, save/load round trip (tiny random pair)."""

from __future__ import annotations

import random

import pytest
import torch

from nanospec.heads.head import load_head, save_head
from nanospec.training.instructions import make_instructions
from nanospec.decoding.kv import new_cache
from nanospec.training.open_instructions import make_open_instructions
from nanospec.data.prompts import load_prompts, prompt_messages
from nanospec.bench.random_pair import random_target, random_target_config
from nanospec.training.train_head import (Sample, answer_samples, collate, head_loss, init_head_from_target, make_batches,
                                 sampled_vocab, teacher_forced_samples, train, unrolled_forward)
from nanospec.bench.compare import parse_tree_settings

VOCAB, HIDDEN = 512, 64


@pytest.fixture(scope="module")
def tiny_target():
    cfg = random_target_config(VOCAB, HIDDEN, 2, heads=2, kv_heads=1, intermediate=128, max_positions=256)
    return random_target(cfg, seed=0)


@pytest.fixture(scope="module")
def tiny_samples(tiny_target):
    g = torch.Generator().manual_seed(5)
    # repeated patterns give the head something learnable
    seqs = [torch.randint(0, 64, (8,), generator=g).repeat(4) for _ in range(12)]
    return teacher_forced_samples(tiny_target, seqs, batch_size=4, progress=False)


def test_answer_samples_split_left_padded_batch():
    b, p, n, h, eos = 2, 4, 5, 3, 2
    input_ids = torch.tensor([[0, 10, 11, 12], [20, 21, 22, 23]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    answers = torch.tensor([[30, 31, eos, eos, eos], [40, 41, 42, 43, 44]])
    output_ids = torch.cat([input_ids, answers], dim=1)
    # feature value = absolute column, so alignment is visible
    feats = torch.arange(p + n - 1).float()[None, :, None].expand(b, p + n - 1, h)
    s0, s1 = answer_samples(input_ids, attention_mask, output_ids, feats, eos)
    assert s0.ids.tolist() == [10, 11, 12, 30, 31, eos]            # pad dropped, cut after the first eos
    assert s0.feats.shape == (5, h) and s0.feats.dtype == torch.float16
    assert s0.feats[:, 0].tolist() == [1, 2, 3, 4, 5]                # f of ids[0..4] = columns 1..5
    assert s0.start == 1                                             # predicts f[3] (last prompt pos) onward
    assert s1.ids.tolist() == [20, 21, 22, 23, 40, 41, 42, 43, 44]   # no eos: all n tokens
    assert s1.feats.shape == (8, h) and s1.feats[-1, 0] == 7


def test_collate_and_batches(tiny_samples):
    s = [Sample(torch.arange(6), torch.zeros(5, HIDDEN, dtype=torch.float16), start=2),
         Sample(torch.arange(4), torch.ones(3, HIDDEN, dtype=torch.float16), start=0)]
    ids, feats, mask = collate(s)
    assert ids.shape == (2, 6) and feats.shape == (2, 5, HIDDEN) and mask.shape == (2, 4)
    assert mask.tolist() == [[False, False, True, True], [True, True, False, False]]
    batches = make_batches(tiny_samples, batch_tokens=64, rng=random.Random(0))
    assert sorted(j for b in batches for j in b) == list(range(len(tiny_samples)))
    assert all(len(b) * 32 <= 64 for b in batches)


def test_teacher_forced_features_match_the_base_model(tiny_target, tiny_samples):
    s = tiny_samples[0]
    with torch.no_grad():
        hidden = tiny_target.model(input_ids=s.ids[None]).last_hidden_state[0]
    assert s.feats.shape == (len(s.ids) - 1, HIDDEN)
    torch.testing.assert_close(s.feats.float(), hidden[:-1], atol=2e-3, rtol=2e-3)


def test_init_starts_as_identity(tiny_target, tiny_samples):
    head = init_head_from_target(tiny_target)
    ids, feats, _ = collate(tiny_samples[:1])
    t = feats.shape[1]
    with torch.no_grad():
        out = head(tiny_target.get_input_embeddings()(ids[:, 1:]), feats, torch.arange(t)[None], None,
                   torch.ones(t, t, dtype=torch.bool).tril()[None, None])
    torch.testing.assert_close(out, feats)


def _loss_inputs(target, samples):
    """embed, LM-head weight, frequent ids, collated batch (ids, feats, mask) and its sampled vocabulary."""
    frequent = torch.arange(32)
    ids, feats, mask = collate(samples)
    return (target.get_input_embeddings(), target.get_output_embeddings().weight, frequent, ids, feats, mask,
            sampled_vocab(ids, frequent))


def test_a_few_steps_reduce_the_loss(tiny_target, tiny_samples):
    embed, lm, frequent, ids, feats, mask, vocab = _loss_inputs(tiny_target, tiny_samples)
    head = init_head_from_target(tiny_target)
    with torch.no_grad():
        before, _ = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5)
    stats = train(head, tiny_target, tiny_samples, tiny_samples[:2], frequent, epochs=4, lr=1e-2,
                  batch_tokens=64, noise=0.1, token_weight=0.5, seed=0, progress=False)
    with torch.no_grad():
        after, _ = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5)
    assert stats["steps"] >= 12 and len(stats["history"]) == 4
    assert after.item() < 0.95 * before.item()


def test_unrolled_forward_matches_drafting_with_a_cache(tiny_target, tiny_samples):
    """Each step equals what the head computes at that tree depth: after the true prefix 0..t is in its
    KV cache, depth 2 is the query (x[t+2], its own f^[t+1]) at position t+1, attending to the cache and
    itself; depth 3 is (x[t+3], f^[t+2]) at position t+2, attending to the cache, depth 2 and itself."""
    torch.manual_seed(0)
    head = init_head_from_target(tiny_target)
    with torch.no_grad():                 # leave the identity init, or f^[t+1] would just equal f[t]
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    embed = tiny_target.get_input_embeddings()
    ids, feats, _ = collate(tiny_samples[:2])
    t = feats.shape[1]
    with torch.no_grad():
        embs = [embed(ids[:, j:]) for j in (1, 2, 3)]
        pred, pred2, pred3 = unrolled_forward(head, embs, feats)
        assert pred.shape[1] == t and pred2.shape[1] == t - 1 and pred3.shape[1] == t - 2
        two = unrolled_forward(head, embs[:2], feats)        # fewer steps: the same first two
        torch.testing.assert_close(two[1], pred2)
        for row in range(2):
            for i in (0, 3, t - 3):
                cache = new_cache()
                prefix = head(embs[0][row:row + 1, :i + 1], feats[row:row + 1, :i + 1], torch.arange(i + 1)[None],
                              cache, torch.ones(i + 1, i + 1, dtype=torch.bool).tril()[None, None])
                torch.testing.assert_close(prefix[0, -1], pred[row, i], atol=1e-5, rtol=1e-5)
                step2 = head(embs[1][row:row + 1, i:i + 1], prefix[:, -1:], torch.tensor([[i + 1]]), cache,
                             torch.ones(1, i + 2, dtype=torch.bool)[None, None])
                torch.testing.assert_close(step2[0, 0], pred2[row, i], atol=1e-5, rtol=1e-5)
                step3 = head(embs[2][row:row + 1, i:i + 1], step2, torch.tensor([[i + 2]]), cache,
                             torch.ones(1, i + 3, dtype=torch.bool)[None, None])
                torch.testing.assert_close(step3[0, 0], pred3[row, i], atol=1e-5, rtol=1e-5)


def test_unrolled_training_reduces_the_two_step_loss(tiny_target, tiny_samples):
    embed, lm, frequent, ids, feats, mask, vocab = _loss_inputs(tiny_target, tiny_samples)
    head = init_head_from_target(tiny_target)
    with torch.no_grad():
        before, plain = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5, steps=2)
        one_step, _ = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5)
    assert "acc2" in plain and plain["n2"] > 0 and before.item() > one_step.item()  # the second step adds a loss
    stats = train(head, tiny_target, tiny_samples, tiny_samples[:2], frequent, epochs=3, lr=1e-2,
                  batch_tokens=64, noise=0.1, token_weight=0.5, seed=0, progress=False, unroll=2)
    with torch.no_grad():
        after, _ = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5, steps=2)
    assert all("acc2" in row for row in stats["history"])
    assert after.item() < 0.95 * before.item()
    with torch.no_grad():
        three, stats3 = head_loss(head, embed, lm, ids, feats, mask, vocab, 0.0, 0.5, steps=3)
    assert stats3["n3"] > 0 and 0.0 <= stats3["acc3"] <= 1.0 and three.item() > after.item()  # depth 3 adds a loss


def test_cli_rejects_zero_epochs_without_an_init_head(tmp_path):
    from nanospec.training.train_head import main
    with pytest.raises(ValueError, match="--epochs >= 1"):
        main(["--epochs", "0", "--out", str(tmp_path / "h")])
    with pytest.raises(ValueError, match="--unroll-steps"):
        main(["--unroll-steps", "1", "--out", str(tmp_path / "h")])
    with pytest.raises(FileNotFoundError, match="--init-head"):
        main(["--epochs", "0", "--init-head", str(tmp_path / "missing"), "--out", str(tmp_path / "h")])


def test_save_load_round_trip(tmp_path, tiny_target):
    head = init_head_from_target(tiny_target)
    with torch.no_grad():
        head.fc.weight.add_(0.01 * torch.randn_like(head.fc.weight))
    folder = save_head(head.eval(), tmp_path / "head", dtype=torch.float16)
    from safetensors.torch import load_file
    stored = load_file(str(folder / "model.safetensors"))
    assert not any(k.startswith("embed_tokens") for k in stored)
    assert all(v.dtype == torch.float16 for v in stored.values())
    loaded = load_head(folder, target=tiny_target, dtype=torch.float32)
    assert loaded.embed_tokens is None
    for name, value in head.state_dict().items():
        if not name.startswith("rotary_emb."):
            torch.testing.assert_close(loaded.state_dict()[name], value.half().float())


def test_instructions_are_seeded_and_never_held_out():
    heldout = [prompt_messages(p) for p in load_prompts(split="heldout")]
    a = make_instructions(300, seed=0, exclude=heldout)
    assert a == make_instructions(300, seed=0, exclude=heldout)
    assert a != make_instructions(300, seed=1, exclude=heldout)
    held_texts = {m[-1]["content"].strip() for m in heldout}
    assert not any(m[-1]["content"].strip() in held_texts for m in a)
    assert len({str(m) for m in a}) == 300


def test_open_instructions_are_seeded_varied_and_never_held_out():
    heldout = [prompt_messages(p) for p in load_prompts(split="heldout")]
    a = make_open_instructions(600, seed=0, exclude=heldout)
    assert a == make_open_instructions(600, seed=0, exclude=heldout)
    assert a != make_open_instructions(600, seed=1, exclude=heldout)
    assert len({str(m) for m in a}) == 600
    held_texts = {m[-1]["content"].strip() for m in heldout}
    assert not any(m[-1]["content"].strip() in held_texts for m in a)
    # every family shows up, multi-turn chats are well formed
    assert any(len(m) == 3 and [t["role"] for t in m] == ["user", "assistant", "user"] for m in a)
    assert any("Python" in m[-1]["content"] for m in a) and any("?" in m[-1]["content"] for m in a)
    # no two generators collide: the templated set and the open set share no conversation
    templated = make_instructions(600, seed=0, exclude=heldout)
    assert not ({str(m) for m in a} & {str(m) for m in templated})
    # the exclusion list is honoured for open prompts too
    banned = a[:5]
    assert not any(m in banned for m in make_open_instructions(600, seed=0, exclude=heldout + banned))
    with pytest.raises(ValueError):
        make_open_instructions(-1)
    # train-head cuts one list into rounds (each cached alone): a longer list starts with the shorter one
    assert make_open_instructions(1200, seed=0, exclude=heldout)[:600] == a


def test_open_rounds_cache_folders(tmp_path, monkeypatch):
    """Round 0 keeps the folder key it had before rounds existed (its cached answers stay valid); later
    rounds, other sizes and the templated set get folders of their own."""
    import json

    from nanospec.training.train_head import CACHE_VERSION, _cache_dir, build_parser

    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    args = build_parser().parse_args([])
    r0, r1 = _cache_dir(args, "T", "open", 0), _cache_dir(args, "T", "open", 1)
    assert json.loads((r0 / "key.json").read_text()) == [CACHE_VERSION, "T", "open", 1920, 128, 96, 0]
    assert len({r0, r1, _cache_dir(args, "T"), _cache_dir(build_parser().parse_args(["--open-instructions", "960"]),
                                                          "T", "open", 1)}) == 4


def test_parse_tree_settings():
    assert parse_tree_settings("5x8x32,4x6x24") == [(5, 8, 32), (4, 6, 24)]
    with pytest.raises(ValueError):
        parse_tree_settings("5x8")
