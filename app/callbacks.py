"""The app's callbacks: live run (streamed), stop, step scrubbing, replay and compare.

`Explorer` holds only process-wide things (the shared model provider, the warm-up record, and each
session's run in progress or waiting, which its Stop button ends or withdraws);
everything about a user's run travels in the returned values and in `gr.State`.
Every failure becomes a `gr.Error` in the page plus one `logging.warning` line on the server.
"""

from __future__ import annotations

import html
import logging
import math
import queue
import threading
import time
from dataclasses import asdict
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from pathlib import Path

import gradio as gr
import pandas as pd
import plotly.io as pio
from gradio.components.plot import PlotData

from nanospec import RunSummary, load_trace, metrics, stop_message, summarize
from nanospec.bench.peers import ENGINE as PEER_ENGINE
from nanospec.timing import MIN_CPU_SHARE, metered

from app import charts
from app import peers as app_peers
from app.decoding import StepPump, decode_thread
from app.inputs import METHODS, generation_options, parse_prompt
from app.models import EngineProvider
from app.race import lane, race_html
from app.trace import RunView, TokenDecoder, load_view, save_downloads, uploaded_file
from app.zerogpu import InlinePump, gpu_decoder
from app.zerogpu import active as zerogpu_active

logger = logging.getLogger("nanospec.app")

LIVE_OUTPUTS = ("answer", "kpis", "vocab_plot", "coverage_plot", "tree_plot", "phase_plot", "step",
                "view", "csv", "json", "depth_plot", "pair")
PLOTS = ("vocab_plot", "coverage_plot", "tree_plot", "phase_plot", "depth_plot")  # redrawn together
STOP_WAIT_S = 30.0  # Stop waits this long at most for the run's current step to end
COMPARE_COLUMNS = ["method", "tokens", "tokens/s", "speedup", "τ", "mean active", "% of V", "coverage",
                   "draft ms/step", "identical to ar"]


def fail(context: str, exc: BaseException | str) -> gr.Error:
    """A gr.Error for the page and a one-line warning (no traceback) for the server log."""
    message = f"{context}: {exc}" if str(exc) else context
    logger.warning("%s", " ".join(message.split()))
    return gr.Error(message, print_exception=False)


def stopped_note(view: RunView) -> str:
    """The line under the KPIs of a run that Stop ended."""
    return (f'<p class="stop-note" id="stop-note"><b>Stopped at step {view.last_step}</b>: '
            f'{html.escape(stop_message("stopped"))}. The answer, charts and downloads hold the '
            f'{view.last_step} decoding steps that finished.</p>')


def loading_note(elapsed_s: float, latest: str = "") -> str:
    """The status line while the first run loads the model (shown where the KPIs appear)."""
    detail = f" · {html.escape(latest)}" if latest else ""
    return (f'<p class="run-note" id="loading-note"><b>Loading the model…</b> (first run only; later runs start '
            f"at once) · {elapsed_s:.0f} s{detail}</p>")


def plot_data(spec: dict) -> PlotData:
    """A figure dict as `gr.Plot`'s payload, serialised without building a `go.Figure` (see `charts`)."""
    return PlotData(type="plotly", plot=pio.to_json(spec, validate=False))


class LiveRun:
    """A live run in progress, as its page's Stop button sees it: Stop asks its step pump to end after the
    current step, and the run itself then sends the last values (one writer: the tree, the step slider and
    the note saying it was stopped always agree)."""

    def __init__(self, view: RunView):
        self.view = view
        self.pump = None
        self.stop_requested = threading.Event()
        self.finished = threading.Event()

    def stop(self) -> None:
        self.stop_requested.set()
        pump = self.pump
        if pump is not None:
            pump.stop()


def session_of(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None


class Explorer:
    def __init__(self, provider: EngineProvider, chart_interval_s: float = 1.0):
        self.provider = provider
        self.chart_interval_s = chart_interval_s
        self._warm: set[tuple] = set()          # (method, options) already run once in this process
        self._decode = gpu_decoder(self._decode_steps)  # the only part that needs the accelerator
        self._pump = InlinePump if zerogpu_active() else StepPump  # ZeroGPU: no CUDA on other threads
        self._live: dict[str, LiveRun] = {}  # session -> its live run in progress (what its Stop button ends)
        self._waiting: dict[str, threading.Event] = {}  # session -> its Run click, set when Stop withdraws it
        self._live_lock = threading.Lock()

    # -- model and decoding -------------------------------------------------------------
    def _engine(self, progress):
        """The shared pair, loaded on first use *on the decode thread*, with its progress shown here.

        Loading computes (weight conversion, packing), and on CPU the first thread to compute with torch
        starts a team of OpenMP worker threads that lives as long as that thread. Had a callback thread
        loaded the model, the decode thread would start a second team: more OpenMP threads than cores,
        which makes libgomp's workers sleep instead of spin between operations and slows every matmul
        (`python -m app.dev.bench_app` measures the app against the engine; docs/benchmarks.md has a run)."""
        loading = self._loading(progress)
        while True:
            try:
                next(loading)
            except StopIteration as done:
                return done.value

    def _loading(self, progress, every_s: float = 0.5):
        """`_engine` as a generator: yields a status line (HTML) about every `every_s` while the pair loads,
        then returns it (`yield from`). The Live tab shows the line at once, next to the Run button."""
        loaded = self.provider.loaded
        if loaded is not None:
            return loaded
        messages: queue.Queue = queue.Queue()
        done: Future = Future()

        def load() -> None:
            try:
                done.set_result(self.provider.get(lambda m, f: messages.put((m, f))))
            except BaseException as exc:  # noqa: BLE001 — re-raised below, in the caller
                done.set_exception(exc)

        decode_thread().submit(load)
        t0, latest = time.perf_counter(), ""
        while True:
            finished = bool(futures_wait([done], timeout=every_s).done)
            while True:  # also once after the end, so nothing reported late is lost
                try:
                    message, fraction = messages.get_nowait()
                except queue.Empty:
                    break
                progress(fraction, desc=message)
                latest = message + (f" ({fraction:.0%})" if fraction is not None else "")
            if finished:
                break
            yield loading_note(time.perf_counter() - t0, latest)
        try:
            return done.result()
        except Exception as exc:  # noqa: BLE001 — any load failure is shown, and the app keeps serving
            raise fail("the model failed to load", exc) from None

    def _decode_steps(self, prompt, options: dict):
        """Yields each `StepEvent`, then the `RunSummary`. Closing this generator stops the run. A run with
        the draft budget first yields `{"cost_curve": ...}`: the target's cost curve the budget used
        (`stream` measured it, or read the cache, before the run's first step)."""
        engine, _ = self.provider.get()
        run = engine.stream(prompt, **options)
        steps = iter(run)
        try:
            if options.get("budget") and options.get("method") != "ar":
                curve = engine.cost_curve()  # the one `stream` just made sure of: nothing is measured here
                yield {"cost_curve": {**curve.to_dict(), "per_token_ms": curve.per_token_ms,
                                      "text": curve.describe()}}
            yield from steps
        finally:
            steps.close()  # closes the engine's Run: decoding stops at this step
        yield run.summary

    def _inputs(self, prompt_text, knobs: dict):
        try:
            return parse_prompt(prompt_text), generation_options(knobs)
        except ValueError as exc:
            raise fail("invalid input", exc) from None

    # -- live tab -------------------------------------------------------------------------
    def run_live(self, prompt_text, progress=gr.Progress(), request: gr.Request = None, **knobs):
        """Run was pressed: stream the run of `prompt_text` with `knobs` (run option name -> value, the names
        `app.inputs.KNOBS` lists; one left out gets the page's default)."""
        prompt, options = self._inputs(prompt_text, knobs)
        session = session_of(request)
        view = RunView(meta={"prompt": prompt, "options": options})
        live = LiveRun(view)
        with self._live_lock:
            withdrawn = self._waiting.pop(session, None)
            if withdrawn is not None and withdrawn.is_set():
                gr.Info("Run withdrawn: Stop was pressed while it waited for its turn")
                yield tuple(gr.skip() for _ in LIVE_OUTPUTS)
                return
            self._live[session] = live
        try:
            yield from self._run_live(prompt, options, view, live, progress)
        finally:
            live.finished.set()
            with self._live_lock:
                if self._live.get(session) is live:
                    del self._live[session]

    def _run_live(self, prompt, options: dict, view: RunView, live: LiveRun, progress):
        loading = self._loading(progress)
        while True:  # the first run loads the model: say so where the KPIs will be, in view of the Run button
            try:
                note = next(loading)
            except StopIteration as done:
                engine, info = done.value
                break
            yield tuple(note if name == "kpis" else gr.skip() for name in LIVE_OUTPUTS)
        view.meta["pair"] = asdict(info)
        note = long_prompt_note(engine, prompt)
        if note:  # said before the prefill starts, and kept under the KPIs while the run lasts
            view.meta["prompt_note"] = note
            yield tuple(prompt_note_html(note) if name == "kpis" else gr.skip() for name in LIVE_OUTPUTS)
        decoder = TokenDecoder(engine.tokenizer)
        pump = live.pump = self._pump(self._decode(prompt, options))
        if live.stop_requested.is_set():  # Stop came while the model loaded
            pump.stop()
        t0 = time.perf_counter()
        last_draw, draw_cost, first = t0, 0.0, True
        last: dict = {}
        try:
            for batch in pump.batches():
                for item in batch:
                    if isinstance(item, RunSummary):
                        view.summary = item
                    elif isinstance(item, dict):  # the draft budget's cost curve (kept with the trace)
                        view.meta.update(item)
                    else:
                        view.add(item, decoder)
                if view.summary is not None or not view.events:
                    continue
                view.wall_s = time.perf_counter() - t0
                # charts cost far more than text: redraw at most every chart_interval_s, and never
                # spend more than ~1/10 of the time drawing (the page stays fluid on slow machines)
                draw = first or time.perf_counter() - last_draw >= max(self.chart_interval_s, 10 * draw_cost)
                started = time.perf_counter()
                out = self.streamed_outputs(view, draw, first, last)
                if draw:
                    last_draw, draw_cost = time.perf_counter(), time.perf_counter() - started
                first = False
                yield out
        except ValueError as exc:
            raise fail("cannot run", exc) from None
        except Exception as exc:  # noqa: BLE001 — a decoding fault must not take the app down
            raise fail(f"decoding failed ({type(exc).__name__})", exc) from None
        finally:
            pump.stop()  # Stop / closed tab: the decoding thread ends after its current step
        if view.summary is not None:
            view.wall_s = view.summary.wall_s
        elif live.stop_requested.is_set():
            view.wall_s = time.perf_counter() - t0
            view.summary = summarize(view.events, options["method"], view.wall_s, "stopped")
            view.stopped = True
        out = self.live_outputs(view, charts_too=True, downloads=True, pair=self.provider.describe())
        if view.summary is not None and view.summary.stop_reason == "context_limit":
            note = stop_message("context_limit", engine.max_context)
            gr.Warning(note)
            out = self._with_note(out, note)
        yield out

    @staticmethod
    def _with_note(out: tuple, note: str) -> tuple:
        """LIVE_OUTPUTS with a line under the KPIs (why the run ended early)."""
        values = dict(zip(LIVE_OUTPUTS, out))
        values["kpis"] = f'{values["kpis"]}<p class="stop-note" id="stop-note">⚠ {html.escape(note)}</p>'
        return tuple(values[name] for name in LIVE_OUTPUTS)

    def live_outputs(self, view: RunView, charts_too: bool, step: int | None = None, downloads: bool = False,
                     pair: str | None = None) -> tuple:
        """Values for LIVE_OUTPUTS; charts and the step slider only when `charts_too` (text and KPIs every
        step). While a run streams, `streamed_outputs` replaces the slider, files and skipped charts."""
        # text and KPIs every step, from plain lists (cheap); the pandas frame only for chart redraws
        answer = charts.answer_html(view.pieces, view.origins, view.special)
        method = view.events[0].method if view.events else "ar"
        running = view.summary or summarize(view.events, method, view.wall_s, "running")
        kpis = charts.kpi_html(charts.kpi_from_summary(running))
        kpis += charts.budget_html(view.events, view.meta.get("cost_curve"), "replayed_from" in view.meta)
        if view.stopped:
            kpis += stopped_note(view)
        if view.meta.get("prompt_note"):
            kpis += prompt_note_html(view.meta["prompt_note"])
        skip = gr.skip()
        out = {"answer": answer, "kpis": kpis, "step": skip, "view": view, "csv": skip, "json": skip,
               "pair": pair if pair is not None else skip, **{name: skip for name in PLOTS}}
        if charts_too:
            frame = view.frame()
            shown = view.last_step if step is None else step
            specs = {"vocab_plot": charts.vocab_spec(frame), "coverage_plot": charts.coverage_spec(frame),
                     "tree_plot": charts.tree_spec(frame, shown, view.token_text),
                     "phase_plot": charts.phase_spec(frame), "depth_plot": charts.depth_spec(frame)}
            out.update({name: plot_data(spec) for name, spec in specs.items()})
            out["step"] = gr.update(maximum=max(1, view.last_step), value=shown)
        if downloads and view.events:
            csv_path, json_path = save_downloads(view)
            out["csv"] = gr.update(value=str(csv_path), interactive=True)
            out["json"] = gr.update(value=str(json_path), interactive=True)
        return tuple(out[name] for name in LIVE_OUTPUTS)

    def streamed_outputs(self, view: RunView, draw: bool, first: bool, last: dict) -> tuple:
        """Values for LIVE_OUTPUTS while a run streams: like `live_outputs`, but without `gr.skip()` or
        `gr.update()` after the first step. Gradio answers each of those by building a new component
        object (constructor, config, JSON schema) on every step, which costs more than the step's text.
        An unchanged output gets its last plain value instead (`last` keeps them between steps), and
        Gradio's streaming diff then sends nothing for it. The first step resets the step slider and
        the download buttons (the previous run's files) once; the run's end sets them properly."""
        out = dict(zip(LIVE_OUTPUTS, self.live_outputs(view, charts_too=draw)))
        plots = (*PLOTS, "step")
        if draw:  # the tree shows the latest step, and the slider says which (both only on a redraw)
            last.update({name: out[name] for name in plots})
            last["step"] = view.last_step
        else:
            out.update({name: last[name] for name in plots})
        if first:
            last["pair"] = self.provider.describe()
            out["csv"] = out["json"] = gr.update(value=None, interactive=False)
        else:
            out["csv"], out["json"] = None, None
        out["pair"] = last["pair"]
        return tuple(out[name] for name in LIVE_OUTPUTS)

    def run_requested(self, request: gr.Request = None) -> None:
        """Run was clicked (called at once, while the run itself may wait in the queue behind other
        visitors' runs): until the run starts, this page's Stop withdraws it."""
        session = session_of(request)
        if session is not None:
            with self._live_lock:
                self._waiting[session] = threading.Event()

    def after_stop(self, view: RunView | None, request: gr.Request = None):
        """Stop was pressed: end this page's run after its current step and show what arrived. The run, once
        ended, sends the same values itself (with its downloads); showing them here too keeps Stop's answer
        prompt whichever of the two the page gets last."""
        with self._live_lock:
            live = self._live.get(session_of(request))
            waiting = self._waiting.get(session_of(request)) if live is None else None
        if waiting is not None:  # the page's run waits in the queue: it will not run
            waiting.set()
        if live is not None:
            live.stop()
            live.finished.wait(STOP_WAIT_S)  # within one decoding step
            view = live.view
        if view is None or not view.events:
            return tuple(gr.skip() for _ in LIVE_OUTPUTS)
        snapshot = view.snapshot()
        if live is not None and snapshot.summary is None:
            snapshot.summary = summarize(snapshot.events, snapshot.events[0].method, snapshot.wall_s, "stopped")
            snapshot.stopped = True
        return self.live_outputs(snapshot, charts_too=True, downloads=True)

    def scrub(self, view: RunView | None, step):
        """The step slider moved: redraw the tree of that step."""
        if view is None or not view.events:
            return gr.skip()
        try:
            step = int(step)
        except (TypeError, ValueError):
            raise fail("invalid input", f"step must be an integer; got {step!r}") from None
        return plot_data(charts.tree_spec(view.frame(), step, view.token_text))

    def replay(self, path):
        """A trace file was uploaded: show it like a finished run, without any model."""
        if not path:
            return tuple(gr.skip() for _ in LIVE_OUTPUTS)
        name = Path(str(path)).name
        try:
            path = uploaded_file(path)
            loaded = self.provider.loaded  # use the tokenizer only if a model is already up and matches
            events, _, _ = load_trace(path)
            tokenizer = loaded[0].tokenizer if loaded and events and events[0].vocab_size == loaded[0].vocab_size else None
            view = load_view(path, tokenizer)
            view.meta.setdefault("replayed_from", name)
            return self.live_outputs(view, charts_too=True)
        except ValueError as exc:
            raise fail("cannot replay", exc) from None
        except OSError as exc:
            raise fail("cannot read the uploaded file", exc) from None
        except Exception as exc:  # noqa: BLE001 — whatever a file holds, the page gets a message
            raise fail("cannot replay", f"{name} is not a readable NanoSpec trace ({type(exc).__name__})") from None

    # -- compare tab ----------------------------------------------------------------------
    def run_compare(self, prompt_text, methods, progress=gr.Progress(), peers=None, **knobs):
        """Compare was pressed: `ar` and each of `methods` on `prompt_text` with `knobs` (as `run_live`'s, but
        for the method), then the chosen vLLM `peers` (app/peers.py), each in its own process."""
        chosen = [methods] if isinstance(methods, str) else list(methods or [])
        bad = [m for m in chosen if m not in METHODS]
        if bad:
            raise fail("invalid input", f"unknown methods {bad}; choose from {', '.join(METHODS[1:])}")
        methods = [m for m in METHODS[1:] if m in chosen]
        if "method" in knobs:
            raise fail("invalid input", "Compare takes `methods`, not `method`")
        try:
            outside = app_peers.check(peers)
        except ValueError as exc:
            raise fail("invalid input", exc) from None
        prompt, base = self._inputs(prompt_text, {**knobs, "method": "ar"})
        self._engine(progress)
        greedy = base["temperature"] == 0.0
        summaries: dict[str, RunSummary] = {}
        runs: dict[str, tuple] = {}  # method -> (events, summary): what the race replays
        shown: tuple = (None, None)  # table and chart so far; re-sent as plain values (see `streamed_outputs`)
        cpu_shares: dict[str, float] = {}  # method -> CPU share of its timed run
        peer_runs, peer_lines = [], []  # vLLM's rows, and a line per kind that did not run
        engine, info = self.provider.get()

        def show(found=None, dtype=None) -> tuple[tuple, str]:
            table = compare_table(summaries, greedy, peer_runs, info.vocab_size)
            shares = {**cpu_shares, **{r.name: r.info.get("cpu_share") for r in peer_runs}}
            peer_rows = table.tail(len(peer_runs))  # the table's identity check of each vLLM row
            same = dict(zip(peer_rows["method"], peer_rows["identical"]))
            notes = "".join(f"\n\n{line}" for line in [app_peers.measured_note(peer_runs), *peer_lines] if line)
            text = compare_verdict(summaries, greedy, found, dtype, same if greedy else None)
            return ((display_table(table), PlotData(type="plotly", plot=charts.compare_figure(table).to_json())),
                    text + compare_trust(table, shares) + notes)

        for method in ["ar", *methods]:
            options = {**base, "method": method}
            key = (method, tuple(sorted((k, v) for k, v in options.items() if k != "max_new_tokens")))
            plan = [] if key in self._warm else [("warm-up", {**options, "max_new_tokens": 2})]
            for label, opts in [*plan, ("timed", options)]:
                try:
                    with metered() as meter:  # how much of the run's wall time this process computed
                        for text, summary, events in self._compare_run(prompt, opts, method, label):
                            if summary is None:
                                yield *shown, text, runs
                    cpu_shares[method] = meter.cpu_share
                except ValueError as exc:
                    raise fail("cannot run", exc) from None
                except Exception as exc:  # noqa: BLE001
                    raise fail(f"decoding failed ({type(exc).__name__})", exc) from None
            self._warm.add(key)
            summaries[method] = summary
            runs = {**runs, method: (events, summary)}
            shown, text = show()
            yield *shown, text, runs
        if outside and not greedy:
            peer_lines = ["vLLM rows compare greedy outputs token for token: set temperature 0 to run them."]
        elif outside:
            stop = threading.Event()  # set when the page's Stop closes this generator: the child is killed
            try:
                for item in app_peers.run(outside, engine, info, engine.encode_prompt(prompt), base["max_new_tokens"],
                                          stop):
                    if isinstance(item, str):
                        yield *shown, f"{text}\n\n{item}", runs
                    else:
                        peer_runs, peer_lines = item
            finally:
                stop.set()
        if outside:
            shown, text = show()
            yield *shown, text, runs
        if greedy and any(s.output_ids != summaries["ar"].output_ids for s in summaries.values()):
            try:  # where each differing output parts from ar's, and the target's margin there
                found, dtype = self._divergences(prompt, runs)
            except Exception as exc:  # noqa: BLE001 — the runs stand; only the explanation is missing
                logging.getLogger(__name__).warning("could not explain a divergence: %s", exc)
            else:
                shown, text = show(found, dtype)
                yield *shown, text, runs

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


# a speculative step runs at least one target forward, as a plain one does, and emits τ tokens on average:
# a speedup well above τ means the `ar` timing it divides by was disturbed (as `nanospec compare` checks)
TAU_SLACK = 1.25
# the share of wall time the server process computes while a run streams, below which the machine was busy:
# half the recorder's bound, as `python -m app.dev.screenshot` uses for the app (the page's own work and the
# decode thread's single-threaded stretches keep an idle server's share well below a bare benchmark's)
APP_MIN_CPU_SHARE = MIN_CPU_SHARE / 2


def compare_trust(table: pd.DataFrame, cpu_shares: dict[str, float]) -> str:
    """A warning (Markdown) when the Compare tab's speeds cannot be read as findings, else "": a method
    timed while the process computed less than `APP_MIN_CPU_SHARE` of the wall time (another job had the
    machine), or a speedup above τ x `TAU_SLACK`."""
    problems = []
    for method, speedup, tau in zip(table["method"], table["speedup"], table["tau"]):
        share = cpu_shares.get(method)
        if share is not None and share < APP_MIN_CPU_SHARE:
            problems.append(f"`{method}` ran while the machine was busy (this server computed {share:.0%} of its "
                            "wall time)")
        # τ bounds only this engine's speedup (a vLLM row divides its speed by this engine's ar)
        own = method != "ar" and not method.startswith(f"{PEER_ENGINE}:")
        if own and not (math.isnan(speedup) or math.isnan(tau)) and speedup > tau * TAU_SLACK:
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


LONG_PROMPT_TOKENS = 1_000  # a prompt this long (after the chat template) gets a word about its prefill


def long_prompt_note(engine, prompt) -> str | None:
    """A line for a long prompt: its length in tokens and that the prefill (one target forward over all of
    them, before the first answer token) is slow; None for a prompt of ordinary length."""
    try:
        n = len(engine.encode_prompt(prompt))
    except Exception:  # noqa: BLE001 — the run itself reports a prompt it cannot encode
        return None
    if n < LONG_PROMPT_TOKENS:
        return None
    return (f"Long prompt: {n:,} tokens. The prefill reads all of them in one target forward before the first "
            "answer token (seconds to minutes on a CPU), and every later step attends over them, so tokens/s "
            "with prefill is low.")


def prompt_note_html(note: str) -> str:
    return f'<p class="prompt-note" id="prompt-note" style="margin:6px 2px">⚠ {html.escape(note)}</p>'
