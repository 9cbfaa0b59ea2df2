"""`python -m nanospec compare` on a user's prompt file: methods the pair cannot run are skipped with a
printed reason, before the model loads where that is known then, and never as a failure after it."""

from __future__ import annotations

import json

import nanospec.__main__ as cli
from app.dev.devtools import tiny_loader
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
    monkeypatch.setattr(cli, "_load", lambda a: (engine, info))  # the command fills the device's defaults
    seen = []
    real = engine.stream
    monkeypatch.setattr(engine, "stream", lambda prompt, config=None, **kw: seen.append(config.tree) or real(prompt, config))
    assert cli.main(["generate", "a b c a b c", "--method", "nanospec", "--fixed-shape", "--copy-branch", "3",
                     *ARGS]) == 0
    assert seen and seen[-1].fixed_shape is True and seen[-1].copy_branch == 3
    assert cli.main(["generate", "a b c a b c", "--method", "nanospec", *ARGS]) == 0
    assert seen[-1].fixed_shape is False


# -- trust: a result the machine may have made up is flagged, not printed as a finding ------------------

def _row(method, per_prompt, tau, repeats=3, n_prompts=2, cpu=0.95, drift=0.02):
    import statistics

    from nanospec.bench.trust import assess_trust
    speedup = statistics.median(per_prompt)
    return {"method": method, "speedup": speedup, "tau": tau, "per_prompt_speedup": per_prompt,
            "trust": assess_trust(method, per_prompt, repeats, n_prompts, speedup, tau, cpu, drift)}


def test_trust_flags_noise_busy_machines_drift_and_impossible_speedups():
    from nanospec.bench.trust import trust_warnings
    calm = [_row("ar", [1.0] * 6, 1.0), _row("nanospec", [1.8, 2.0, 1.85, 2.05, 1.9, 1.95], 3.0)]
    assert all(r["trust"]["trusted"] for r in calm) and trust_warnings(calm) == []
    # prompts 0 and 1 alternate: prompt 0's repeats are 1.8, 5.0, 1.9 -> one repeat was disturbed
    noisy = _row("nanospec", [1.8, 2.0, 5.0, 2.05, 1.9, 1.95], 3.0)
    assert not noisy["trust"]["trusted"] and "varied" in noisy["trust"]["reasons"][0]
    busy = _row("full", [1.5] * 6, 2.5, cpu=0.4)
    assert "busy machine" in " ".join(busy["trust"]["reasons"])
    drifted = _row("ar", [1.0] * 6, 1.0, drift=0.4)
    assert "ar's speed changed 40%" in " ".join(drifted["trust"]["reasons"])
    # the reported case: 24.3x with a τ of 3, from one run of one prompt
    made_up = _row("nanospec", [24.3], 3.1, repeats=1, n_prompts=1)
    assert not made_up["trust"]["trusted"] and "exceeds its τ 3.10" in made_up["trust"]["reasons"][0]
    assert made_up["trust"]["notes"]  # and one repeat measured no noise
    lines = trust_warnings(calm + [made_up, busy])
    assert [line.split(":")[1].strip() for line in lines] == ["nanospec", "full"]
    assert lines[0].startswith("WARNING: nanospec: do not trust") and "--repeat 3" in lines[0]
    # one repeat over several prompts: the prompts' speedups far apart
    split = _row("hybrid", [1.1, 9.0, 1.2, 8.5], 9.0, repeats=1, n_prompts=4)
    assert "per-prompt speedups disagree" in split["trust"]["reasons"][0]


def test_compare_cli_prints_a_warning_under_an_untrusted_table(tmp_path, monkeypatch, capsys):
    """The table's rows carry their trust; the CLI prints a WARNING line for a row that has none."""
    import nanospec.bench.compare as bench
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    monkeypatch.setattr(cli, "_load", lambda a: (engine, info))
    real = bench.compare
    seen = {}

    def disturbed(*args, **kw):
        table = real(*args, **kw)
        seen["rows"] = [dict(r) for r in table]
        table[-1]["trust"] = bench.assess_trust(table[-1]["method"], [24.3], 1, 1, 24.3, 3.1, 0.3, None)
        return table

    monkeypatch.setattr(bench, "compare", disturbed)
    rc = cli.main(["compare", "--prompts", str(_spec_bench_file(tmp_path)), "--methods", "nanospec",
                   "--limit", "1", *ARGS])
    out = capsys.readouterr().out
    assert rc == 0
    assert all({"trusted", "reasons", "repeats", "cpu_share", "ar_drift"} <= set(r["trust"]) for r in seen["rows"])
    assert "WARNING: nanospec: do not trust these figures" in out and "busy machine" in out
    assert out.index("WARNING") > out.index("speedup")  # under the table


def test_sweep_runs_every_prompt_of_a_file_and_names_an_empty_selection(tmp_path, monkeypatch, capsys):
    """A prompt file's own splits (here 'outside') are not the project's: sweep runs all of its lines unless
    --split is given, and a split that keeps nothing is an error naming the file's splits, not a traceback."""
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    monkeypatch.setattr(cli, "_load", lambda a: (engine, info))
    path = tmp_path / "outside.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"o-{i}", "category": "writing", "split": "outside",
                                          "prompt": f"the draft tree {i}"}) for i in range(2)) + "\n")
    out_json = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--prompts", str(path), "--trees", "2x2x4", "--json", str(out_json), *ARGS]) == 0
    assert "2 prompts" in capsys.readouterr().out
    for command in ("sweep", "compare"):
        assert cli.main([command, "--prompts", str(path), "--split", "heldout", *ARGS]) == 2
        err = capsys.readouterr().err
        assert "no prompts to run" in err and "split 'heldout'" in err and "its splits: outside" in err
        assert "Traceback" not in err
