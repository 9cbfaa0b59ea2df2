"""The Compare tab's callbacks: `ar` and the chosen methods on one prompt, then the optional vLLM rows, as a
table, a chart, a verdict and a replayable race (`CompareTab`, a part of `Explorer`)."""

from __future__ import annotations

import html
import logging
import math
import threading
from dataclasses import dataclass, field

import gradio as gr
import pandas as pd
from gradio.components.plot import PlotData

from nanospec import RunSummary, metrics
from nanospec.bench.peers import ENGINE as PEER_ENGINE
from nanospec.bench.trust import SERVER_MIN_CPU_SHARE, busy, exceeds_tau
from nanospec.timing import metered

from app import charts
from app import peers as app_peers
from app.callbacks.shared import fail
from app.inputs import METHODS
from app.race import lane, race_html
from app.trace import TokenDecoder

COMPARE_COLUMNS = ["method", "tokens", "tokens/s", "speedup", "τ", "mean active", "% of V", "coverage",
                   "draft ms/step", "identical to ar"]


@dataclass
class Comparison:
    """One Compare press so far: what the table, chart, verdict and race show."""

    greedy: bool
    vocab_size: int | None
    summaries: dict[str, RunSummary] = field(default_factory=dict)
    runs: dict[str, tuple] = field(default_factory=dict)  # method -> (events, summary): what the race replays
    cpu_shares: dict[str, float] = field(default_factory=dict)  # method -> CPU share of its timed run
    peer_runs: list = field(default_factory=list)  # vLLM's rows
    peer_lines: list[str] = field(default_factory=list)  # a line per vLLM kind that did not run
    shown: tuple = (None, None)  # table and chart so far; re-sent as plain values (see `streamed_outputs`)
    text: str = ""

    def outputs(self, status: str | None = None) -> tuple:
        """(table, chart, verdict, runs): Compare's outputs, the verdict replaced by `status` while a run goes."""
        return (*self.shown, self.text if status is None else status, self.runs)

    def redraw(self, found=None, dtype=None) -> tuple:
        """Table, chart and verdict from the runs so far (`found`, `dtype`: see `compare_verdict`)."""
        table = compare_table(self.summaries, self.greedy, self.peer_runs, self.vocab_size)
        shares = {**self.cpu_shares, **{r.name: r.info.get("cpu_share") for r in self.peer_runs}}
        peer_rows = table.tail(len(self.peer_runs))  # the table's identity check of each vLLM row
        same = dict(zip(peer_rows["method"], peer_rows["identical"]))
        notes = "".join(f"\n\n{line}" for line in [app_peers.measured_note(self.peer_runs), *self.peer_lines]
                        if line)
        verdict = compare_verdict(self.summaries, self.greedy, found, dtype, same if self.greedy else None)
        self.shown = (display_table(table), PlotData(type="plotly", plot=charts.compare_figure(table).to_json()))
        self.text = verdict + compare_trust(table, shares) + notes
        return self.outputs()


def chosen_methods(methods, knobs: dict) -> list[str]:
    """The methods to compare with `ar`, in the option table's order; a bad choice is refused."""
    chosen = [methods] if isinstance(methods, str) else list(methods or [])
    bad = [m for m in chosen if m not in METHODS]
    if bad:
        raise fail("invalid input", f"unknown methods {bad}; choose from {', '.join(METHODS[1:])}")
    if "method" in knobs:
        raise fail("invalid input", "Compare takes `methods`, not `method`")
    return [m for m in METHODS[1:] if m in chosen]


class CompareTab:
    """The Compare tab's callbacks (mixed into `Explorer`)."""

    def run_compare(self, prompt_text, methods, progress=gr.Progress(), peers=None, **knobs):
        """Compare was pressed: `ar` and each of `methods` on `prompt_text` with `knobs` (as `run_live`'s, but
        for the method), then the chosen vLLM `peers` (app/peers.py), each in its own process."""
        methods = chosen_methods(methods, knobs)
        try:
            outside = app_peers.check(peers)
        except ValueError as exc:
            raise fail("invalid input", exc) from None
        prompt, base = self._inputs(prompt_text, {**knobs, "method": "ar"})
        self._engine(progress)
        engine, info = self.provider.get()
        done = Comparison(base["temperature"] == 0.0, info.vocab_size)
        for method in ["ar", *methods]:
            yield from self._compare_method(prompt, {**base, "method": method}, done)
        if outside and not done.greedy:
            done.peer_lines = ["vLLM rows compare greedy outputs token for token: set temperature 0 to run them."]
        elif outside:
            yield from self._compare_peers(outside, engine, info, prompt, base, done)
        if outside:
            yield done.redraw()
        if done.greedy and any(s.output_ids != done.summaries["ar"].output_ids for s in done.summaries.values()):
            try:  # where each differing output parts from ar's, and the target's margin there
                found, dtype = self._divergences(prompt, done.runs)
            except Exception as exc:  # noqa: BLE001 — the runs stand; only the explanation is missing
                logging.getLogger(__name__).warning("could not explain a divergence: %s", exc)
            else:
                yield done.redraw(found, dtype)

    def _compare_method(self, prompt, options: dict, done: Comparison):
        """One method: an untimed warm-up the first time these options run in this process, then the timed run
        (its progress in the verdict's place); then the table with its row."""
        method = options["method"]
        key = (method, tuple(sorted((k, v) for k, v in options.items() if k != "max_new_tokens")))
        plan = [] if key in self._warm else [("warm-up", {**options, "max_new_tokens": 2})]
        for label, opts in [*plan, ("timed", options)]:
            try:
                with metered() as meter:  # how much of the run's wall time this process computed
                    for status, summary, events in self._compare_run(prompt, opts, method, label):
                        if summary is None:
                            yield done.outputs(status)
                done.cpu_shares[method] = meter.cpu_share
            except ValueError as exc:
                raise fail("cannot run", exc) from None
            except Exception as exc:  # noqa: BLE001
                raise fail(f"decoding failed ({type(exc).__name__})", exc) from None
        self._warm.add(key)
        done.summaries[method] = summary
        done.runs = {**done.runs, method: (events, summary)}
        yield done.redraw()

    @staticmethod
    def _compare_peers(outside, engine, info, prompt, base: dict, done: Comparison):
        """The chosen vLLM rows, in a child process on the same prompt (its progress in the verdict's place)."""
        stop = threading.Event()  # set when the page's Stop closes this generator: the child is killed
        try:
            for item in app_peers.run(outside, engine, info, engine.encode_prompt(prompt), base["max_new_tokens"],
                                      stop):
                if isinstance(item, str):
                    yield done.outputs(f"{done.text}\n\n{item}")
                else:
                    done.peer_runs, done.peer_lines = item
        finally:
            stop.set()
    def _divergences(self, prompt, runs: dict) -> tuple[dict, object]:
        """On the decode thread: each differing greedy run's first divergence from ar (precision.py)."""
        from nanospec import precision

        engine, _ = self.provider.get()
        ar = runs["ar"][1].output_ids

        def explain():
            ids = engine.encode_prompt(prompt)
            for method, (events, summary) in runs.items():
                if method != "ar" and summary.output_ids != ar:
                    yield method, precision.divergence(engine, ids, summary.output_ids, ar,
                                                       [e.n_emitted for e in events])

        found = {}
        for batch in self._pump(explain()).batches():
            found.update(batch)
        return found, engine.model.dtype

    def _compare_run(self, prompt, options: dict, method: str, label: str):
        """(status text, None, None) per step, then ("", summary, events); runs in a `StepPump` so Stop acts
        per step."""
        pump = self._pump(self._decode(prompt, options))
        events, summary = [], None
        try:
            for batch in pump.batches():
                for item in batch:
                    if isinstance(item, RunSummary):
                        summary = item
                    elif not isinstance(item, dict):  # a dict: the budget's cost curve, not a step
                        events.append(item)
                if summary is None:
                    yield f"Running `{method}` ({label}): {sum(len(e.tokens) for e in events)} tokens…", None, None
        finally:
            pump.stop()
        yield "", summary, events

    def race(self, runs: dict | None) -> str:
        """The race of the runs the Compare tab just made (their recorded step times; nothing runs again)."""
        if not runs:
            return race_html([], "")
        loaded = self.provider.loaded
        tokenizer = loaded[0].tokenizer if loaded is not None else None
        lanes = []
        for method, (events, summary) in runs.items():
            decoder = TokenDecoder(tokenizer)
            pieces = [decoder.push(t) for e in events for t in e.tokens]
            lanes.append(lane(method, events, summary, pieces))
        device = loaded[1].device if loaded is not None else "?"
        return race_html(lanes, f"Recorded just now on this server ({html.escape(str(device))}), "
                         "each run after one untimed warm-up; tokens appear when their step finished.")


def compare_table(summaries: dict[str, RunSummary], greedy: bool, peer_runs=(),
                  vocab_size: int | None = None) -> pd.DataFrame:
    """One row per method, then one per vLLM run (`PeerRun`s of one prompt, whose active size is a share of
    `vocab_size`), numeric (the figure reads it); `display_table` formats it."""
    ar = summaries.get("ar")
    rows = []
    for method, s in summaries.items():
        rows.append({
            "method": method, "tokens": s.new_tokens, "tokens_per_s": s.tokens_per_s,
            "speedup": metrics.speedup(s.tokens_per_s, ar.tokens_per_s if ar else None),
            "tau": s.tau, "mean_active": s.mean_active, "active_frac": s.active_frac, "coverage": s.coverage,
            "draft_ms_per_step": s.draft_ms_per_step,
            "identical": metrics.identical_to_ar(s.output_ids, ar.output_ids, greedy) if ar is not None else None,
        })
    for run in peer_runs:
        active = run.info.get("mean_active")  # vllm:nanospec only
        rows.append({
            "method": run.name, "tokens": len(run.outputs[0]), "tokens_per_s": run.tokens_per_s[0],
            "speedup": metrics.speedup(run.tokens_per_s[0], ar.tokens_per_s if ar else None),
            "tau": run.tau, "mean_active": active,
            "active_frac": active / vocab_size if active and vocab_size else None,
            "coverage": run.info.get("coverage"), "draft_ms_per_step": math.nan,  # vLLM does not report it
            "identical": metrics.identical_to_ar(run.outputs[0], ar.output_ids, greedy) if ar is not None else None,
        })
    return pd.DataFrame(rows)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    def pct(x):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"

    return pd.DataFrame({
        "method": table["method"], "tokens": table["tokens"],
        "tokens/s": [f"{v:.1f}" for v in table["tokens_per_s"]],
        "speedup": [f"{v:.2f}×" for v in table["speedup"]],
        "τ": [f"{v:.2f}" for v in table["tau"]],
        "mean active": [f"{v:,.0f}" if _given(v) else "–" for v in table["mean_active"]],
        "% of V": [pct(f) if _given(a) else "–" for f, a in zip(table["active_frac"], table["mean_active"])],
        "coverage": [pct(c) for c in table["coverage"]],
        "draft ms/step": ["–" if m == "ar" or not _given(v) else f"{v:.2f}"
                          for m, v in zip(table["method"], table["draft_ms_per_step"])],
        "identical to ar": ["n/a (sampling)" if i is None else ("✓" if i else "✗") for i in table["identical"]],
    }, columns=COMPARE_COLUMNS)


def _given(x) -> bool:
    """A figure the row has: not None, NaN or 0 (a method without an active vocabulary shows "–")."""
    return bool(x) and not (isinstance(x, float) and math.isnan(x))


def compare_trust(table: pd.DataFrame, cpu_shares: dict[str, float]) -> str:
    """A warning (Markdown) when the Compare tab's speeds cannot be read as findings, else "", judged by
    `nanospec.bench.trust` as every tool that shows speeds is: a method timed while this server computed
    less than `SERVER_MIN_CPU_SHARE` of the wall time (another job had the machine), or a speedup above
    τ x `nanospec.bench.trust.TAU_SLACK` (`exceeds_tau`)."""
    problems = []
    for method, speedup, tau in zip(table["method"], table["speedup"], table["tau"]):
        share = cpu_shares.get(method)
        if busy(share, SERVER_MIN_CPU_SHARE):
            problems.append(f"`{method}` ran while the machine was busy (this server computed {share:.0%} of its "
                            "wall time)")
        # τ bounds only this engine's speedup (a vLLM row divides its speed by this engine's ar)
        own = method != "ar" and not method.startswith(f"{PEER_ENGINE}:")
        if own and exceeds_tau(speedup, tau):
            problems.append(f"`{method}`'s speedup {speedup:.2f}× exceeds its τ {tau:.2f}, which a speculative step "
                            "cannot do: the `ar` timing was disturbed")
    if not problems:
        return ""
    return ("\n\n**⚠ Do not read these speeds as findings:** " + "; ".join(problems)
            + ". Each method ran once; run Compare again when the machine is idle.")


def compare_verdict(summaries: dict[str, RunSummary], greedy: bool, divergences: dict | None = None,
                    dtype=None, peers: dict[str, bool] | None = None) -> str:
    """The Compare tab's verdict. `divergences` (method -> precision.Divergence) and the target's `dtype`,
    once known, tell a near-tie of a low-precision target from a real difference; `peers` (vLLM row ->
    whether its output is identical to ar's) join the identity check."""
    ar = summaries.get("ar")
    others = {m: s for m, s in summaries.items() if m != "ar"}
    peers = peers or {}
    if ar is None or not (others or peers):
        return "Running…" if ar is None else "Autoregressive baseline done; choose methods to compare."
    if not greedy:
        return ("Temperature > 0: outputs are samples. Speculative sampling is lossless *in distribution*, "
                "so token-for-token identity with `ar` is not expected.")
    same = [m for m, s in others.items() if metrics.identical_to_ar(s.output_ids, ar.output_ids)]
    same += [m for m, identical in peers.items() if identical]
    diff = [m for m in [*others, *peers] if m not in same]
    if not diff:
        return f"### ✓ Output identical to autoregressive at temperature 0 ({', '.join(same)})"
    found = {m: divergences[m] for m in diff if divergences and divergences.get(m) is not None}
    details = "".join(f"\n- `{m}`: {d.describe()}" for m, d in found.items())
    details += "".join(f"\n- `{m}`: vLLM's output differs from this engine's `ar` (vLLM's own kernels and verification)"
                       for m in diff if m in peers)
    ties = len(found) == len(diff) and all(d.near_tie for d in found.values())
    precision_name = str(dtype).removeprefix("torch.") if dtype is not None else "low precision"
    if ties:
        return (f"### ≈ Identical up to {precision_name} near-ties: {', '.join(diff)}"
                + (f" (identical: {', '.join(same)})" if same else "")
                + f"\nIn {precision_name} a tree forward and a one-token forward round differently, so where the "
                  "target's two best tokens are within its precision the greedy choice can flip; every method is "
                  "identical to `ar` in fp32." + details)
    return (f"### ✗ Output differs from autoregressive at temperature 0: {', '.join(diff)}"
            + (f" (identical: {', '.join(same)})" if same else "") + details)


