"""`compare` and `sweep` tables on the tiny random pair (numbers are not timed here, only their shape)."""

from __future__ import annotations

from nanospec.bench import compare, format_table, sweep


def test_compare_runs_every_method_against_ar(engine, prompts):
    table = compare(engine, prompts[:2], ["nanospec", "full"], {"max_new_tokens": 12})
    assert [r["method"] for r in table] == ["ar", "nanospec", "full"]
    assert all(r["identical_to_ar"] is True and r["n_prompts"] == 2 for r in table)
    ar, nano, _ = table
    assert ar["tau"] == 1.0 and ar["mean_active"] is None
    assert 0 < nano["mean_active"] < engine.vocab_size and nano["tau"] >= 1.0
    assert "nanospec" in format_table(table)


def test_sweep_labels_each_tree_setting(engine, prompts):
    trees = [(2, 2, 4), (3, 4, 10)]
    table = sweep(engine, prompts[:2], "nanospec", trees, {"max_new_tokens": 12})
    assert [r["method"] for r in table] == ["ar", "nanospec 2x2x4", "nanospec 3x4x10"]
    assert all(r["identical_to_ar"] is True for r in table)
    # a random head accepts little, but a deeper tree can never accept more than depth + 1 per step
    assert all(1.0 <= r["tau"] <= d + 1 for r, (d, _, _) in zip(table[1:], trees))
    assert "nanospec 3x4x10" in format_table(table)
