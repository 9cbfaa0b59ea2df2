"""What the `nanospec` command prints: one printer for a run's summary line and one for a table of
runs (compare, sweep), with the warnings and notes that go under it, and the exit status it implies."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def print_run(info, method: str, s, stream: bool) -> None:
    """`generate`: the text (unless it was streamed), then one summary line on stderr."""
    print(("\n" if stream else "") + ("" if stream else s.text))
    print(f"\n[{info.target} + {info.head_family or 'no'} head | {method} | {info.device}] {s.new_tokens} tokens in "
          f"{s.wall_s:.2f} s = {s.tokens_per_s:.2f} tok/s, tau {s.tau:.2f}, mean active {s.mean_active:.0f} "
          f"({100 * s.active_frac:.2f}% of V), coverage "
          f"{'-' if s.coverage is None else f'{100 * s.coverage:.1f}%'}, draft {s.draft_ms_per_step:.2f} ms/step, "
          f"stop: {s.stop_reason}", file=sys.stderr)


def print_table(header: str, table: list[dict]) -> None:
    """A table of runs under its header line, then per row that had a draft budget its own share of a step
    and its calibration (tokens a step expected against brought), and a warning line per row whose timings
    cannot be trusted (`bench.trust`)."""
    from nanospec.bench.compare import format_table
    from nanospec.bench.trust import trust_warnings
    print(file=sys.stderr)
    print(header)
    print(format_table(table))
    for row in table:
        if row.get("budget_share"):
            line = f"{row['method']}: the draft budget's own time is {100 * row['budget_share']:.1f}% of a step"
            if row.get("budget_expected") is not None:
                line += (f"; its kept trees were expected to bring {row['budget_expected']:.2f} tokens a step "
                         f"and brought {row['budget_brought']:.2f}")
            print(line)
    for line in trust_warnings(table):
        print(line)


def print_peer(peer, table: list[dict]) -> None:
    """Under the table: a line per peer kind that failed, and how the peer's rows were measured."""
    if peer is None:
        return
    for line in peer.failure_lines():
        print(line)
    rows = [r for r in table if r.get("peer")]
    if rows:
        p = rows[0]["peer"]
        own = [f"{r['method']} {r['peer']['speedup_vs_own_plain']:.2f}x" for r in rows
               if r["peer"]["kind"] != "plain" and r["peer"]["speedup_vs_own_plain"] is not None]
        print(f"{', '.join(r['method'] for r in rows)}: vLLM {p['vllm']} on {p['device']}, {p['threads']} threads, "
              "in a child process after this engine's rows (not interleaved); speedup is against this engine's ar"
              + (f"; against vLLM's own plain: {', '.join(own)}" if own else ""))


def print_categories_and_memory(table: list[dict], categories: list[str]) -> None:
    """Under compare's table: the rows by prompt category (when there are several), and memory use."""
    from nanospec.bench.compare import by_category, format_by_category, peak_memory_mb, resident_split_mb
    if len(set(categories)) > 1:
        print("\nby prompt category:")
        print(format_by_category(by_category(table, categories), [r["method"] for r in table if r["method"] != "ar"]))
    print(f"peak memory (RSS): {peak_memory_mb():.0f} MB")
    split = resident_split_mb()
    if split:
        print(f"resident now: {split['rss']:.0f} MB = {split['anon']:.0f} MB anonymous + {split['file']:.0f} MB "
              "file-backed (mostly the model's safetensors, mapped by transformers: page cache, reclaimable)")


def save_and_check(table: list[dict], json_path: str | None, temperature: float) -> int:
    """Write the table as JSON (`json_path`); exit status 1 if a speculative method's greedy output
    differs from ar in a way that the target's precision does not explain (any difference in fp32;
    in bf16/fp16 one that is not a near-tie: see precision.py), else 0."""
    from nanospec.bench.compare import OUTSIDE_ROWS, exactness_notes
    if json_path:
        Path(json_path).write_text(json.dumps(table, indent=2))
    notes = exactness_notes(table)
    if notes:
        print("\n".join(notes), file=sys.stderr)
    if temperature == 0 and any(r.get("exactness") == "differs" for r in table
                                if r["method"] not in OUTSIDE_ROWS and not r.get("peer")):  # outside: reported only
        print("ERROR: a speculative method's output differs from autoregressive decoding", file=sys.stderr)
        return 1
    return 0
