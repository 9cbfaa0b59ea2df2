"""The lesson's sampling material: one recorded run at temperature > 0 and an empirical check.

`trials(...)` rebuilds, for every step of a recorded sampling run, what the acceptance rule did:
which drafted tokens were tried at each node of the accepted path, the target's probability p(x)
of each, the probability with which it was accepted (p(x) over the mass left after earlier
rejections) and the outcome; the target's probabilities come from one teacher-forced forward
over prompt + output. `first_token_distribution(...)` runs the same configuration with many seeds
and counts the first token written by a speculative step, next to the target's own distribution
for that position: speculative sampling must leave it unchanged.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

from nanospec.config import GenerationConfig
from nanospec.decoding.tree import children_lists
from nanospec.decoding.verify import warp_probs

# the recorded sampling run: NanoSpec's tree and vocabulary, sampled at T = 0.8
SAMPLING = {"method": "nanospec", "temperature": 0.8, "top_p": 1.0, "seed": 0, "copy_branch": 0}
TOP_SHOWN = 12   # target tokens kept per distribution (the rest is summed as "other")


@torch.inference_mode()
def target_probs(engine, ids: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """The target's warped next-token distribution at every position of `ids`: [n, V] on CPU."""
    x = torch.tensor([ids], device=engine.device)                      # [1, n]
    logits = engine.model(input_ids=x).logits[0]                       # [n, V]
    return warp_probs(logits, temperature, top_p).cpu()


def _tried(tokens: list[int], kids: list[int], p_row: torch.Tensor, chosen: int | None) -> list[dict]:
    """The children of one node as the rule tried them, in draft order, until `chosen` (None = all)."""
    left = float(p_row.sum())
    out = []
    for c in kids:
        x = tokens[c]
        p = float(p_row[x])
        out.append({"token": x, "p": p, "accept_prob": p / left if left > 0 else 0.0, "accepted": c == chosen})
        if c == chosen:
            break
        left -= p
    return out


def step_trials(event: dict, base: int, probs: torch.Tensor) -> list[dict]:
    """One step's acceptance log, one entry per node of the accepted path.

    `base` is the row of `probs` that predicts the step's first token (the root's position).
    """
    tokens, parents, path = event["tree_tokens"], event["tree_parents"], event["accepted_path"]
    kids = children_lists(parents)
    levels = []
    for depth, node in enumerate(path):
        row = base + depth
        if row >= probs.shape[0]:
            break   # the step was cut at EOS or the token budget
        chosen = path[depth + 1] if depth + 1 < len(path) else None
        tried = _tried(tokens, kids[node], probs[row], chosen)
        level = {"depth": depth, "tried": tried}
        if chosen is None:   # every child rejected: the bonus is drawn from what is left
            left = float(probs[row].sum()) - sum(t["p"] for t in tried)
            p = float(probs[row][event["bonus_token"]])
            level["bonus"] = {"token": event["bonus_token"], "p": p, "residual_p": p / left if left > 0 else 0.0}
        levels.append(level)
    return levels


def trials(engine, doc: dict, temperature: float, top_p: float, top_k: int = 8) -> list[dict]:
    """Acceptance logs of every step of a recorded run (`record.record_run`'s document)."""
    prompt, output = doc["meta"]["prompt_ids"], doc["summary"]["output_ids"]
    probs = target_probs(engine, prompt + output, temperature, top_p)   # row i predicts token i + 1
    out, written = [], 0
    for event in doc["events"]:
        base = len(prompt) + written - 1
        entry = {"step": event["step"], "levels": []}
        if event["step"] > 0:
            entry["levels"] = step_trials(event, base, probs)
            top = torch.topk(probs[base], top_k)
            entry["target_top"] = [[int(t), float(p)] for p, t in zip(top.values, top.indices)]
        out.append(entry)
        written += len(event["tokens"])
    return out


def first_token_distribution(engine, messages, runs: int, options: dict = SAMPLING) -> dict:
    """`runs` seeded runs of two tokens each: the first comes from the target at prefill, the second from
    the first speculative step. Among runs that share the most common first token, count the second
    and set the counts next to the target's own distribution at that position."""
    if runs < 1:
        raise ValueError(f"sampling runs must be >= 1; got {runs}")
    prompt_ids = engine.encode(messages)
    pairs = []
    for seed in range(runs):
        cfg = GenerationConfig.build(max_new_tokens=2, **{**options, "seed": seed})
        ids = engine.generate(prompt_ids, cfg).summary.output_ids
        if len(ids) == 2:
            pairs.append(tuple(ids))
        if (seed + 1) % 50 == 0:
            print(f"    sampling check: {seed + 1}/{runs} runs", file=sys.stderr)
    if not pairs:
        raise ValueError("no run wrote two tokens (EOS first?); choose another prompt")
    first = Counter(a for a, _ in pairs).most_common(1)[0][0]
    counts = Counter(b for a, b in pairs if a == first)
    p = target_probs(engine, prompt_ids + [first], options["temperature"], options["top_p"])[-1]   # [V]
    shown = sorted(set(torch.topk(p, TOP_SHOWN).indices.tolist()) | set(counts), key=lambda t: -float(p[t]))
    kept = sum(counts.values())
    return {"runs": runs, "first_token": first, "kept": kept, "config": dict(options),
            "tokens": [{"token": t, "p": float(p[t]), "count": counts.get(t, 0)} for t in shown],
            "other_p": max(0.0, 1.0 - sum(float(p[t]) for t in shown)),
            "total_variation": total_variation(counts, p, kept),
            "total_variation_exact": exact_sampling_tv(p, kept),
            "token_text": {str(t): engine.tokenizer.decode([t], skip_special_tokens=False) for t in shown}}


def total_variation(counts: Counter, p: torch.Tensor, kept: int) -> float:
    """½ Σ |empirical − target| over every token (tokens never drawn contribute their target mass)."""
    seen = sum(abs(c / kept - float(p[t])) for t, c in counts.items())
    unseen = 1.0 - sum(float(p[t]) for t in counts)
    return 0.5 * (seen + max(0.0, unseen))


def exact_sampling_tv(p: torch.Tensor, kept: int, repeats: int = 200, seed: int = 0) -> float:
    """Median total variation of `kept` draws taken straight from `p`: what sampling noise alone gives,
    the yardstick for the speculative runs' figure."""
    gen = torch.Generator().manual_seed(seed)
    tvs = []
    for _ in range(repeats):
        draws = Counter(torch.multinomial(p, kept, replacement=True, generator=gen).tolist())
        tvs.append(total_variation(draws, p, kept))
    tvs.sort()
    return tvs[len(tvs) // 2]
