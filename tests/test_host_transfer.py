"""One device->host transfer per decoding step, through one helper; acceptance on the device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import nanospec
from nanospec import transfer
from nanospec.decoding.accept import greedy_path, sample_path, sample_token
from nanospec.decoding.kv import compact_cache, new_cache
from nanospec.decoding.tree import ancestor_mask, depths_from_parents, tree_attention_mask, tree_position_ids
from nanospec.decoding.verify import target_forward

from .conftest import DEVICE
from .test_sampling import CHI2_001, chi_square

HOT_PATH = ("decoding/engine.py", "decoding/tree.py", "decoding/verify.py", "decoding/accept.py", "decoding/kv.py", "vocab.py", "decoding/eagle.py",
            "decoding/drafter.py", "decoding/copy_branch.py", "decoding/bookkeeping.py", "decoding/budget.py", "decoding/cost_curve.py")
# host values that these modules may convert (not tensors); each entry: (module, argument source)
HOST_CONVERSIONS = {
    ("decoding/engine.py", "getattr(model.config, 'max_position_embeddings', 1 << 30)"),
    ("decoding/engine.py", "getattr(self.tokenizer, 'chat_template', None)"),
    ("decoding/engine.py", "x"), ("decoding/engine.py", "prompt_ids[-1]"), ("decoding/engine.py", "e"),
    ("vocab.py", "capacity"),
}
# root_to_leaf_paths is a reference helper for tests; the engine never calls it
# keep_nodes (the copy chain's PAD nodes and the budget's pruned nodes dropped) and the budget's
# keep_drafting run on a CPU only (a fixed shape, every GPU, disables nodes instead and never stops
# drafting early); drop_padding edits the host lists of a step's event; the budget's cost curve is
# measured or read before a run
HOST_FUNCTIONS = {("decoding/tree.py", "root_to_leaf_paths"), ("decoding/tree.py", "keep_nodes"),
                  ("decoding/copy_branch.py", "drop_padding"), ("decoding/budget.py", "keep_drafting"),
                  ("decoding/cost_curve.py", "measure_cost_curve"), ("decoding/cost_curve.py", "from_dict")}
# host->device copies at prefill, once per request: the prompt, and the draft budget's prices (its cost curve)
PREFILL_COPIES = {("decoding/engine.py", "_prefill"), ("decoding/eagle.py", "begin"), ("decoding/copy_branch.py", "begin"),
                  ("decoding/budget.py", "__init__")}


def _step_counts(engine, prompt, monkeypatch, **options) -> list[int]:
    """to_host calls made by each decoding step (prefill excluded)."""
    calls: list[str] = []
    real = transfer.to_host
    monkeypatch.setattr(transfer, "to_host", lambda *parts: calls.append("read") or real(*parts))
    engine.before_step = lambda step, method: calls.append("step")
    try:
        engine.generate(prompt, **options)
    finally:
        engine.before_step = None
    marks = [i for i, c in enumerate(calls) if c == "step"] + [len(calls)]
    return [b - a - 1 for a, b in zip(marks, marks[1:])]


@pytest.mark.parametrize("method", ["ar", "full", "nanospec", "hybrid"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_host_read_per_step(engine, prompts, monkeypatch, method, temperature):
    counts = _step_counts(engine, prompts[5], monkeypatch, method=method, max_new_tokens=10,
                          temperature=temperature, capacity=256, core_size=128)
    assert counts and counts == [1] * len(counts)


def _host_reads(module: str) -> list[str]:
    tree = ast.parse((Path(nanospec.__file__).parent / module).read_text())
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or (module, fn.name) in HOST_FUNCTIONS:
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if ast.unparse(f) == "torch.tensor" and (module, fn.name) not in PREFILL_COPIES:
                bad.append(f"{module}:{node.lineno} torch.tensor(...) (a host->device copy syncs too)")
            if isinstance(f, ast.Attribute) and f.attr in ("item", "tolist", "cpu", "numpy"):
                bad.append(f"{module}:{node.lineno} .{f.attr}()")
            elif isinstance(f, ast.Name) and f.id in ("int", "bool", "float") and node.args:
                arg = ast.unparse(node.args[0])
                if ".shape[" not in arg and (module, arg) not in HOST_CONVERSIONS:
                    bad.append(f"{module}:{node.lineno} {f.id}({arg})")
    return bad


def test_hot_path_reads_the_host_only_through_transfer():
    bad = [b for m in HOT_PATH for b in _host_reads(m)]
    assert not bad, f"device->host reads outside transfer.to_host: {bad}"


def test_to_host_keeps_types():
    ints, flags, floats = transfer.to_host(torch.tensor([3, 128255]), torch.tensor([True, False]),
                                           torch.tensor([0.5, -1.25]))
    assert ints == [3, 128255] and flags == [True, False] and floats == [0.5, -1.25]
    assert type(ints[0]) is int and type(flags[0]) is bool


def _host_greedy(tokens, parents, argmax):
    path = [0]
    while True:
        kids = [c for c in range(len(parents)) if parents[c] == path[-1] and tokens[c] == argmax[path[-1]]]
        if not kids:
            return path, argmax[path[-1]]
        path.append(kids[0])


def test_greedy_path_equals_walking_the_tree():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        t = 1 + trial % 20
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]
        tokens = torch.randint(0, 3, (t,), generator=g)  # few ids: duplicate siblings happen
        argmax = torch.randint(0, 3, (t,), generator=g)
        path, bonus = _host_greedy(tokens.tolist(), parents, argmax.tolist())
        dp = greedy_path(tokens, torch.tensor(parents), argmax)
        n = int(dp.length)
        assert dp.nodes[:n].tolist() == path and int(dp.bonus) == bonus


def test_sample_path_emits_the_target_distribution():
    """First emitted token (an accepted child or the bonus) ~ p at the root; second ~ its marginal."""
    g = torch.Generator().manual_seed(1)
    v, runs = 6, 4000
    p = torch.softmax(torch.randn(5, v, generator=g) * 1.5, -1)
    parents = torch.tensor([-1, 0, 0, 0, 1])
    tokens = torch.tensor([0, 1, 1, 4, 2])  # node 2 repeats its sibling's token
    gen = torch.Generator().manual_seed(2)
    first = torch.zeros(v)
    for _ in range(runs):
        dp = sample_path(tokens, parents, p, gen)
        nodes = dp.nodes[: int(dp.length)].tolist()
        first[tokens[nodes[1]] if len(nodes) > 1 else dp.bonus[0]] += 1
    stat, df = chi_square(first, p[0])
    assert stat < CHI2_001[df - 1], (first / runs, p[0])


def test_sample_token_draws_only_positive_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 2.0]])
    u = torch.tensor([0.0, 0.999999])
    assert sample_token(probs, u).tolist() == [1, 3]
    draws = sample_token(probs[:1].expand(2000, -1), torch.rand(2000, generator=torch.Generator().manual_seed(0)))
    assert set(draws.tolist()) == {1, 3} and abs((draws == 1).float().mean() - 0.5) < 0.05


def test_kv_compaction_is_in_place(tiny_pair):
    model, _ = tiny_pair
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 32000, (1, 7), generator=g).to(DEVICE)
    parents = torch.tensor([-1, 0, 0, 1, 2], device=DEVICE)
    cache = new_cache()
    target_forward(model, prompt, torch.arange(7, device=DEVICE)[None], cache)
    target_forward(model, torch.randint(0, 32000, (1, 5), generator=g).to(DEVICE),
                   tree_position_ids(depths_from_parents(parents), 7), cache, tree_attention_mask(ancestor_mask(parents), 7))
    before = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    compact_cache(cache, 7, torch.tensor([0, 2, 4], device=DEVICE))
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == before
    assert cache.get_seq_length() == 10
