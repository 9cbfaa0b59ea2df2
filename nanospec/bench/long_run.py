"""Memory over a long run: resident memory every N new tokens against the KV cache's own growth.

    python -m nanospec.bench.long_run                          # default pair, nanospec, 2,000 new tokens
    python -m nanospec.bench.long_run --method ar --max-new-tokens 2000 --every 250

Prints, every `--every` tokens, the process's anonymous resident memory (Linux /proc: the heap,
i.e. tensors; file-backed pages such as the mapped weights are left out), the KV cache's size at
that length (2 x layers x kv heads x head dim x positions x bytes per value) and their difference.
Memory is "flat apart from the KV cache" when that difference stays level over the run.
The run ignores end-of-sequence, so it always decodes the full count (unless the context fills).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanospec.config import GenerationConfig

PROMPT = "Write a long, detailed story about a lighthouse keeper and the ships she guides, chapter by chapter."


def anon_rss_mb() -> float:
    """This process's anonymous resident memory (RssAnon) in MiB; NaN where /proc has no such line."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def kv_bytes_per_position(model) -> int:
    """Bytes the KV cache holds per position: keys and values of every layer."""
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    element = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * element


def measure(engine, prompt, cfg: GenerationConfig, every: int) -> list[dict]:
    """One row per `every` new tokens (and the start): tokens, positions, RSS, KV size, RSS - KV."""
    run = engine.stream(prompt, cfg)
    per_pos = kv_bytes_per_position(engine.model)
    rows: list[dict] = []
    emitted, next_mark = 0, 0
    for event in run:
        emitted += len(event.tokens)
        if emitted >= next_mark:
            positions = len(run.prompt_ids) + emitted
            rss, kv = anon_rss_mb(), positions * per_pos / 2**20
            rows.append({"tokens": emitted, "positions": positions, "anon_rss_mb": rss, "kv_mb": kv,
                         "rss_minus_kv_mb": rss - kv})
            next_mark = (emitted // every + 1) * every
    rows[-1]["stop_reason"] = run.summary.stop_reason if run.summary else "stopped"
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="nanospec")
    parser.add_argument("--max-new-tokens", type=int, default=2000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    from nanospec.pair import load_pair

    engine, info = load_pair(device=args.device)
    cfg = GenerationConfig.build(args.method, max_new_tokens=args.max_new_tokens)
    cfg.stop_on_eos = False
    engine.generate(args.prompt, GenerationConfig.build(args.method, max_new_tokens=8))  # warm-up
    rows = measure(engine, args.prompt, cfg, args.every)
    print(f"{info.target} | {args.method} | {info.device} {info.dtype} | KV cache "
          f"{kv_bytes_per_position(engine.model) / 1024:.1f} KiB per position")
    print(f"{'tokens':>7} {'positions':>9} {'anon RSS MB':>11} {'KV MB':>7} {'RSS - KV MB':>11}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['positions']:>9} {r['anon_rss_mb']:>11.1f} {r['kv_mb']:>7.1f} "
              f"{r['rss_minus_kv_mb']:>11.1f}")
    first, last = rows[0], rows[-1]
    print(f"over {last['tokens'] - first['tokens']} tokens: anon RSS {last['anon_rss_mb'] - first['anon_rss_mb']:+.1f} MB, "
          f"KV {last['kv_mb'] - first['kv_mb']:+.1f} MB, RSS - KV {last['rss_minus_kv_mb'] - first['rss_minus_kv_mb']:+.1f} MB "
          f"(stop: {last['stop_reason']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
