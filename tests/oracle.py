"""Test oracles: a drafter that knows the target's greedy continuation, and the greedy acceptance rule
walked on host lists.

`OracleDrafter` puts the target's true greedy continuation on one branch of the tree. It implements
the same three-call drafter interface as `EagleDrafter`, so the engine's verification, acceptance,
bonus token and KV compaction are exercised with long accepted paths.

`greedy_accept` is the greedy rule written as the plain tree walk, independently of the device
version (`nanospec.decoding.accept.greedy_path`, which decides every node at once).
"""

from __future__ import annotations

import torch

from nanospec.decoding.tree import DraftTree, depths_from_parents


class OracleDrafter:
    def __init__(self, truth: list[int], vocab_size: int, correct: int | None = None, decoys: int = 2,
                 seed: int = 0):
        self.truth = list(truth)        # the target's greedy output, first generated token first
        self.vocab_size = vocab_size
        self.correct = correct          # only this many true tokens per branch, then wrong ones
        self.decoys = decoys
        self.rng = torch.Generator().manual_seed(seed)
        self.pos = 0

    def begin(self, prompt_ids, features, next_token: int) -> None:
        assert next_token == self.truth[0]
        self.pos = 1                    # index in truth of the token after the root

    def update(self, features, next_tokens, timer) -> None:
        self.pos += int(next_tokens.shape[0])

    def draft(self, root, vocab, tree, timer) -> DraftTree:
        tokens, parents = [int(root)], [-1]
        chain_parent = 0
        for d in range(tree.depth):
            i = self.pos + d
            true = self.truth[i] if i < len(self.truth) else 0
            tok = true if self.correct is None or d < self.correct else (true + 7) % self.vocab_size
            level = [(true + 1 + j) % self.vocab_size for j in range(self.decoys)] + [tok]
            order = torch.randperm(len(level), generator=self.rng).tolist()  # true branch not always first
            for j in order:
                if len(tokens) >= tree.total_tokens:
                    break
                tokens.append(level[j])
                parents.append(chain_parent)
                if j == len(level) - 1:
                    chain_idx = len(tokens) - 1
            else:
                chain_parent = chain_idx
                continue
            break
        t = torch.tensor(tokens, device=root.device)
        p = torch.tensor(parents, device=root.device)
        d = depths_from_parents(p)
        return DraftTree(t, p, d, -d.float(), vocab.contains(t))


def greedy_accept(tokens: list[int], parents: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Walk from the root, each time to the first child whose token is the target's argmax at the node.

    Returns (accepted node path starting with the root node 0, bonus token = argmax at its end).
    """
    path = [0]
    while True:
        want = target_argmax[path[-1]]
        nxt = next((c for c, p in enumerate(parents) if p == path[-1] and tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
