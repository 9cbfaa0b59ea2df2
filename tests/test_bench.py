"""`compare` and `sweep` tables on the tiny random pair (numbers are not timed here, only their shape)."""

from __future__ import annotations

import pytest

from nanospec.bench.compare import by_category, compare, format_by_category, format_table, resident_split_mb, sweep


def test_compare_runs_every_method_against_ar(engine, prompts):
    table = compare(engine, prompts[:2], ["nanospec", "full"], {"max_new_tokens": 12})
    assert [r["method"] for r in table] == ["ar", "nanospec", "full"]
    assert all(r["identical_to_ar"] is True and r["n_prompts"] == 2 for r in table)
    ar, nano, _ = table
    assert ar["tau"] == 1.0 and ar["mean_active"] is None
    assert 0 < nano["mean_active"] < engine.vocab_size and nano["tau"] >= 1.0
    assert "nanospec" in format_table(table)
    assert ar["per_prompt_speedup"] == [1.0, 1.0] and ar["per_prompt_tau"] == [1.0, 1.0]
    assert len(nano["per_prompt_tau"]) == 2 and min(nano["per_prompt_tau"]) >= 1.0
    # the pooled τ lies between the per-prompt ones
    assert min(nano["per_prompt_tau"]) <= nano["tau"] <= max(nano["per_prompt_tau"])


def test_sweep_labels_each_tree_setting(engine, prompts):
    trees = [(2, 2, 4), (3, 4, 10)]
    table = sweep(engine, prompts[:2], "nanospec", trees, {"max_new_tokens": 12})
    assert [r["method"] for r in table] == ["ar", "nanospec 2x2x4", "nanospec 3x4x10"]
    assert all(r["identical_to_ar"] is True for r in table)
    # a random head accepts little, but a deeper tree can never accept more than depth + 1 per step
    assert all(1.0 <= r["tau"] <= d + 1 for r, (d, _, _) in zip(table[1:], trees))
    assert "nanospec 3x4x10" in format_table(table)


def test_by_category_groups_per_prompt_numbers():
    table = [
        {"method": "ar", "per_prompt_tau": [1.0] * 6, "per_prompt_speedup": [1.0] * 6},
        {"method": "nanospec", "per_prompt_tau": [2.0, 3.0, 1.0, 2.5, 3.5, 1.5],
         "per_prompt_speedup": [1.2, 1.4, 0.8, 1.0, 1.6, 0.9]},
        {"method": "prompt_lookup", "per_prompt_tau": None, "per_prompt_speedup": [2.0, 1.0, 1.0, 3.0, 1.0, 1.0]},
    ]
    # 3 prompts, 2 repeats: index i is prompt i % 3
    rows = by_category(table, ["math", "math", "code"])
    assert [(r["category"], r["n_prompts"]) for r in rows] == [("math", 2), ("code", 1)]
    math, code = rows
    assert math["nanospec"]["tau"] == (2.0 + 3.0 + 2.5 + 3.5) / 4 and math["nanospec"]["speedup"] == pytest.approx(1.3)
    assert code["nanospec"]["tau"] == 1.25 and code["nanospec"]["speedup"] == pytest.approx(0.85)
    assert code["prompt_lookup"]["tau"] is None and math["prompt_lookup"]["speedup"] == 1.5
    text = format_by_category(rows, ["nanospec", "prompt_lookup"])
    assert "math (2)" in text and "1.30x" in text


def test_resident_split_reads_proc_status():
    status = "Name:\tpython\nVmRSS:\t  1536000 kB\nRssAnon:\t  1024000 kB\nRssFile:\t   512000 kB\nRssShmem:\t0 kB\n"
    assert resident_split_mb(status) == {"rss": 1500.0, "anon": 1000.0, "file": 500.0}
    assert resident_split_mb("Name:\tpython\n") is None   # not Linux-like: no split, no crash


def test_compare_and_sweep_run_each_copy_branch_length(engine, prompts):
    repeating = [p[:6] * 4 for p in prompts[:2]]
    table = compare(engine, repeating, ["nanospec"], {"max_new_tokens": 12}, variants={"copy_branch": (0, 3)})
    assert [r["method"] for r in table] == ["ar", "nanospec", "nanospec+copy3"]
    assert all(r["identical_to_ar"] is True for r in table)
    assert table[1]["accepted_share"] is None or not table[1]["accepted_share"].get("copy")
    assert "nanospec+copy3" in format_table(table)
    rows = sweep(engine, repeating, "full", [(2, 2, 4)], {"max_new_tokens": 12}, variants={"copy_branch": (0, 2)})
    assert [r["method"] for r in rows] == ["ar", "full 2x2x4", "full 2x2x4+copy2"]
    assert all(r["identical_to_ar"] is True for r in rows)


def test_compare_runs_every_combination_of_the_varied_list_options(engine, prompts, monkeypatch):
    """Two list options varied at once (the copy chain and the retrieved branch): one row per combination,
    each run with its own values, ar once."""
    seen = {}
    real = engine.generate
    monkeypatch.setattr(engine, "generate", lambda p, cfg: seen.setdefault(cfg.method, set()).add(
        (cfg.tree.copy_branch, cfg.tree.retrieval_nodes)) or real(p, cfg))
    table = compare(engine, prompts[:1], ["nanospec"], {"max_new_tokens": 6},
                    variants={"copy_branch": (0, 4), "retrieval_nodes": (0, 8)})
    assert [r["method"] for r in table] == ["ar", "nanospec", "nanospec+retr8", "nanospec+copy4",
                                            "nanospec+copy4+retr8"]
    assert seen["nanospec"] == {(0, 0), (0, 8), (4, 0), (4, 8)}
    assert all(r["identical_to_ar"] is True for r in table)


def test_compare_times_transformers_generate_as_a_reference_row(engine, prompts):
    """`hf_generate`: transformers' own greedy generate() on the same model, beside ar (same outputs at
    temperature 0), reported but never counted as one of this engine's drafting methods."""
    table = compare(engine, prompts[:2], ["nanospec"], {"max_new_tokens": 10, "stop_on_eos": False},
                    hf_generate=True)
    rows = {r["method"]: r for r in table}
    assert set(rows) == {"ar", "nanospec", "hf_generate"}
    hf = rows["hf_generate"]
    assert hf["identical_to_ar"] is True and hf["n_prompts"] == 2 and hf["new_tokens"] == 20
    assert hf["tokens_per_s"] > 0 and len(hf["per_prompt_speedup"]) == 2
    assert hf["draft_ms_per_step"] is None and hf["mean_active"] is None


def test_hf_generate_runs_on_the_model_it_is_given(engine, prompts, tiny_pair):
    """`hf_model`: generate() runs on that model (here a second copy of the target with none of the engine's
    packed linears or fused norms), not on the engine's."""
    from nanospec.bench.random_pair import random_target
    stock = random_target(tiny_pair[0].config, seed=0).to(engine.device).eval()
    calls = []
    stock.register_forward_pre_hook(lambda module, args: calls.append(1))
    table = compare(engine, prompts[:2], ["nanospec"], {"max_new_tokens": 6, "stop_on_eos": False},
                    hf_generate=True, hf_model=stock)
    hf = {r["method"]: r for r in table}["hf_generate"]
    assert hf["n_prompts"] == 2 and hf["new_tokens"] == 12
    assert len(calls) >= 2 * 6  # one forward per generated token at least, on the stock copy
    assert not any(type(m).__name__ in ("PackedLinear", "FusedRMSNorm") for m in stock.modules())


def test_compare_reports_the_draft_budgets_calibration(engine, prompts, capsys):
    """Per budgeted row: the tokens a step its kept trees were expected to bring against those they brought
    (each step's accepted drafts + the bonus), printed under the table; none without the budget."""
    from nanospec.cli.report import print_table
    table = compare(engine, prompts[:2], ["nanospec"], {"max_new_tokens": 12}, budgets=(False, True))
    rows = {r["method"]: r for r in table}
    assert set(rows) == {"ar", "nanospec", "nanospec+budget"}
    assert rows["ar"]["budget_expected"] is None and rows["nanospec"]["budget_expected"] is None
    budgeted = rows["nanospec+budget"]
    assert budgeted["budget_expected"] >= 1.0 and budgeted["budget_brought"] >= 1.0
    assert budgeted["budget_brought"] == pytest.approx(budgeted["tau"], rel=0.2)  # the last step may be cut
    print_table("header", table)
    out = capsys.readouterr().out
    assert f"expected to bring {budgeted['budget_expected']:.2f} tokens a step" in out
    assert f"and brought {budgeted['budget_brought']:.2f}" in out


def test_compiled_forward_bench_decodes_greedily_and_compares_rows():
    """The compile bench's eager path: its cached steps are the model's greedy decoding (recomputed from
    scratch here) and a one-token forward after the prompt is the first step, bit for bit (cache cropped
    back to the prompt in between)."""
    import torch

    from nanospec.bench.compiled_forward import measure
    from nanospec.bench.random_pair import random_target, random_target_config

    model = random_target(random_target_config(512, 32, 2, heads=2, kv_heads=1, intermediate=64,
                                               max_positions=128), seed=4).eval()
    prompt = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(2))
    r = measure(model, prompt, steps=6, sizes=[1, 4], repeats=1)
    seq = prompt[0].tolist()
    with torch.inference_mode():
        for _ in range(7):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    assert r["tokens"] == seq[10:]
    assert r["row_diff"][1] == 0.0
    assert set(r["forward_ms"]) == {1, 4} and all(ms > 0 for ms in r["forward_ms"].values())
