"""Tree masks, positions, paths and the EAGLE-2 rerank against brute-force constructions."""

from __future__ import annotations

import torch

from nanospec.decoding.tree import (ancestor_mask, depths_from_parents, root_to_leaf_paths, select_tree,
                           tree_attention_mask, tree_position_ids)


def random_parents(t: int, g: torch.Generator) -> torch.Tensor:
    par = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]
    return torch.tensor(par)


def brute_ancestors(par: list[int]) -> list[set[int]]:
    out = []
    for i in range(len(par)):
        s, j = set(), i
        while j >= 0:
            s.add(j)
            j = par[j]
        out.append(s)
    return out


def test_masks_positions_paths_match_brute_force():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        t = 1 + trial % 70
        parents = random_parents(t, g)
        par = parents.tolist()
        anc = brute_ancestors(par)
        mask = ancestor_mask(parents)
        expect = torch.tensor([[j in anc[i] for j in range(t)] for i in range(t)])
        assert torch.equal(mask, expect)
        depths = depths_from_parents(parents)
        assert depths.tolist() == [len(a) - 1 for a in anc]
        prefix = trial % 5
        full = tree_attention_mask(ancestor_mask(parents), prefix)
        assert full.shape == (1, 1, t, prefix + t)
        assert bool(full[0, 0, :, :prefix].all())
        assert torch.equal(full[0, 0, :, prefix:], expect)
        assert tree_position_ids(depths, prefix)[0].tolist() == [prefix + len(a) - 1 for a in anc]
        leaves = [i for i in range(t) if i not in par]
        paths = root_to_leaf_paths(parents)
        assert [p[-1] for p in paths] == leaves
        for p in paths:
            assert p[0] == 0 and set(p) == anc[p[-1]] and p == sorted(p)


def test_select_tree_keeps_best_and_parents_first():
    g = torch.Generator().manual_seed(1)
    for trial in range(100):
        n = 5 + trial % 40
        # candidates in expansion order; a child's score = parent's + a log-prob <= 0
        cpar, scores = [], []
        for i in range(n):
            p = -1 if i < 3 or trial % 7 == 0 else int(torch.randint(0, i, (1,), generator=g))
            base = 0.0 if p < 0 else scores[p]
            cpar.append(p)
            scores.append(base - float(torch.rand((), generator=g)) * 3)
        tokens = torch.arange(100, 100 + n)
        keep = 1 + trial % n
        tree = select_tree(tokens, torch.tensor(cpar), torch.tensor(scores), torch.ones(n, dtype=torch.bool),
                           7, True, keep)
        best = sorted(range(n), key=lambda i: (-scores[i], i))[:keep]
        assert sorted(tree.tokens[1:].tolist()) == sorted(100 + i for i in best)
        par = tree.parents.tolist()
        assert par[0] == -1 and tree.tokens[0] == 7
        for i in range(1, len(par)):
            assert par[i] < i
            cand = tree.tokens[i].item() - 100
            want = cpar[cand]
            got = par[i]
            assert (want == -1 and got == 0) or (got > 0 and tree.tokens[got].item() - 100 == want)
        assert tree.depths.tolist() == depths_from_parents(tree.parents).tolist()
