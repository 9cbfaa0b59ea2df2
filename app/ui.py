"""The Gradio explorer: callbacks (app/callbacks.py) first, layout in `with gr.Blocks()`, wiring last.

`build_app(engine_loader)` builds the page around one shared model provider; nothing loads until
the first run. Tests inject a tiny random engine through `engine_loader`.
"""

from __future__ import annotations

import gradio as gr

from .callbacks import COMPARE_COLUMNS, LIVE_OUTPUTS, Explorer
from .charts import ANSWER_CSS, answer_html
from .lesson import LIVE_HEADER, build_lesson_tab, register_deep_link
from .inputs import DEFAULTS, LIMITS, defaults_for, METHODS, SPEC_METHODS, example_prompts
from .models import EngineProvider, Loader, pair_loader
from .pairs import PairProvider, build_pair_picker
from .race import race_component

MODEL_QUEUE = "model"  # every event that runs the model shares this queue: one run at a time

INTRO = """# NanoSpec Explorer
Speculative decoding where the drafter scores only a small, context-chosen slice of the vocabulary.
Pick a prompt and a method, press **Run**, and watch each decoding step: which tokens the drafter got right,
how big its vocabulary is, where it missed and where the time goes. Output is lossless for every method."""

BUDGET_HELP = "verify only the drafted nodes that pay for their verification on this device"
METHOD_HELP = ("ar = plain autoregressive · full = EAGLE-2 tree over all V tokens · static = top-N frequent tokens "
               "(FR-Spec) · nanospec = in-context set · hybrid = in-context set ∪ frequent core")


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
                method = Radio(list(METHODS), value=DEFAULTS["method"], label="Method (Live tab)",
                                  info=METHOD_HELP, elem_id="method")
                max_new = _slider("max_new_tokens", "max new tokens", elem_id="max-new-tokens")
                with gr.Accordion("Tree, sampling and vocabulary settings", open=False):
                    with gr.Row():
                        start = defaults_for(provider.device_hint)  # the GPU tree on a GPU
                        depth = _slider("depth", "tree depth", defaults=start)
                        top_k = _slider("top_k", "top-k per level", defaults=start)
                        total = _slider("total_tokens", "total tree tokens", defaults=start)
                    with gr.Row():
                        temperature = _slider("temperature", "temperature (0 = greedy)", step=0.05)
                        top_p = _slider("top_p", "top-p", step=0.05)
                        seed = Number(value=DEFAULTS["seed"], precision=0, label="seed", minimum=0)
                    with gr.Row():
                        capacity = _slider("capacity", "NanoSpec capacity (in-context set size limit)", step=64)
                        copy_branch = _slider("copy_branch", "copy branch: prompt-lookup tokens added to the "
                                              "tree (0 = off)", defaults=start, elem_id="copy-branch")
                        budget = gr.Checkbox(value=start["budget"], label="draft budget", info=BUDGET_HELP,
                                             elem_id="budget")
        knobs = [max_new, depth, top_k, total, temperature, top_p, seed, capacity, copy_branch, budget]

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
                    methods = CheckboxGroup(list(SPEC_METHODS), value=["full", "nanospec"],
                                               label="Methods to compare with ar", elem_id="compare-methods")
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

            lesson = build_lesson_tab(
                {"prompt": prompt, "method": method, "max_new_tokens": max_new, "depth": depth, "top_k": top_k,
                 "total_tokens": total, "temperature": temperature, "top_p": top_p, "seed": seed,
                 "capacity": capacity},
                tabs)

        # -- wiring ----------------------------------------------------------------------------
        named = {"answer": answer, "kpis": kpis, "vocab_plot": vocab_plot, "coverage_plot": coverage_plot,
                 "tree_plot": tree_plot, "phase_plot": phase_plot, "step": step, "view": view, "csv": csv_btn,
                 "json": json_btn, "pair": pair_md, "depth_plot": depth_plot}
        live_outputs = [named[name] for name in LIVE_OUTPUTS]
        # Stop tells the run to end after its current step; the run then sends its last values itself
        # (a Gradio cancel would race the run's last streamed values against Stop's: see `LiveRun`)
        run_btn.click(explorer.run_requested, None, None, queue=False, api_visibility="undocumented")
        run_btn.click(explorer.run_live, [prompt, method, *knobs], live_outputs, api_name="run",
                      concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                      show_progress_on=[run_status, answer])  # next to Run: in view when it is pressed
        stop_btn.click(explorer.after_stop, [view], live_outputs, api_name="stop", show_progress="hidden",
                       concurrency_limit=None)
        step.input(explorer.scrub, [view, step], tree_plot, api_name="scrub", trigger_mode="always_last",
                   concurrency_limit=None, show_progress="hidden")
        # a bad file: its message (a toast) and nothing else, not an error badge on every output
        replay_file.upload(explorer.replay, [replay_file], live_outputs, api_name="replay", concurrency_limit=None,
                           show_progress="hidden")
        compare_event = compare_btn.click(explorer.run_compare, [prompt, methods, *knobs],
                                          [table, compare_plot, verdict, compare_runs], api_name="compare",
                                          concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                                          show_progress_on=[verdict])
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
    thread (`python -m app.bench_app` measures the app's overhead; docs/benchmarks.md). A queued run now
    starts up to 50 ms later. Gradio has no public setting for this; if its queue changes, this
    does nothing."""
    queue = getattr(demo, "_queue", None)
    for name, value in (("sleep_when_free", idle_poll_s), ("progress_update_sleep_when_free", progress_poll_s)):
        if isinstance(getattr(queue, name, None), (int, float)):
            setattr(queue, name, max(getattr(queue, name), value))


def _slider(name: str, label: str, step: float = 1, defaults: dict = DEFAULTS, **kw) -> gr.Slider:
    lo, hi = LIMITS[name]
    return Slider(lo, hi, value=defaults[name], step=step, label=label, **kw)


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
