"""The Live tab's callbacks: a streamed run, Stop, the step slider and replaying a saved trace (`LiveTab`,
a part of `Explorer`, which supplies the provider, the decoding and the input check)."""

from __future__ import annotations

import html
import threading
import time
from dataclasses import asdict
from pathlib import Path

import gradio as gr

from nanospec import RunSummary, load_trace, stop_message, summarize

from app import charts
from app.callbacks.shared import fail, plot_data, session_of
from app.templating import render
from app.trace import RunView, TokenDecoder, load_view, save_downloads, uploaded_file

LIVE_OUTPUTS = ("answer", "kpis", "vocab_plot", "coverage_plot", "tree_plot", "phase_plot", "step",
                "view", "csv", "json", "depth_plot", "pair")
PLOTS = ("vocab_plot", "coverage_plot", "tree_plot", "phase_plot", "depth_plot")  # redrawn together
STOP_WAIT_S = 30.0  # Stop waits this long at most for the run's current step to end
LONG_PROMPT_TOKENS = 1_000  # a prompt this long (after the chat template) gets a word about its prefill


def stopped_note(view: RunView) -> str:
    """The line under the KPIs of a run that Stop ended."""
    return render("stopped_note.html", step=view.last_step, why=html.escape(stop_message("stopped")))


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
    return render("prompt_note.html", note=html.escape(note))


def only_kpis(value: str) -> tuple:
    """LIVE_OUTPUTS that change only the line where the KPIs appear."""
    return tuple(value if name == "kpis" else gr.skip() for name in LIVE_OUTPUTS)


def with_note(out: tuple, note: str) -> tuple:
    """LIVE_OUTPUTS with a line under the KPIs (why the run ended early)."""
    values = dict(zip(LIVE_OUTPUTS, out))
    values["kpis"] = values["kpis"] + render("end_note.html", note=html.escape(note))
    return tuple(values[name] for name in LIVE_OUTPUTS)


def break_even_of(view: RunView) -> charts.BreakEven:
    """The run's break-even τ, priced by the cost curve it recorded (a budgeted run) or, for a run without the
    budget, the last one a run of the same pair recorded in this process."""
    return charts.break_even(view.events, view.meta.get("cost_curve") or view.meta.get("pair_cost_curve"))


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


class LiveTab:
    """The Live tab's callbacks (mixed into `Explorer`)."""

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
        engine = yield from self._prepare_live(prompt, options, view, progress)
        pump = live.pump = self._pump(self._decode(prompt, options))
        if live.stop_requested.is_set():  # Stop came while the model loaded
            pump.stop()
        t0 = time.perf_counter()
        try:
            yield from self._stream_live(pump, view, TokenDecoder(engine.tokenizer), engine, t0)
        except ValueError as exc:
            raise fail("cannot run", exc) from None
        except Exception as exc:  # noqa: BLE001 — a decoding fault must not take the app down
            raise fail(f"decoding failed ({type(exc).__name__})", exc) from None
        finally:
            pump.stop()  # Stop / closed tab: the decoding thread ends after its current step
        yield self._finish_live(view, live, options, engine, t0)

    def _prepare_live(self, prompt, options: dict, view: RunView, progress):
        """Before the first step: the first run loads the model (said where the KPIs will be, in view of the
        Run button), and a long prompt gets a word before its prefill starts; returns the engine."""
        loading = self._loading(progress)
        while True:
            try:
                note = next(loading)
            except StopIteration as done:
                engine, info = done.value
                break
            yield only_kpis(note)
        view.meta["pair"] = asdict(info)
        if not options.get("budget") and engine in self._curves:  # prices the break-even τ (no budget curve)
            view.meta["pair_cost_curve"] = self._curves[engine]
        note = long_prompt_note(engine, prompt)
        if note:  # kept under the KPIs while the run lasts
            view.meta["prompt_note"] = note
            yield only_kpis(prompt_note_html(note))
        return engine

    def _stream_live(self, pump, view: RunView, decoder: TokenDecoder, engine, t0: float):
        """Yields LIVE_OUTPUTS as the steps arrive; charts cost far more than text: they are redrawn at most
        every chart_interval_s, and never for more than ~1/10 of the time (the page stays fluid on slow machines)."""
        last_draw, draw_cost, first = t0, 0.0, True
        last: dict = {}
        for batch in pump.batches():
            for item in batch:
                if isinstance(item, RunSummary):
                    view.summary = item
                elif isinstance(item, dict):  # the draft budget's cost curve (kept with the trace)
                    view.meta.update(item)
                    self._curves[engine] = item.get("cost_curve")
                else:
                    view.add(item, decoder)
            if view.summary is not None or not view.events:
                continue
            view.wall_s = time.perf_counter() - t0
            draw = first or time.perf_counter() - last_draw >= max(self.chart_interval_s, 10 * draw_cost)
            started = time.perf_counter()
            out = self.streamed_outputs(view, draw, first, last)
            if draw:
                last_draw, draw_cost = time.perf_counter(), time.perf_counter() - started
            first = False
            yield out

    def _finish_live(self, view: RunView, live: LiveRun, options: dict, engine, t0: float) -> tuple:
        """The run's last values: its summary (or a stopped one), every chart, the downloads."""
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
            out = with_note(out, note)
        return out

    def live_outputs(self, view: RunView, charts_too: bool, step: int | None = None, downloads: bool = False,
                     pair: str | None = None) -> tuple:
        """Values for LIVE_OUTPUTS; charts and the step slider only when `charts_too` (text and KPIs every
        step). While a run streams, `streamed_outputs` replaces the slider, files and skipped charts."""
        # text and KPIs every step, from plain lists (cheap); the pandas frame only for chart redraws
        skip = gr.skip()
        out = {"answer": charts.answer_html(view.pieces, view.origins, view.special), "kpis": self.kpis(view),
               "step": skip, "view": view, "csv": skip, "json": skip,
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

    @staticmethod
    def kpis(view: RunView) -> str:
        """The KPI cards (with the break-even τ), the draft budget's line and any note, from plain lists."""
        method = view.events[0].method if view.events else "ar"
        running = view.summary or summarize(view.events, method, view.wall_s, "running")
        kpis = charts.kpi_html(charts.kpi_from_summary(running), break_even_of(view))
        kpis += charts.budget_html(view.events, view.meta.get("cost_curve"), "replayed_from" in view.meta)
        if view.stopped:
            kpis += stopped_note(view)
        if view.meta.get("prompt_note"):
            kpis += prompt_note_html(view.meta["prompt_note"])
        return kpis

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
