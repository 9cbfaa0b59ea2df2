"""The copy branch's pieces: the lookup against a brute-force Python version, the tree merge."""

from __future__ import annotations

import pytest
import torch

from nanospec.decoding.copy_branch import (BOTH, COPY, HEAD, MATCH_CAP, PAD, ROOT, CopyBranch, CopyChain, drop_pad_nodes, drop_padding,
                                  lookup_continuation, merge_copy_chain)
from nanospec.decoding.tree import DraftTree, depths_from_parents

from .oracle import greedy_accept


def brute_force_lookup(seq: list[int], n_tokens: int, max_ngram: int) -> list[int]:
    """transformers' prompt lookup, written as plain loops over Python lists."""
    n = len(seq)
    for g in range(min(max_ngram, n - 1), 0, -1):
        tail = seq[n - g:]
        for i in range(n - g + 1):
            if seq[i:i + g] == tail and i + g < n:
                return seq[i + g: min(i + g + n_tokens, n)]
    return []


def brute_force_match(seq: list[int], max_ngram: int) -> int:
    """How many tokens, read backwards from the end of the n-gram prompt lookup copies after, equal the
    sequence's last ones (0 without a match), with the same loops as `brute_force_lookup`."""
    n = len(seq)
    for g in range(min(max_ngram, n - 1), 0, -1):
        for i in range(n - g + 1):
            if seq[i:i + g] == seq[n - g:] and i + g < n:
                end, m = i + g - 1, 0
                while m < MATCH_CAP and end - m >= 0 and end - m < n - 1 - m and seq[end - m] == seq[n - 1 - m]:
                    m += 1
                return m
    return 0


@pytest.mark.parametrize("vocab", [2, 3, 5, 50])
def test_lookup_matches_brute_force_on_random_sequences(vocab):
    g = torch.Generator().manual_seed(vocab)
    checked_hits = 0
    for trial in range(300):
        n = int(torch.randint(1, 40, (1,), generator=g))
        seq = torch.randint(0, vocab, (n,), generator=g)
        n_tokens = int(torch.randint(1, 7, (1,), generator=g))
        max_ngram = int(torch.randint(1, 5, (1,), generator=g))
        want = brute_force_lookup(seq.tolist(), n_tokens, max_ngram)
        chain = lookup_continuation(seq, n_tokens, max_ngram)
        length = int(chain.length)
        assert chain.tokens.shape == (n_tokens,)
        assert chain.tokens[:length].tolist() == want, (seq.tolist(), n_tokens, max_ngram)
        checked_hits += bool(want)
    assert checked_hits > 50  # the random sequences exercise matches, not only misses


def test_brute_force_agrees_with_transformers_prompt_lookup():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        seq = torch.randint(0, 4, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g)
        gen = PromptLookupCandidateGenerator(num_output_tokens=3, max_matching_ngram_size=2, max_length=1000)
        candidates, _ = gen.get_candidates(seq[None])
        assert candidates[0, seq.shape[0]:].tolist() == brute_force_lookup(seq.tolist(), 3, 2)


def test_lookup_prefers_longest_ngram_then_earliest_match():
    #            0  1  2  3  4  5  6  7  8
    seq = torch.tensor([7, 1, 2, 9, 8, 2, 5, 1, 2])
    # last bigram (1, 2) occurs at 0 -> continuation 9, 8, 2 ; the unigram 2 would give 9 or 5
    assert lookup_continuation(seq, 3, 2).tokens.tolist() == [9, 8, 2]
    assert lookup_continuation(seq, 3, 1).tokens.tolist() == [9, 8, 2]  # earliest "2" is at 2
    chain = lookup_continuation(torch.tensor([4, 5, 6]), 3, 2)           # no earlier 6
    assert int(chain.length) == 0


def test_match_length_counts_the_tokens_before_the_copy_that_equal_the_context_end():
    #                    0  1  2  3  4  5  6  7  8  9
    seq = torch.tensor([3, 7, 1, 2, 9, 5, 7, 1, 2, 4])
    assert int(lookup_continuation(seq, 3, 2).match) == 0                  # no earlier 4
    seq = torch.tensor([3, 7, 1, 2, 9, 5, 7, 1, 2])
    chain = lookup_continuation(seq, 3, 2)                                  # (1, 2) at 2-3, and 7 before both
    assert chain.tokens.tolist() == [9, 5, 7] and int(chain.match) == 3
    g = torch.Generator().manual_seed(5)
    for _ in range(300):                       # against a brute force, on random sequences with repeats
        s = torch.randint(0, 3, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
        assert int(lookup_continuation(torch.tensor(s), 4, 2).match) == brute_force_match(s, 2), s


def test_copy_branch_context_grows_and_keeps_tokens():
    ctx = CopyBranch(3, capacity=4)
    ctx.begin(torch.tensor([1, 2, 3]), 4)
    ctx.append(torch.tensor([5, 1, 2]))
    assert ctx.tokens.tolist() == [1, 2, 3, 4, 5, 1, 2]
    chain = ctx.lookup()
    assert chain.tokens[: int(chain.length)].tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="n_tokens"):
        CopyBranch(0)


def make_tree(tokens: list[int], parents: list[int]) -> DraftTree:
    p = torch.tensor(parents)
    d = depths_from_parents(p)
    return DraftTree(torch.tensor(tokens), p, d, -d.float(), torch.ones(len(tokens), dtype=torch.bool))


def chain(tokens: list[int], length: int) -> CopyChain:
    return CopyChain(torch.tensor(tokens), torch.tensor(length))


# root 0 (token 100); children 1 (10), 2 (11); 3 (20) under 1; 4 (21) under 1; 5 (30) under 3
HEAD_TREE = ([100, 10, 11, 20, 21, 30], [-1, 0, 0, 1, 1, 3])


def merged(c: CopyChain) -> tuple[list[int], list[int], list[int], list[int]]:
    tree = merge_copy_chain(make_tree(*HEAD_TREE), c, torch.ones(c.tokens.shape[0], dtype=torch.bool))
    return tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist(), tree.sources.tolist()


def test_merge_chain_sharing_a_prefix_continues_from_the_shared_node():
    tokens, parents, depths, sources = merged(chain([10, 20, 40, 41], 4))
    assert tokens[:6] == HEAD_TREE[0] and parents[:6] == HEAD_TREE[1]
    assert sources[:6] == [ROOT, BOTH, HEAD, BOTH, HEAD, HEAD]
    # chain positions 0, 1 are nodes 1, 3; 40 hangs off node 3, 41 off 40; two PAD slots
    assert tokens[6:] == [10, 10, 40, 41]
    assert sources[6:] == [PAD, PAD, COPY, COPY]
    assert parents[8] == 3 and parents[9] == 8
    assert depths[8:] == [3, 4]
    assert depths == depths_from_parents(torch.tensor(parents)).tolist()


def test_merge_disjoint_chain_hangs_off_the_root_and_short_chain_pads():
    tokens, parents, depths, sources = merged(chain([12, 13, 0], 2))
    assert sources[6:] == [COPY, COPY, PAD]
    assert tokens[6:8] == [12, 13] and parents[6:8] == [0, 6] and depths[6:8] == [1, 2]
    assert tokens[8] == 10 and parents[8] == 0  # PAD: a later duplicate of node 1


def test_merge_chain_fully_inside_the_tree_adds_nothing_and_no_match_adds_nothing():
    _, _, _, sources = merged(chain([10, 20, 30], 3))
    assert sources == [ROOT, BOTH, HEAD, BOTH, HEAD, BOTH, PAD, PAD, PAD]
    _, _, _, sources = merged(chain([10, 20, 30], 0))
    assert sources == [ROOT, HEAD, HEAD, HEAD, HEAD, HEAD, PAD, PAD, PAD]


def test_merge_only_a_full_root_path_counts_as_shared():
    # 21 sits under 10 in the tree, but the chain starts with 11: no sharing below depth 1
    tokens, parents, _, sources = merged(chain([11, 21], 2))
    assert sources[:6] == [ROOT, HEAD, BOTH, HEAD, HEAD, HEAD]
    assert sources[6:] == [PAD, COPY] and tokens[7] == 21 and parents[7] == 2


def test_pad_nodes_are_never_accepted_and_drop_padding_reindexes():
    tree = merge_copy_chain(make_tree(*HEAD_TREE), chain([10, 20, 40, 41], 4), torch.ones(4, dtype=torch.bool))
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    argmax = [10, 20, 0, 40, 0, 0, 0, 0, 41, 7]  # the target follows the chain to its end
    path, bonus = greedy_accept(tokens, parents, argmax)
    assert path == [0, 1, 3, 8, 9] and bonus == 7
    nodes = {"tokens": tokens, "parents": parents, "sources": tree.sources.tolist()}
    out, new_path = drop_padding(nodes, path)
    assert out["tokens"] == HEAD_TREE[0] + [40, 41]
    assert out["parents"] == HEAD_TREE[1] + [3, 6]
    assert new_path == [0, 1, 3, 6, 7]
    assert PAD not in out["sources"]


@pytest.mark.parametrize("tokens, length", [([10, 20, 40, 41], 4), ([11, 21], 2), ([12, 13, 0], 2),
                                            ([10, 20, 30], 3), ([10, 20, 30], 0)])
def test_drop_pad_nodes_keeps_every_real_node_and_its_root_path(tokens, length):
    tree = merge_copy_chain(make_tree(*HEAD_TREE), chain(tokens, length), torch.ones(len(tokens), dtype=torch.bool))
    out = drop_pad_nodes(tree)
    keep = [i for i, s in enumerate(tree.sources.tolist()) if s != PAD]
    assert out.tokens.tolist() == [tree.tokens[i].item() for i in keep]
    assert out.sources.tolist() == [tree.sources[i].item() for i in keep] and PAD not in out.sources.tolist()
    assert out.depths.tolist() == depths_from_parents(out.parents).tolist()

    def spelled(t, i):  # the tokens on node i's root path
        path = []
        while i >= 0:
            path.append(t.tokens[i].item())
            i = t.parents[i].item()
        return path[::-1]

    assert [spelled(out, k) for k in range(len(out))] == [spelled(tree, i) for i in keep]


def test_merge_rejects_a_root_only_tree():
    with pytest.raises(ValueError, match="at least one node"):
        merge_copy_chain(make_tree([5], [-1]), chain([1], 1), torch.ones(1, dtype=torch.bool))
