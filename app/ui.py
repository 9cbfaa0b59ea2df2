"""The Gradio explorer: callbacks (app/callbacks.py) first, layout in `with gr.Blocks()`, wiring last.

`build_app(engine_loader)` builds the page around one shared model provider; nothing loads until
the first run. Tests inject a tiny random engine through `engine_loader`.
"""

from __future__ import annotations

import gradio as gr

from app import peers
from app.callbacks import COMPARE_COLUMNS, LIVE_OUTPUTS, Explorer
from app.charts import ANSWER_CSS, answer_html
from app.lesson import LIVE_HEADER, build_lesson_tab, register_deep_link
from app.inputs import SPEC_METHODS, defaults_for, example_prompts
from app.models import EngineProvider, Loader, pair_loader
from app.pairs import PairProvider, build_pair_picker
from app.race import race_component
from nanospec.options import OPTIONS

MODEL_QUEUE = "model"  # every event that runs the model shares this queue: one run at a time

INTRO = """# NanoSpec Explorer
Speculative decoding where the drafter scores only a small, context-chosen slice of the vocabulary.
Pick a prompt and a method, press **Run**, and watch each decoding step: which tokens the drafter got right,
how big its vocabulary is, where it missed and where the time goes. Output is lossless for every method."""


def build_app(engine_loader: Loader | None = None, *, chart_interval_s: float = 1.0,
              device_hint: str | None = None, provider: EngineProvider | None = None) -> gr.Blocks:
    """The whole app. `engine_loader(progress) -> (SpecEngine, PairInfo)`; default: the offline pair.
    A `PairProvider` (app/pairs.py) instead adds the pair picker."""
    # -- callbacks -------------------------------------------------------------------------
    provider = provider or EngineProvider(engine_loader or pair_loader(), device_hint=device_hint)
    explorer = Explorer(provider, chart_interval_s=chart_interval_s)
    examples = example_prompts()

    # -- layout ------------------------------------------------------------------------------
    with gr.Blocks(title="NanoSpec Explorer") as demo:
        # the Live header: collapses in lesson-first mode (presenter mode, chapter links)
        gr.Markdown(INTRO, elem_classes=[LIVE_HEADER])
        pair_md = gr.Markdown(provider.describe(), elem_id="pair-info", elem_classes=[LIVE_HEADER])
        if isinstance(provider, PairProvider):
            with gr.Column(elem_classes=[LIVE_HEADER]):
                build_pair_picker(provider, pair_md, MODEL_QUEUE)
        with gr.Row(equal_height=False, elem_classes=[LIVE_HEADER]):
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt (the chat template is applied for you)", lines=4,
                                    elem_id="prompt", placeholder="Ask something, or pick an example below. "
                                    "For a conversation start lines with 'user:' / 'assistant:'.")
                gr.Examples(examples=[[text] for _, text in examples], inputs=[prompt],
                            example_labels=[label for label, _ in examples], examples_per_page=7,
                            label="Example prompts (one per category per page)")
            with gr.Column(scale=2):
                # the run options (app/inputs.py's KNOBS), each built from its row in the option table: the
                # first two on show, the rest three to a row; the GPU tree on a GPU
                start = defaults_for(provider.device_hint)
                names = list(start)
                knobs = {name: knob_control(name, start[name]) for name in names[:2]}
                with gr.Accordion("Tree, sampling and vocabulary settings", open=False):
                    for row in range(2, len(names), 3):
                        with gr.Row():
                            knobs.update({name: knob_control(name, start[name]) for name in names[row:row + 3]})

        with gr.Tabs() as tabs:
            with gr.Tab("Live", id="live"):
                with gr.Row(equal_height=True):
                    run_btn = gr.Button("Run", variant="primary", elem_id="run-btn", scale=1)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1)
                    # where a run's progress shows (the first run loads the model: tens of seconds)
                    run_status = gr.HTML("", elem_id="run-status", min_height=44, scale=2, padding=False)
                kpis = gr.HTML(elem_id="kpis")
                answer = gr.HTML(answer_html([], []), css_template=ANSWER_CSS, elem_id="answer", js_on_load=None)
                with gr.Row(equal_height=False):
                    with gr.Column():
                        tree_plot = gr.Plot(label="Draft tree", elem_id="tree-plot", show_label=False)
                        step = Slider(0, 1, value=0, step=1, label="step shown in the tree (0 = prefill)",
                                         elem_id="step-slider")
                    with gr.Column():
                        phase_plot = gr.Plot(label="Time breakdown", elem_id="phase-plot", show_label=False)
                        depth_plot = gr.Plot(label="Acceptance by draft position", elem_id="depth-plot",
                                             show_label=False)
                with gr.Row(equal_height=False):
                    vocab_plot = gr.Plot(label="Active vocabulary", elem_id="vocab-plot", show_label=False)
                    coverage_plot = gr.Plot(label="Coverage", elem_id="coverage-plot", show_label=False)
                with gr.Row():
                    csv_btn = gr.DownloadButton("Download trace (.csv)", interactive=False, elem_id="csv-btn")
                    json_btn = gr.DownloadButton("Download trace (.json)", interactive=False, elem_id="json-btn")
                with gr.Accordion("Replay a saved trace (no model needed)", open=False):
                    replay_file = gr.File(label="Trace file (.json or .csv saved by NanoSpec)",
                                          file_types=[".json", ".csv"], type="filepath", elem_id="replay-file")
                view = gr.State(None)

            with gr.Tab("Compare", id="compare"):
                gr.Markdown("The prompt and settings above through `ar` and the chosen methods, same seed. "
                            "Each method gets one short untimed warm-up per process.")
                with gr.Row():
                    with gr.Column(scale=2):
                        methods = CheckboxGroup(list(SPEC_METHODS), value=["full", "nanospec"],
                                                label="Methods to compare with ar", elem_id="compare-methods")
                        offered, about = peers.control_info()
                        outside = CheckboxGroup(list(peers.CHOICES), value=[], label="vLLM rows (optional)",
                                                info=about, interactive=offered, elem_id="compare-peers")
                    with gr.Column():
                        compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                        compare_stop = gr.Button("Stop", variant="stop")
                verdict = gr.Markdown(elem_id="compare-verdict")
                compare_plot = gr.Plot(label="Speed", elem_id="compare-plot", show_label=False)
                table = gr.Dataframe(headers=COMPARE_COLUMNS, label="Results", interactive=False,
                                     elem_id="compare-table")
                compare_runs = gr.State(None)  # the runs just made, for the race
                race_btn = gr.Button("Race these runs ▶ (replay them side by side in their recorded time)",
                                     elem_id="compare-race-btn")
                race = race_component(elem_id="compare-race")

            # "Try it live" fills the prompt and the chapter's settings (the copy branch and the draft budget
            # as the chapter's run was recorded: the budget chapter opens Live with the budget on)
            lesson = build_lesson_tab({"prompt": prompt, **knobs}, tabs)

        # -- wiring ----------------------------------------------------------------------------
        named = {"answer": answer, "kpis": kpis, "vocab_plot": vocab_plot, "coverage_plot": coverage_plot,
                 "tree_plot": tree_plot, "phase_plot": phase_plot, "step": step, "view": view, "csv": csv_btn,
                 "json": json_btn, "pair": pair_md, "depth_plot": depth_plot}
        live_outputs = [named[name] for name in LIVE_OUTPUTS]
        # Stop tells the run to end after its current step; the run then sends its last values itself
        # (a Gradio cancel would race the run's last streamed values against Stop's: see `LiveRun`)
        run_btn.click(explorer.run_requested, None, None, queue=False, api_visibility="undocumented")
        # the knobs go by name (`inputs_kwargs`): each callback gets them as one dict, and the API's parameters
        # are the prompt and the option names
        run_btn.click(explorer.run_live, [prompt], live_outputs, inputs_kwargs=knobs, api_name="run",
                      concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                      show_progress_on=[run_status, answer])  # next to Run: in view when it is pressed
        stop_btn.click(explorer.after_stop, [view], live_outputs, api_name="stop", show_progress="hidden",
                       concurrency_limit=None)
        step.input(explorer.scrub, [view, step], tree_plot, api_name="scrub", trigger_mode="always_last",
                   concurrency_limit=None, show_progress="hidden")
        # a bad file: its message (a toast) and nothing else, not an error badge on every output
        replay_file.upload(explorer.replay, [replay_file], live_outputs, api_name="replay", concurrency_limit=None,
                           show_progress="hidden")
        settings = {name: control for name, control in knobs.items() if name != "method"}  # Compare has its own
        compare_event = compare_btn.click(explorer.run_compare, [prompt, methods],
                                          [table, compare_plot, verdict, compare_runs],
                                          inputs_kwargs={**settings, "peers": outside},
                                          api_name="compare",
                                          concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                                          show_progress_on=[verdict])
        # Compare may be the run that loaded the pair: the header then names it, as after a Live run
        compare_event.then(provider.describe, None, pair_md, api_visibility="undocumented", queue=False)
        compare_stop.click(None, None, None, cancels=[compare_event], api_visibility="undocumented")
        race_btn.click(explorer.race, compare_runs, race, api_visibility="undocumented", queue=False)
        demo.load(provider.describe, None, pair_md, api_visibility="undocumented", queue=False)
        register_deep_link(demo, lesson)  # ?chapter=N opens the Lesson tab; ?presenter=1 enlarges fonts
    demo.queue(default_concurrency_limit=1)
    calm_queue_polling(demo)
    return demo


def calm_queue_polling(demo: gr.Blocks, idle_poll_s: float = 0.05, progress_poll_s: float = 0.1) -> None:
    """Slow Gradio's queue polling down: by default its event loop wakes every 1 ms to look for new
    jobs and every 10 ms for progress. On a small CPU those wake-ups take time from the decoding
    thread (`python -m app.dev.bench_app` measures the app's overhead; docs/benchmarks.md). A queued run now
    starts up to 50 ms later. Gradio has no public setting for this; if its queue changes, this
    does nothing."""
    queue = getattr(demo, "_queue", None)
    for name, value in (("sleep_when_free", idle_poll_s), ("progress_update_sleep_when_free", progress_poll_s)):
        if isinstance(getattr(queue, name, None), (int, float)):
            setattr(queue, name, max(getattr(queue, name), value))


# a slider over more steps than this is no use to drag: a number box instead (the seed's)
MAX_SLIDER_STEPS = 10_000


def knob_control(name: str, value) -> gr.Component:
    """The control for run option `name` (nanospec/options.py), starting at `value`: a radio for a choice, a
    checkbox for a switch (both with the option's help as their info line), a slider over the option's `ui`
    range (or its bounds), a number box where that range is too wide to slide or open-ended."""
    opt = OPTIONS[name]
    common = dict(value=value, label=opt.label, elem_id=name.replace("_", "-"))
    if opt.choices is not None:
        return Radio(list(opt.choices), info=opt.help, **common)
    if opt.type is bool:
        return gr.Checkbox(info=opt.help, **common)
    lo, hi = opt.ui or (opt.lo, opt.hi)
    if lo is not None and hi is not None:
        step = opt.ui_step or (1 if opt.type is int else (hi - lo) / 100)
        if (hi - lo) / step <= MAX_SLIDER_STEPS:
            return Slider(lo, hi, step=step, **common)
    return Number(minimum=lo, maximum=hi, precision=0 if opt.type is int else None, **common)


# Gradio's own range/choice checks raise errors that print a traceback in the server log. These
# variants (same widgets in the page: `is_template` makes the frontend use the parent's) pass the
# raw value on; `app.inputs.generation_options` and the engine validate it and raise one clean gr.Error.
class Slider(gr.Slider):
    is_template = True

    def preprocess(self, payload):
        return payload


class Number(gr.Number):
    is_template = True

    def preprocess(self, payload):
        return payload


class Radio(gr.Radio):
    is_template = True

    def preprocess(self, payload):
        return payload


class CheckboxGroup(gr.CheckboxGroup):
    is_template = True

    def preprocess(self, payload):
        return payload
