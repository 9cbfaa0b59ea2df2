"""The lesson's narration: what the chart shows at this step, in sentences, from the trace.

Each `*_now(lesson, run, step) -> str` returns Markdown for one chapter; `run` is the chapter's
recorded run and other runs of the same prompt come from `lesson`. `provenance` is the line every
chapter ends with.
"""

from __future__ import annotations

import html
import math

from app.charts import token_label
from app.inputs import DEFAULTS
from app.lesson.verdicts import verdicts
from app.lesson.data import COMMAND, RUN_LABELS, SEEN, Lesson, LessonRun, budget_curve, budget_step, ctx_breakdown, \
    decode_events, lm_head_share, price, run_locality


def provenance(lesson: Lesson, run: LessonRun) -> str:
    """The line every chapter ends with: the trace is real, which pair, machine and command made it."""
    pair, machine = lesson.info.get("pair") or {}, lesson.info.get("machine") or {}
    prompt_id, run_key = run.prompt_id, run.key
    sampling = run.meta.get("config", {}).get("sampling", {})
    how = f"sampled at temperature {sampling['temperature']}" if sampling.get("temperature") else "greedy"
    head = "the project's shipped draft head" if pair.get("head_kind") == "shipped" else f"head `{pair.get('head')}`"
    warn = ("\n\n> ⚠️ **Development traces:** recorded with an untrained random head, so τ is about 1. "
            f"Re-record with `{COMMAND}` once the shipped head exists.") if pair.get("head_kind") == "random" else ""
    label = lesson.info.get("engine_label")
    warn += f"\n\n> ⚠️ **Timings:** {html.escape(label)}." if label else ""
    return (f"<div class='provenance'><b>Real recorded trace</b> — run <code>{RUN_LABELS.get(run_key, run_key)}"
            f"</code> on prompt <code>{prompt_id}</code>: {html.escape(str(pair.get('target')))} + {head}, "
            f"{pair.get('device')} {pair.get('dtype')}, {how}, recorded {lesson.info.get('recorded_at')} on "
            f"{html.escape(str(machine.get('text')))} by <code>{html.escape(str(lesson.info.get('command')))}</code>. "
            f"No model runs on this page.</div>{warn}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _q(run: LessonRun, token_id: int) -> str:
    return f"«{html.escape(token_label(token_id, run.token_text))}»"


def ar_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    e = run.event(step)
    if e.step == 0:
        return (f"**Step 0 (prefill):** the target reads the whole prompt ({len(run.meta['prompt_ids'])} tokens) "
                f"in one forward ({e.wall_ms:.0f} ms) and writes its first token {_q(run, e.bonus_token)}.")
    return (f"**Step {e.step}:** the target reads {_q(run, e.root_token)} and writes {_q(run, e.bonus_token)} in "
            f"{e.wall_ms:.1f} ms. So far: **{run.tokens_through(e.step)} tokens, {e.step + 1} forwards**. The whole "
            f"answer took {run.summary.steps + 1} forwards for {run.summary.new_tokens} tokens "
            f"({run.summary.tokens_per_s:.1f} tokens/s).")


def chain_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    e = run.event(step)
    same = run.meta.get("identical_to_first")
    tail = (f" Lossless check: the full answer is **{'identical ✓' if same else 'DIFFERENT ✗'}** to plain "
            f"autoregressive decoding, in {run.summary.steps} forwards instead of "
            f"{lesson.run(pid, 'ar').summary.steps}.")
    if e.step == 0:
        return ("**Step 0 (prefill):** the target reads the prompt and writes the first token; drafting starts "
                "at step 1." + tail)
    n = len(e.accepted_tokens)
    drafted = " ".join(_q(run, t) for t in e.tree_tokens[1:])
    return (f"**Step {e.step}:** the drafter guessed {drafted}. The target agreed with the first **{n}**, then "
            f"wrote its own bonus {_q(run, e.bonus_token)}: **{_n(n + 1, 'token')} from one forward**." + tail)


def tree_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    e = run.event(step)
    chain = lesson.run(pid, "greedy").summary.tau if (pid, "greedy") in lesson.runs else math.nan
    tail = (f" Over the whole answer τ = **{run.summary.tau:.2f}** with the tree vs {chain:.2f} with the chain. "
            + verdicts(lesson, pid, ("full",)))
    if e.step == 0:
        return "**Step 0 (prefill):** no tree yet; drag the step slider or press Step ▶." + tail
    path = " → ".join(_q(run, t) for t in e.accepted_tokens) or "nothing"
    return (f"**Step {e.step}:** {len(e.tree_tokens) - 1} drafted tokens, verified together. Accepted path: "
            f"{path}, then the bonus {_q(run, e.bonus_token)} — **{_n(len(e.tokens), 'token')}** this "
            "forward." + tail)


def bottleneck_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    e = run.event(step)
    share = lm_head_share(run)
    text = (f"In this trace the LM head took **{share:.0%} of the drafter's time** (measured by the engine's phase "
            f"timer on this recording, not quoted from a paper).")
    if e.step > 0 and e.draft_ms > 0:
        text += (f" **Step {e.step}:** draft {e.draft_ms:.1f} ms, of which LM head "
                 f"{e.phases.get('lm_head', 0):.1f} ms over {e.active_size:,} rows.")
    if lesson.sweep:
        pts = {p["vocab"]: p["ms"] for p in lesson.sweep["points"] if p["rows"] == 6}
        if 32000 in pts and 256000 in pts:
            text += (f" Right: the same matmul for other vocabularies — {pts[32000]:.2f} ms at 32k vs "
                     f"**{pts[256000]:.2f} ms at 256k** ({pts[256000] / pts[32000]:.1f}×), on "
                     f"{html.escape(lesson.sweep['machine']['text'])}.")
    return text


def locality_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    kinds = run_locality(run)
    n = len(kinds)
    shares = {k: sum(x == k for x in kinds) / max(1, n) for k in SEEN}
    text = (f"On this prompt **{1 - shares['new']:.0%} of the {n} written tokens were seen before**: "
            f"{shares['prompt']:.0%} in the prompt, {shares['output']:.0%} earlier in the answer, "
            f"{shares['top3']:.0%} among the target's earlier top-3 guesses; only {shares['new']:.0%} were new.")
    e = run.event(step)
    if e.tokens:
        j = run.tokens_through(e.step) - 1
        text += f" **Token {j + 1}** {_q(run, e.tokens[-1])}: {SEEN[kinds[j]][0]}."
    return text


def active_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    ctx = ctx_breakdown(run)
    e = run.event(step)
    text = (f"**Ctx** at prefill: {ctx['unique_prompt']} distinct prompt tokens + {ctx['from_top3']} more from the "
            f"target's top-3 guesses = **{run.events[0].active_size:,} ids**.")
    if e.step > 0:
        text += (f" **Step {e.step}:** the drafter scored **{e.active_size:,} rows = "
                 f"{e.active_size / e.vocab_size:.1%} "
                 f"of V** ({e.vocab_size:,}); **Ext** then added {e.added_ids} new ids.")
    text += (f" Final size {run.events[-1].active_size + run.events[-1].added_ids:,}; mean "
             f"{run.summary.mean_active:,.0f} = {run.summary.active_frac:.1%} of V.")
    return text


def misses_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    e = run.event(step)
    kind = {"none": "no miss — the whole accepted path ran to a leaf of the tree",
            "vocab": f"**vocab miss** — the target's token {_q(run, e.bonus_token)} was not in the active set",
            "draft": f"**draft miss** — {_q(run, e.bonus_token)} was in the set but ranked too low"}
    taus = " · ".join(f"{RUN_LABELS[k]} {lesson.run(pid, k).summary.tau:.2f}"
                      for k in ("full", "static", "nanospec", "hybrid") if (pid, k) in lesson.runs)
    same = all(lesson.run(pid, k).meta.get("identical_to_first") for k in lesson.keys(pid))
    text = f"**Step {e.step}:** {kind.get(e.miss_kind, e.miss_kind)}." if e.step else "**Step 0:** prefill."
    return (text + f" τ on this prompt: {taus}. Output of every method identical to `ar`: "
            f"**{'yes ✓' if same else 'NO ✗'}**.")


def system_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    decode = run.frame[run.frame["step"] > 0]
    gathered = int(run.events[0].added_ids + decode["added_ids"].sum())
    regather = int(decode["active_size"].sum())
    full = lesson.run(pid, "full").summary if (pid, "full") in lesson.runs else None
    text = (f"Rows copied into the buffer over the whole answer: **{gathered:,}** (only new ones) instead of "
            f"{regather:,} if the active rows were gathered afresh each step.")
    if full:
        text += (f" Draft time per step: full {full.draft_ms_per_step:.1f} ms → nanospec "
                 f"**{run.summary.draft_ms_per_step:.1f} ms**.")
    e = run.event(step)
    if e.step > 0:
        text += (f" **Step {e.step}:** draft layers {e.phases.get('draft_layers', 0):.1f} ms, LM head "
                 f"{e.phases.get('lm_head', 0):.2f} ms over {e.active_size:,} rows, set upkeep "
                 f"{e.phases.get('vocab_update', 0):.2f} ms.")
    if str((lesson.info.get("pair") or {}).get("device", "cpu")).startswith("cpu"):
        text += (" *Recorded on a CPU: the gather runs synchronously there (no side stream), so the overlap "
                 "only shows on a GPU.*")
    return text


def budget_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    """Ch. 9: why this step verified the nodes it did, and what the budget did over the whole answer."""
    bs, curve = budget_step(run, step), budget_curve(run)
    if curve is None:
        return f"*No budgeted run in these traces: re-record with `{COMMAND}`.*"
    e = run.event(step)
    if bs is None:
        text = "**Step 0 (prefill):** nothing drafted yet; drag the step slider or press Step ▶."
    else:
        kept, dropped = bs.kept, bs.dropped
        lowest = f" (lowest p {min(n.p for n in kept):.2f})" if kept else ""
        highest = f" (highest p {max(n.p for n in dropped):.2f})" if dropped else ""
        extra = bs.kept_price / bs.rate if bs.rate > 0 else 0.0
        text = (f"**Step {bs.step}:** this request writes λ = **{bs.rate * 1e3:.1f} tokens/s**. Verifying the "
                f"**{len(kept)}** likeliest of **{len(bs.nodes)}** drafted nodes{lowest} makes the target's forward "
                f"**{extra:.1f} ms** longer than a plain step (the measured curve, right), time that would earn "
                f"**{price(bs.kept_price)} tokens**, against their summed chance **{bs.kept_chance:.2f}**: no other "
                f"number of nodes gains more. {len(dropped)} are dropped{highest}: expected "
                f"**{bs.expected:.2f} tokens**, written **{len(e.tokens)}**.")
        if bs.explore:
            text += " *After several plain steps in a row the likeliest node is verified anyway, to keep learning.*"
    steps = [x for x in decode_events(run) if x.drafted_nodes > 0]
    if steps:
        verified = sum(len(x.tree_tokens) - 1 for x in steps) / len(steps)
        drafted = sum(x.drafted_nodes - 1 for x in steps) / len(steps)
        text += (f" Whole answer: **{verified:.1f}** of {drafted:.1f} drafted nodes verified per step, "
                 f"τ {run.summary.tau:.2f}, {run.summary.tokens_per_s:.1f} tokens/s")
        fixed = lesson.run(run.prompt_id, "nanospec").summary if lesson.has(run.prompt_id, "nanospec") else None
        if fixed is not None and run.key != "nanospec":
            text += f" (fixed tree: τ {fixed.tau:.2f}, {fixed.tokens_per_s:.1f} tokens/s)"
        text += "."
    return text


def try_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    pid = run.prompt_id
    prompt = " ".join(lesson.prompt(pid)["text"].split())
    cli = (f"python -m nanospec generate --method nanospec --depth {DEFAULTS['depth']} --top-k {DEFAULTS['top_k']} "
           f"--total-tokens {DEFAULTS['total_tokens']} --max-new-tokens "
           f"{(lesson.info.get('settings') or {}).get('max_new_tokens', 96)}")
    return (f"Prompt `{pid}`: *{html.escape(prompt[:160])}{'…' if len(prompt) > 160 else ''}*\n\n"
            f"{verdicts(lesson, pid, ('full', 'nanospec'))}\n\n"
            f"On the command line: `{cli} \"…\"`. A live run on a CPU takes a few seconds (the model loads once).")




def sampling_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    """Ch. 11: how this step's drafted candidates were tried, and the many-runs check."""
    trials = run.meta.get("trials") or []
    entry = trials[min(step, len(trials) - 1)] if trials else {}
    text = ""
    if step == 0 or not entry.get("levels"):
        text = "**Step 0 (prefill):** the target samples the first token itself; drafting starts at step 1."
    else:
        tries = [f"{_q(run, t['token'])} with probability {t['accept_prob']:.2f} → "
                 f"**{'accepted' if t['accepted'] else 'rejected'}**" for t in entry["levels"][0]["tried"]]
        text = f"**Step {step}:** tried in draft order: " + "; ".join(tries) + "."
        bonus = entry["levels"][0].get("bonus")
        if bonus:
            text += (f" All rejected: {_q(run, bonus['token'])} was drawn from what was left "
                     f"(renormalised p {bonus['residual_p']:.2f}).")
        text += f" This step wrote **{_n(len(run.event(step).tokens), 'token')}**."
    check = lesson.checks.get(run.prompt_id)
    if check:
        text += (f" **Right:** {check['runs']} seeded runs; in the {check['kept']} that share the first token, the "
                 "next one comes from a speculative step. Its frequencies against the target's p: total variation "
                 f"**{check['total_variation']:.3f}**, where as many draws straight from the target give "
                 f"{check['total_variation_exact']:.3f} (median of 200 simulated sets): sampling noise alone.")
    elif step > 0:
        text += f" *The many-runs check is not recorded in these traces: re-record with `{COMMAND}`.*"
    return text


def race_now(lesson: Lesson, run: LessonRun, step: int) -> str:
    """Ch. 12: who finished when, from the recorded step times."""
    pid = run.prompt_id
    parts = []
    for key in ("ar", "full", "nanospec"):
        if (pid, key) in lesson.runs:
            r = lesson.run(pid, key)
            total = sum(e.wall_ms for e in r.events) / 1000
            parts.append(f"`{key}` {total:.1f} s ({r.summary.tokens_per_s:.1f} tokens/s, τ {r.summary.tau:.2f})")
    now = sum(e.wall_ms for e in run.events[: step + 1]) / 1000
    return (" · ".join(parts) + f". The dotted line: `{run.key}` finished step {step} at {now:.2f} s. "
            f"All times are the recorded ones ({html.escape(str((lesson.info.get('machine') or {}).get('text')))}). "
            + verdicts(lesson, pid, ("full", "nanospec")))
