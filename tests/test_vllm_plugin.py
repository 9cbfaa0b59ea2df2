"""NanoSpec's active vocabulary inside vLLM (nanospec/serving/).

The first tests are pure torch and run without vLLM in about a second: the batched sets against the
engine's own single-request `ActiveVocab` (same members, same ring order, same argmax), capacity and
eviction, freeing, and the head/target check. The tests that run vLLM need the interpreter of an
environment that has it in `$NANOSPEC_VLLM_PYTHON` (docs/serving.md) and are skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanospec.serving.active_sets import ActiveSets, check_pair, topk_ids
from nanospec.vocab import ActiveVocab

ROOT = Path(__file__).resolve().parent.parent


def _reference(weight, capacity, steps):
    """The engine's single-request set fed the same candidate batches: its ids in slot order."""
    ref = ActiveVocab(weight, None, capacity, side_stream=False)
    for cand in steps:
        prop = ref.propose(torch.tensor(cand))
        ref.commit(prop, int(prop.n_new))
    return ref


def _add_rows(sets, rows, per_row):
    """Add each row's candidate list in one batched call (rows interleaved, as a batch arrives)."""
    flat_rows, flat_ids = [], []
    longest = max(len(c) for c in per_row)
    for j in range(longest):  # interleave: the batched add must regroup by row itself
        for r, cand in zip(rows, per_row):
            if j < len(cand):
                flat_rows.append(r)
                flat_ids.append(cand[j])
    sets.add(torch.tensor(flat_rows), torch.tensor(flat_ids))


def test_batched_sets_equal_the_engines_set_per_row():
    """Three requests, several steps with repeats and overflows: each row holds exactly what the engine's
    ActiveVocab holds for that request, in the same slots, and the batched argmax equals its argmax."""
    torch.manual_seed(0)
    v, h, cap = 50, 8, 7
    weight = torch.randn(v, h)
    g = torch.Generator().manual_seed(1)
    steps = [[torch.randint(0, v, (n,), generator=g).tolist() for n in (3, 12, 5)] for _ in range(6)]
    steps[2][0] = list(range(20))  # more new ids than the capacity at once: the latest 7 stay
    sets = ActiveSets(v, cap, rows=2)  # 3 requests in 2 pool rows: the pool grows
    rows = sets.rows_for(["a", "b", "c"])
    for step in steps:
        _add_rows(sets, rows, step)
    hidden = torch.randn(3, h)
    got = sets.argmax(hidden, torch.tensor(rows), weight, width=cap)
    for i, r in enumerate(rows):
        ref = _reference(weight, cap, [s[i] for s in steps])
        assert sets.ids[r, :cap].tolist() == ref.ids.tolist()
        assert int(sets.count[r]) == ref.size and int(sets.ptr[r]) == ref.ptr
        assert torch.equal(sets.member[r, :v], ref.member[:v])
        want = ref.slot_ids(ref.logits(hidden[i:i + 1]).argmax(-1))
        assert int(got[i]) == int(want), (i, got, want)


def test_argmax_over_a_ragged_batch_masks_the_padding():
    """Rows of different sizes in one padded [B, W] gather: padding (id 0) never wins, even when it scores best."""
    v, h = 10, 4
    weight = torch.zeros(v, h)
    weight[0] = 100.0  # the padding id scores highest for any positive hidden state
    weight[3, 0], weight[7, 1], weight[5, 2] = 1.0, 2.0, 3.0
    sets = ActiveSets(v, capacity=4)
    rows = sets.rows_for(["x", "y"])
    _add_rows(sets, rows, [[3, 7, 5], [3]])
    hidden = torch.ones(2, h)
    assert sets.argmax(hidden, torch.tensor(rows), weight, width=3).tolist() == [5, 3]
    # a per-row reference: argmax over that row's members only, full vocabulary logits
    for i, r in enumerate(rows):
        members = sets.members(r)
        assert members[int((hidden[i] @ weight[members].T).argmax())] in (5, 3)


def test_capacity_eviction_and_freeing():
    v, cap = 30, 4
    sets = ActiveSets(v, cap)
    (r,) = sets.rows_for(["req"])
    n_new = sets.add(torch.full((6,), r), torch.tensor([1, 2, 2, 3, -1, 99]))  # repeats and ids outside V ignored
    assert int(n_new[r]) == 3 and sets.members(r) == [1, 2, 3]
    sets.add(torch.full((3,), r), torch.tensor([4, 5, 1]))  # 1 is already in: 4 fills the ring, 5 evicts 1
    assert sets.members(r) == [5, 2, 3, 4] and int(sets.count[r]) == cap
    assert sets.contains(torch.tensor([r, r]), torch.tensor([1, 5])).tolist() == [False, True]
    assert sets.free("req") and not sets.free("req")
    assert sets.members(r) == [] and not sets.member[r].any() and int(sets.count[r]) == 0
    (again,) = sets.rows_for(["next"])
    assert again == r  # the freed row is reused, empty


def test_ctx_topk_matches_the_full_logits():
    torch.manual_seed(0)
    weight, hidden = torch.randn(40, 6), torch.randn(11, 6)
    assert torch.equal(topk_ids(hidden, weight, 3, chunk=4), (hidden @ weight.T).topk(3, dim=-1).indices)


def _check_draft_argmax(state, w: torch.Tensor, reqs: list[str]) -> None:
    """The batched draft argmax of each row equals the argmax over that request's set."""
    hs = torch.randn(len(reqs), w.shape[1])
    got = state.draft_argmax(hs)
    for i, req in enumerate(reqs):
        members = state.sets.members(state.sets.row_of[req])
        assert int(got[i]) == members[int((hs[i] @ w[members].T).argmax())]


def test_plugin_step_bookkeeping_without_vllm():
    """The plugin's per-step state with vLLM's inputs faked: Ctx from a prefill (top-k from the target's logits
    where it computed them, the LM head elsewhere), the batched draft argmax, coverage, freeing."""
    from types import SimpleNamespace

    from nanospec.serving import vllm_plugin as vp

    torch.manual_seed(0)
    v, h, k = 60, 8, 2
    w = torch.randn(v, h)
    state = vp.ProposerVocab(w, capacity=40, ctx_topk=k)
    vp.REPORT.clear()
    # step 1: request a prefills 3 tokens, b 5; vLLM computed logits at each row's last token only
    hid, tok, nxt = torch.randn(8, h), torch.randint(0, v, (8,)), torch.tensor([7, 9])
    state.batch, state.discard, state.emitted = ["a", "b"], [False, False], torch.tensor([1, 1])
    state.stash = ((hid[[2, 7]] @ w.T).topk(k, dim=-1).indices, None)
    state.begin_step(None, tok, hid, nxt, SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 3, 8])))
    top = topk_ids(hid, w, k)
    for req, span, n in (("a", slice(0, 3), 7), ("b", slice(3, 8), 9)):
        want = set(tok[span].tolist()) | set(top[span].flatten().tolist()) | {n}
        assert set(state.sets.members(state.sets.row_of[req])) == want
    _check_draft_argmax(state, w, ["a", "b"])
    state.end_step()
    # step 2: a emitted 3 tokens (2 accepted drafts) and its next token was in its set; b emitted 1, outside
    outside = next(i for i in range(v) if i not in state.sets.members(state.sets.row_of["b"]))
    state.batch, state.discard, state.emitted = ["a", "b"], [False, False], torch.tensor([3, 1])
    state.begin_step(None, torch.randint(0, v, (4,)), torch.randn(4, h), torch.tensor([7, outside]),
                     SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 2, 4])))
    state.end_step()
    report = vp.summary()
    assert report["requests"]["a"]["coverage"] == 1.0 and report["requests"]["b"]["coverage"] == 0.0
    assert report["coverage"] == 3 / 4 and report["next_coverage"] == 1 / 2
    assert report["requests"]["a"]["steps"] == 2 and report["mean_active"] > 0
    state.finish("a")
    assert "a" not in state.sets.row_of and vp.REPORT["a"]["finished"]
    vp.REPORT.clear()


def test_eagle3_prefill_adds_the_targets_topk_only_where_vllm_computed_logits():
    """EAGLE-3's proposer is handed other layers' hidden states ([N, 3H] before its fc), so the LM head cannot
    give the target's top-k at prompt positions: those add their own tokens; positions with target logits
    add that top-k. The draft argmax is the same batched one."""
    from types import SimpleNamespace

    from nanospec.serving import vllm_plugin as vp

    torch.manual_seed(1)
    v, h, k = 60, 8, 2
    w = torch.randn(v, h)
    state = vp.ProposerVocab(w, capacity=40, ctx_topk=k, final_hidden=False)
    vp.REPORT.clear()
    aux, tok, nxt = torch.randn(8, 3 * h), torch.randint(0, v, (8,)), torch.tensor([7, 9])  # not [N, H]
    logits_top = torch.randint(0, v, (2, k))  # the target's top-k at each row's last token
    state.batch, state.discard, state.emitted = ["a", "b"], [False, False], torch.tensor([1, 1])
    state.stash = (logits_top, None)
    state.begin_step(None, tok, aux, nxt, SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 3, 8])))
    for req, span, last, n in (("a", slice(0, 3), 0, 7), ("b", slice(3, 8), 1, 9)):
        want = set(tok[span].tolist()) | set(logits_top[last].tolist()) | {n}
        assert set(state.sets.members(state.sets.row_of[req])) == want
    _check_draft_argmax(state, w, ["a", "b"])
    state.end_step()
    vp.REPORT.clear()


def _folder(path: Path, **config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_head_target_mismatch_is_refused_with_what_differs(tmp_path):
    target = _folder(tmp_path / "target", hidden_size=576, vocab_size=49152)
    check_pair(target, _folder(tmp_path / "ok", hidden_size=576, vocab_size=49152))
    with pytest.raises(ValueError, match=r"hidden size 2048 \(head\) vs 576 \(target\)"):
        check_pair(target, _folder(tmp_path / "wide", hidden_size=2048, vocab_size=49152))
    with pytest.raises(ValueError, match=r"vocabulary 128256 \(head\) vs 49152 \(target\)"):
        check_pair(target, _folder(tmp_path / "llama3", hidden_size=576, vocab_size=128256))
    with pytest.raises(ValueError, match="cannot read config.json"):
        check_pair(target, tmp_path / "missing")


def test_plugin_settings_and_import_without_vllm():
    """Importing the plugin never imports vLLM; it is off unless enabled; settings default to the engine's."""
    from nanospec.options import OPTIONS
    from nanospec.serving import vllm_plugin

    assert not vllm_plugin.enabled({}) and vllm_plugin.enabled({vllm_plugin.ENV_ENABLE: "1"})
    assert vllm_plugin.settings({}) == (OPTIONS["capacity"].default, OPTIONS["ctx_topk"].default)
    assert vllm_plugin.settings({vllm_plugin.ENV_CAPACITY: "512"})[0] == 512
    with pytest.raises(ValueError, match="capacity must be"):
        vllm_plugin.settings({vllm_plugin.ENV_CAPACITY: "0"})
    if importlib.util.find_spec("vllm") is None:
        vllm_plugin.register()  # disabled: a no-op, even without vLLM
        assert "vllm" not in sys.modules


# -- with vLLM ------------------------------------------------------------------------------

VLLM_PYTHON = os.environ.get("NANOSPEC_VLLM_PYTHON")


def _has_vllm(python: str | None) -> bool:
    if not python:
        return False
    from nanospec.bench.peers.vllm_peer import probe
    return probe(python).error is None


needs_vllm = pytest.mark.skipif(not _has_vllm(VLLM_PYTHON), reason="needs vLLM: set $NANOSPEC_VLLM_PYTHON to the "
                                "python of an environment that has it (docs/serving.md)")


def _bench(tmp_path, *args) -> dict:
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([VLLM_PYTHON, "-m", "nanospec.bench.vllm_vocab", "--json", str(out), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text())


def _check(result: dict, batches: list[int], n_prompts: int) -> None:
    rows = {(x["batch"], x["row"]): x for x in result["rows"]}
    for b in batches:
        for row in ("eagle", "eagle+nanospec"):
            assert rows[b, row]["all_identical"] is True, rows[b, row]["identical"]
        vocab = rows[b, "eagle+nanospec"]
        per = vocab["per_request"]
        assert len(per) == n_prompts, per
        for stats in per.values():
            assert 0 < stats["mean_active"] <= stats["capacity"] and stats["steps"] > 1
            assert stats["coverage"] is None or 0.0 <= stats["coverage"] <= 1.0
        assert vocab["coverage"] is not None and vocab["draft_ms_per_step"] > 0


@needs_vllm
@pytest.mark.integration
def test_plugin_output_equals_vllm_plain_on_the_default_pair(tmp_path):
    result = _bench(tmp_path, "--batch", "1", "3", "--limit", "3", "--max-new-tokens", "12")
    _check(result, [1, 3], 3)
    assert result["rows"][0]["tau"] >= 1.0


@needs_vllm
def test_plugin_output_equals_vllm_plain_on_a_random_128k_pair(tmp_path):
    """A tiny random target with Llama-3's vocabulary size; capacity 64 so that eviction runs inside vLLM."""
    pair = tmp_path / "pair"
    subprocess.run([sys.executable, "-m", "nanospec", "random-pair", str(pair), "--vocab", "128256",
                    "--hidden", "64", "--layers", "2"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    os.environ["NANOSPEC_VLLM_CAPACITY"] = "64"
    try:
        result = _bench(tmp_path, "--target", str(pair / "target"), "--head", str(pair / "head"), "--batch", "1", "4",
                        "--limit", "4", "--max-new-tokens", "16", "--random-prompt-len", "40")
    finally:
        del os.environ["NANOSPEC_VLLM_CAPACITY"]
    _check(result, [1, 4], 4)
    per = next(x for x in result["rows"] if x["row"] == "eagle+nanospec")["per_request"]
    assert max(s["max_active"] for s in per.values()) == 64  # the ring filled and evicted


REFUSE = """
import sys
from nanospec.serving import vllm_plugin
vllm_plugin.install()
from vllm import LLM
LLM(model=sys.argv[1], speculative_config={"method": "eagle", "model": sys.argv[2], "num_speculative_tokens": 2},
    dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 28, enforce_eager=True, skip_tokenizer_init=True)
"""


@needs_vllm
def test_plugin_refuses_a_mismatched_head_before_weights_load(tmp_path):
    """Inside vLLM (not only in the benchmark's check_pair): a head of another width stops the engine with the
    plugin's message before vLLM starts loading the target."""
    for name, hidden in (("narrow", 64), ("wide", 128)):
        subprocess.run([sys.executable, "-m", "nanospec", "random-pair", str(tmp_path / name), "--vocab", "1000",
                        "--hidden", str(hidden), "--layers", "1"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([VLLM_PYTHON, "-c", REFUSE, str(tmp_path / "narrow" / "target"), str(tmp_path / "wide" / "head")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "does not fit target" in out and "hidden size 128 (head) vs 64 (target)" in out, out[-3000:]
    assert "Starting to load model" not in out, out[-3000:]
