"""`compare --peer vllm:...`: vLLM's rows beside this engine's, and one printed line, never a failure,
when vLLM is missing, too old or does not start.

Without vLLM these run in seconds: the interpreter probed is this one (which lacks vLLM) or a stand-in
script. The tests that run vLLM itself need the interpreter of an environment that has it in
`$NANOSPEC_VLLM_PYTHON` (docs/serving.md) and are skipped with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

import nanospec.__main__ as cli
from app.dev.devtools import tiny_loader
from nanospec.bench.peers import vllm_peer, vllm_worker
from nanospec.bench.peers.vllm_peer import PeerSpec, PeerTarget, VllmPeer, parse_peers, probe

ARGS = ["--max-new-tokens", "3", "--depth", "2", "--top-k", "2", "--total-tokens", "4", "--limit", "1"]
HAS_VLLM_HERE = importlib.util.find_spec("vllm") is not None
VLLM_PYTHON = os.environ.get(vllm_peer.PYTHON_ENV)


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "the draft tree"}) + "\n")
    return path


def _stand_in(tmp_path, version: str, run_error: str):
    """An 'interpreter' whose probe reports `version` and whose worker run dies with `run_error`."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n"
                      f"if [ \"$2\" = \"--probe\" ]; then\n  echo '{{\"vllm\": \"{version}\", \"preload\": []}}'\n"
                      "  exit 0\nfi\n"
                      "echo 'INFO loading the model' >&2\n"
                      f"echo '{run_error}' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_parse_peers_names_what_is_allowed():
    assert parse_peers("vllm:plain, vllm:ngram,vllm:eagle:5") == [
        PeerSpec("plain"), PeerSpec("ngram"), PeerSpec("eagle", 5)]
    for bad in ("sglang:plain", "vllm:medusa", "vllm:plain:3", "vllm:eagle:0", ","):
        with pytest.raises(ValueError, match="vllm:plain, vllm:ngram, vllm:eagle"):
            parse_peers(bad)


def test_the_nanospec_kind_runs_vllm_eagle_with_the_plugin():
    target = PeerTarget(model="m", head="h", head_family="eagle3", dtype="float32", max_new_tokens=2,
                        stop_token_ids=[2], threads=1)
    peer = VllmPeer(parse_peers("vllm:nanospec,vllm:eagle"), sys.executable)
    for spec, plugin in zip(peer.specs, (True, False)):
        assert vllm_peer.unsupported(spec, target) is None
        request = peer._request(spec, target, [[1, 2, 3]])
        assert request["kind"] == "eagle3" and request["active_vocab"] is plugin  # an EAGLE-3 head as vLLM's eagle3
    eagle2 = dataclasses.replace(target, head_family="eagle")
    assert peer._request(peer.specs[0], eagle2, [[1]])["kind"] == "eagle"
    headless = dataclasses.replace(target, head=None, head_family=None)
    assert vllm_peer.unsupported(PeerSpec("nanospec"), headless) == "needs a draft head; this pair has none"
    assert vllm_peer.unsupported(PeerSpec("plain"), headless) is None


def test_an_eagle3_head_loses_only_its_identity_vocabulary_maps(tmp_path):
    """vLLM refuses a d2t tensor when the draft vocabulary is the whole vocabulary: identity maps are dropped,
    a pruned head's are kept, every other tensor is unchanged."""
    from safetensors.torch import load_file, save_file
    w = {"fc.weight": torch.randn(4, 12), "d2t": torch.zeros(10, dtype=torch.long),
         "t2d": torch.ones(10, dtype=torch.bool)}
    src = tmp_path / "head"
    src.mkdir()
    save_file(w, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"vocab_size": 10, "draft_vocab_size": 10}))
    notes = vllm_worker.eagle3_head_for_vllm(src, tmp_path / "full")
    out = load_file(str(tmp_path / "full" / "model.safetensors"))
    assert notes and set(out) == {"fc.weight"} and torch.equal(out["fc.weight"], w["fc.weight"])
    pruned = {"fc.weight": w["fc.weight"], "d2t": torch.arange(6) % 2, "t2d": torch.arange(10) < 6}
    save_file(pruned, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"vocab_size": 10, "draft_vocab_size": 6}))
    assert vllm_worker.eagle3_head_for_vllm(src, tmp_path / "pruned") == []
    assert set(load_file(str(tmp_path / "pruned" / "model.safetensors"))) == set(pruned)


@pytest.mark.skipif(HAS_VLLM_HERE, reason="this interpreter has vLLM: the missing-vLLM path needs one without")
def test_probe_says_vllm_is_missing():
    found = probe(sys.executable)
    assert found.version is None and "vLLM is not installed" in found.error


def test_probe_refuses_an_old_vllm_and_a_missing_interpreter(tmp_path):
    assert "older than 0.32" in probe(_stand_in(tmp_path, "0.10.1rc1", "")).error
    assert probe(_stand_in(tmp_path, "0.32.0", "")).error is None
    assert "cannot run" in probe(str(tmp_path / "no-such-python")).error


def test_a_vllm_that_fails_to_start_is_one_line(tmp_path):
    python = _stand_in(tmp_path, "0.32.0", "RuntimeError: Engine core initialization failed. See root cause above.")
    peer = VllmPeer(parse_peers("vllm:plain,vllm:ngram"), python)
    target = PeerTarget(model="m", head=None, head_family=None, dtype="float32", max_new_tokens=2, stop_token_ids=[2],
                        threads=1)
    assert peer.run(target, [[1, 2, 3]]) == []
    assert peer.failure_lines() == ["vllm peer failed to start (vllm:plain, vllm:ngram): exit status 1: "
                                    "RuntimeError: Engine core initialization failed. See root cause above."]


@pytest.mark.skipif(HAS_VLLM_HERE, reason="this interpreter has vLLM: the missing-vLLM path needs one without")
def test_compare_without_vllm_prints_one_line_and_this_engines_rows(tmp_path, monkeypatch, capsys):
    pair = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    monkeypatch.setattr(cli, "_load", lambda a: pair)
    out_json = tmp_path / "table.json"
    rc = cli.main(["compare", "--prompts", str(_prompts(tmp_path)), "--methods", "full", "--json", str(out_json),
                   "--peer", "vllm:plain,vllm:eagle", "--vllm-python", sys.executable, *ARGS])
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "vllm" in line.lower()]
    assert rc == 0
    assert len(lines) == 1 and lines[0].startswith("vllm peer skipped: vLLM is not installed for"), lines
    assert [r["method"] for r in json.loads(out_json.read_text())] == ["ar", "full"]


def test_peer_is_greedy_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_load", lambda a: pytest.fail("must refuse before loading"))
    rc = cli.main(["compare", "--prompts", str(_prompts(tmp_path)), "--peer", "vllm:plain", "--temperature", "0.7",
                   *ARGS])
    assert rc == 2 and "--peer compares greedy outputs" in capsys.readouterr().err


def test_fc_bias_folds_exactly_into_the_attention_biases(tmp_path):
    """vLLM's EAGLE fc has no bias: the converted head puts W_qkv b and b where layer 0 sees them."""
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    h, kv = 8, 4
    w = {"fc.weight": torch.randn(h, 2 * h), "fc.bias": torch.randn(h),
         "layers.0.self_attn.q_proj.weight": torch.randn(h, h), "layers.0.self_attn.k_proj.weight": torch.randn(kv, h),
         "layers.0.self_attn.v_proj.weight": torch.randn(kv, h), "layers.0.self_attn.o_proj.weight": torch.randn(h, h)}
    src, dst = tmp_path / "head", tmp_path / "vllm_head"
    src.mkdir()
    save_file(w, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"hidden_size": h, "bias": True}))
    notes = vllm_worker.eagle_head_for_vllm(src, dst)
    out, config = load_file(str(dst / "model.safetensors")), json.loads((dst / "config.json").read_text())
    assert notes and "fc.bias" not in out and config["attention_bias"] is True and "bias" not in config
    x = torch.randn(3, 2 * h)
    with_bias = x @ w["fc.weight"].T + w["fc.bias"]  # what the head computes
    without = x @ out["fc.weight"].T  # what vLLM's fc computes
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"layers.0.self_attn.{proj}"
        torch.testing.assert_close(with_bias @ w[f"{name}.weight"].T, without @ out[f"{name}.weight"].T
                                   + out[f"{name}.bias"])
    torch.testing.assert_close(with_bias, without + out["layers.0.self_attn.o_proj.bias"])  # the residual


needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON or probe(VLLM_PYTHON).error is not None,
    reason=f"needs vLLM: set ${vllm_peer.PYTHON_ENV} to the python of an environment that has it (docs/serving.md)")


@needs_vllm
@pytest.mark.integration
def test_vllm_rows_match_ar_token_for_token(tmp_path, capsys):
    """The default pair through vLLM plain, EAGLE with the shipped head, and that head with NanoSpec's active
    vocabulary inside vLLM: the same outputs as this engine's ar."""
    out_json = tmp_path / "table.json"
    rc = cli.main(["compare", "--methods", "nanospec", "--json", str(out_json), "--max-new-tokens", "8",
                   "--limit", "1", "--peer", "vllm:plain,vllm:eagle,vllm:nanospec", "--vllm-python", VLLM_PYTHON])
    assert rc == 0, capsys.readouterr()
    rows = {r["method"]: r for r in json.loads(out_json.read_text())}
    assert set(rows) == {"ar", "nanospec", "vllm:plain", "vllm:eagle", "vllm:nanospec"}, capsys.readouterr()
    for name in ("vllm:plain", "vllm:eagle", "vllm:nanospec"):
        assert rows[name]["identical_to_ar"] is True, rows[name]["divergences"]
        assert rows[name]["peer"]["engine"] == "vllm" and rows[name]["tokens_per_s"] > 0
    assert rows["vllm:plain"]["tau"] == 1.0
    for name in ("vllm:eagle", "vllm:nanospec"):
        assert rows[name]["peer"]["drafts"] > 0 and rows[name]["tau"] >= 1.0
    assert rows["vllm:eagle"]["mean_active"] is None
    vocab = rows["vllm:nanospec"]["peer"]["vocab"]  # the plugin's report: one request, its active set
    assert len(vocab["requests"]) == 1 and 0 < rows["vllm:nanospec"]["mean_active"] <= 3072
    assert 0.0 <= rows["vllm:nanospec"]["coverage"] <= 1.0


@needs_vllm
@pytest.mark.integration
def test_vllm_rows_with_the_eagle3_head_match_ar(tmp_path, capsys):
    """The shipped EAGLE-3 head through vLLM's eagle3 drafting, without and with NanoSpec's active vocabulary:
    the same outputs as this engine's ar, and the head drafts tokens the target accepts (it loaded right)."""
    out_json = tmp_path / "table.json"
    head = Path(__file__).resolve().parent.parent / "assets" / "heads" / "smollm2-135m-eagle3"
    rc = cli.main(["compare", "--methods", "nanospec", "--json", str(out_json), "--max-new-tokens", "16",
                   "--limit", "1", "--head", str(head),
                   "--peer", "vllm:eagle,vllm:nanospec", "--vllm-python", VLLM_PYTHON])
    assert rc == 0, capsys.readouterr()
    rows = {r["method"]: r for r in json.loads(out_json.read_text())}
    assert {"vllm:eagle", "vllm:nanospec"} <= set(rows), capsys.readouterr()
    for name in ("vllm:eagle", "vllm:nanospec"):
        assert rows[name]["identical_to_ar"] is True, rows[name]["divergences"]
        assert rows[name]["peer"]["kind"] == name.split(":")[1] and rows[name]["peer"]["drafts"] > 0
        assert rows[name]["peer"]["speculative_config"]["method"] == "eagle3"
        assert rows[name]["tau"] > 1.0, rows[name]["peer"]  # an EAGLE-3 head vLLM misread would accept nothing
    vocab = rows["vllm:nanospec"]["peer"]["vocab"]
    assert len(vocab["requests"]) == 1 and 0 < rows["vllm:nanospec"]["mean_active"] <= 3072
