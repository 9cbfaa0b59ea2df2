"""Speculative sampling is lossless: generated tokens follow the target's distribution exactly.

On a 16-token vocabulary we compute the exact marginal of the 2nd and 3rd generated tokens
(sum over earlier tokens of the target's warped conditionals) and compare it with the empirical
distribution of 2,000 seeded runs. The 1st token comes from prefill; the 2nd and 3rd come from
speculative steps (accepted drafts or bonus tokens). Chi-square test at significance 0.001.
"""

from __future__ import annotations

import pytest
import torch

from nanospec.decoding.cost_curve import CostCurve
from nanospec.decoding.engine import SpecEngine
from nanospec.decoding.kv import new_cache
from nanospec.bench.random_pair import random_head, random_target, random_target_config
from nanospec.decoding.verify import target_forward, warp_probs

from .conftest import DEVICE

V = 16
RUNS = 2000
# chi-square critical values at p = 0.001 for df = 1..15
CHI2_001 = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70]


def next_probs(model, seq, temperature, top_p):
    out = target_forward(model, torch.tensor([seq], device=DEVICE), torch.arange(len(seq), device=DEVICE)[None],
                         new_cache())
    return warp_probs(out.logits[-1], temperature, top_p).cpu()


def exact_marginals(model, prompt, temperature, top_p):
    p1 = next_probs(model, prompt, temperature, top_p)
    p2 = torch.zeros(V)
    p3 = torch.zeros(V)
    for a in range(V):
        if p1[a] == 0:
            continue
        q2 = next_probs(model, prompt + [a], temperature, top_p)
        p2 += p1[a] * q2
        for b in range(V):
            if q2[b] == 0:
                continue
            p3 += p1[a] * q2[b] * next_probs(model, prompt + [a, b], temperature, top_p)
    return p2, p3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pool cells with expected count < 5 into one; return (statistic, degrees of freedom)."""
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs_cells = torch.cat([counts[big].double(), counts[~big].sum().double().reshape(1)])
    exp_cells = torch.cat([exp[big].double(), exp[~big].sum().double().reshape(1)])
    if exp_cells[-1] < 5:  # fold the pooled cell into the smallest big cell
        obs_cells[-2] += obs_cells[-1]
        exp_cells[-2] += exp_cells[-1]
        obs_cells, exp_cells = obs_cells[:-1], exp_cells[:-1]
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    return stat, len(obs_cells) - 1


@pytest.fixture(scope="module")
def small_pair():
    cfg = random_target_config(V, 32, 2, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    model = random_target(cfg, seed=4).to(DEVICE)
    # sharpen the random target a little so that drafts are accepted and rejected often
    model.lm_head.weight.mul_(6.0)
    return model, random_head(model.config, seed=5).to(DEVICE)


@pytest.mark.parametrize("method,temperature,top_p,copy_branch,fixed_shape,budget",
                         [("nanospec", 1.0, 1.0, 0, False, False), ("full", 0.7, 0.8, 0, False, False),
                          ("nanospec", 1.0, 1.0, 2, False, False), ("hybrid", 1.0, 1.0, 2, True, False),
                          ("hybrid", 1.0, 1.0, 2, True, True)])
def test_speculative_sampling_matches_target_distribution(small_pair, method, temperature, top_p, copy_branch,
                                                          fixed_shape, budget):
    """`fixed_shape`: the GPU's tree (the copy chain's unused slots verified as PAD nodes).
    `budget`: the draft budget on a made-up cost curve that makes it prune, on the fixed shape,
    where pruned nodes stay in the tree, disabled for acceptance (on the CPU's shape a pruned tree
    is just a smaller tree)."""
    model, head = small_pair
    prompt = [3, 9, 1, 14, 3]
    engine = SpecEngine(model, None, head, eos_token_ids=[], frequent_ids=torch.randperm(V, generator=torch.Generator().manual_seed(6)))
    curve = CostCurve([1, 2, 4, 8, 16], [10.0 + 0.5 * n for n in (1, 2, 4, 8, 16)], {}) if budget else None
    pruned = 0
    p2, p3 = exact_marginals(model, prompt, temperature, top_p)
    c2, c3 = torch.zeros(V), torch.zeros(V)
    accepted = copy_steps = copied = 0
    for seed in range(RUNS):
        if budget:  # each run a fresh request: no acceptance statistics carried over from the last one
            engine.use_cost_curve(curve)
        r = engine.generate(prompt, method=method, max_new_tokens=3, temperature=temperature, top_p=top_p,
                            seed=seed, depth=2, top_k=3, total_tokens=6, capacity=4, copy_branch=copy_branch,
                            fixed_shape=fixed_shape, core_size=4, budget=budget)
        pruned += sum(e.drafted_nodes > len(e.tree_tokens) for e in r.events)
        c2[r.token_ids[1]] += 1
        c3[r.token_ids[2]] += 1
        accepted += sum(len(e.accepted_tokens) for e in r.events)
        copy_steps += sum("copy" in e.tree_sources for e in r.events)
        copied += r.summary.accepted_by_source["copy"]
    assert accepted > RUNS * 0.3, "drafts were rarely accepted: the test would not exercise rejection"
    if budget:
        assert pruned > RUNS * 0.1, f"the budget pruned only {pruned} trees: the test would not exercise it"
    if copy_branch:  # the copy chain's own nodes (not shared with the head's) were in the trees
        assert copy_steps > RUNS * 0.1, f"only {copy_steps} steps had a copy-chain node"
        assert copied > 0, "no copy-chain token was ever accepted"
    for counts, probs in ((c2, p2), (c3, p3)):
        stat, df = chi_square(counts, probs)
        assert stat < CHI2_001[df - 1], f"chi2={stat:.1f} df={df}: empirical {counts/RUNS} vs exact {probs}"


def test_chi_square_detects_a_wrong_distribution():
    """The statistic above has power: a distribution off by a few points is rejected."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(V, generator=g) * 2, 0)
    wrong = probs.clone()
    wrong[probs.argmax()] -= 0.05
    wrong[probs.argmin()] += 0.05
    counts = torch.bincount(torch.multinomial(wrong, RUNS, replacement=True, generator=g), minlength=V)
    stat, df = chi_square(counts.float(), probs)
    assert stat > CHI2_001[df - 1]
