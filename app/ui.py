"""The Gradio explorer: callbacks (app/callbacks/) first, layout in `with gr.Blocks()`, wiring last.

`build_app(engine_loader)` builds the page around one shared model provider; nothing loads until
the first run. Tests inject a tiny random engine through `engine_loader`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app import peers, templating
from app.callbacks import COMPARE_COLUMNS, LIVE_OUTPUTS, Explorer
from app.charts import ANSWER_CSS, answer_html
from app.lesson import LIVE_HEADER, build_lesson_tab, register_deep_link
from app.inputs import SPEC_METHODS, defaults_for, example_prompts, parse_prompt
from app.models import EngineProvider, Loader, pair_loader
from app.pairs import PairProvider, build_pair_picker
from app.race import race_component
from nanospec.options import OPTIONS

MODEL_QUEUE = "model"  # every event that runs the model shares this queue: one run at a time

INTRO = """# NanoSpec Explorer
Speculative decoding where the drafter scores only a small, context-chosen slice of the vocabulary. Watch each
decoding step: which drafted tokens the target accepted, how big the drafter's vocabulary is, where it missed and
where the time goes. Output is lossless for every method."""
# the page's own CSS (app/templates/page.css): the first screen on a phone, dropdown text clear of its caret,
# slider end labels whole
PAGE_CSS = templating.text("page.css")


@dataclass
class Header:
    """The controls above the tabs: the prompt, Run / Stop and the run options."""

    pair_md: gr.Markdown
    prompt: gr.Textbox
    run_row: gr.Row
    run_btn: gr.Button
    stop_btn: gr.Button
    run_status: gr.HTML
    knobs: dict[str, gr.Component]


@dataclass
class LivePanel:
    """The Live tab's outputs and inputs (`named`: its outputs by their LIVE_OUTPUTS names; the pair line is
    the header's)."""

    tab: gr.Tab
    named: dict[str, gr.Component]
    replay_file: gr.File


@dataclass
class ComparePanel:
    tab: gr.Tab
    methods: gr.CheckboxGroup
    outside: gr.CheckboxGroup
    button: gr.Button
    stop: gr.Button
    verdict: gr.Markdown
    plot: gr.Plot
    table: gr.Dataframe
    runs: gr.State
    race_btn: gr.Button
    race: gr.HTML


def build_app(engine_loader: Loader | None = None, *, chart_interval_s: float = 1.0,
              device_hint: str | None = None, provider: EngineProvider | None = None) -> gr.Blocks:
    """The whole app. `engine_loader(progress) -> (SpecEngine, PairInfo)`; default: the offline pair.
    A `PairProvider` (app/pairs.py) instead adds the pair picker."""
    # -- callbacks -------------------------------------------------------------------------
    provider = provider or EngineProvider(engine_loader or pair_loader(), device_hint=device_hint)
    explorer = Explorer(provider, chart_interval_s=chart_interval_s)

    # -- layout ------------------------------------------------------------------------------
    with gr.Blocks(title="NanoSpec Explorer") as demo:
        # the page's CSS rides in the page itself (Gradio 6 takes `css` only at launch, which callers own)
        gr.HTML(f"<style>{PAGE_CSS}</style>", elem_id="page-style", padding=False)
        header = build_header(provider)
        with gr.Tabs() as tabs:
            live = build_live_tab()
            compare = build_compare_tab()
            # "Try it live" fills the prompt and the chapter's settings (the copy branch and the draft budget
            # as the chapter's run was recorded: the budget chapter opens Live with the budget on)
            lesson = build_lesson_tab({"prompt": header.prompt, **header.knobs}, tabs)

        # -- wiring ----------------------------------------------------------------------------
        wire_live(explorer, header, live, tabs)
        wire_compare(explorer, provider, header, compare)
        # Run, Stop and the method are Live's: Compare has its own button and method list
        for tab, shown in ((live.tab, True), (compare.tab, False), (lesson.tab, True)):
            if tab is not None:
                tab.select(lambda shown=shown: (gr.Row(visible=shown), gr.Radio(visible=shown)), None,
                           [header.run_row, header.knobs["method"]], queue=False, show_progress="hidden",
                           api_visibility="undocumented")
        demo.load(provider.describe, None, header.pair_md, api_visibility="undocumented", queue=False)
        register_deep_link(demo, lesson)  # ?chapter=N opens the Lesson tab; ?presenter=1 enlarges fonts
    demo.queue(default_concurrency_limit=1)
    calm_queue_polling(demo)
    return demo


def build_header(provider: EngineProvider) -> Header:
    """The intro, the pair, the prompt with Run / Stop right under it, examples and the run options."""
    # the Live header: collapses in lesson-first mode (presenter mode, chapter links)
    gr.Markdown(INTRO, elem_id="intro", elem_classes=[LIVE_HEADER])
    pair_md = gr.Markdown(provider.describe(), elem_id="pair-info", elem_classes=[LIVE_HEADER])
    if isinstance(provider, PairProvider):
        with gr.Column(elem_classes=[LIVE_HEADER]):
            build_pair_picker(provider, pair_md, MODEL_QUEUE)
    examples = example_prompts()
    with gr.Row(equal_height=False, elem_classes=[LIVE_HEADER]):
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt (the chat template is applied for you)", lines=3,
                                elem_id="prompt", placeholder="Ask something, or pick an example below. "
                                "For a conversation start lines with 'user:' / 'assistant:'.")
            # Run right under the prompt: on the first screen at 1280x720 and on a phone (the Live tab's
            # action; hidden on Compare, which has its own button)
            with gr.Row(equal_height=True, elem_id="run-row") as run_row:
                run_btn = gr.Button("Run", variant="primary", elem_id="run-btn", scale=1, min_width=84)
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1, min_width=84)
                # where a run's progress shows (the first run loads the model: tens of seconds)
                run_status = gr.HTML("", elem_id="run-status", min_height=44, scale=2, padding=False)
            gr.Examples(examples=[[text] for _, text in examples], inputs=[prompt],
                        example_labels=[label for label, _ in examples], examples_per_page=7,
                        label="Example prompts (one per category per page)")
        with gr.Column(scale=2):
            knobs = build_knobs(provider.device_hint)
    return Header(pair_md, prompt, run_row, run_btn, stop_btn, run_status, knobs)


def build_knobs(device_hint: str | None) -> dict[str, gr.Component]:
    """The run options (app/inputs.py's KNOBS), each built from its row in the option table: the first two on
    show, the rest two to a row (a slider's end labels, "16384", need the width); the GPU tree on a GPU."""
    start = defaults_for(device_hint)
    names = list(start)
    knobs = {name: knob_control(name, start[name]) for name in names[:2]}
    with gr.Accordion("Tree, sampling and vocabulary settings", open=False):
        for row in range(2, len(names), 2):
            with gr.Row():
                knobs.update({name: knob_control(name, start[name]) for name in names[row:row + 2]})
    return knobs


def build_live_tab() -> LivePanel:
    """KPIs, the answer, the four charts with the tree's step slider, downloads and replay."""
    with gr.Tab("Live", id="live") as tab:
        kpis = gr.HTML(elem_id="kpis")
        answer = gr.HTML(answer_html([], []), css_template=ANSWER_CSS, elem_id="answer", js_on_load=None)
        with gr.Row(equal_height=False):
            with gr.Column():
                tree_plot = gr.Plot(label="Draft tree", elem_id="tree-plot", show_label=False)
                step = Slider(0, 1, value=0, step=1, label="step shown in the tree (0 = prefill)",
                              elem_id="step-slider")
            with gr.Column():
                phase_plot = gr.Plot(label="Time breakdown", elem_id="phase-plot", show_label=False)
                depth_plot = gr.Plot(label="Acceptance by draft position", elem_id="depth-plot", show_label=False)
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
    named = {"answer": answer, "kpis": kpis, "vocab_plot": vocab_plot, "coverage_plot": coverage_plot,
             "tree_plot": tree_plot, "phase_plot": phase_plot, "step": step, "view": view, "csv": csv_btn,
             "json": json_btn, "depth_plot": depth_plot}
    return LivePanel(tab, named, replay_file)


def build_compare_tab() -> ComparePanel:
    """The methods (and vLLM rows) to compare with `ar`, the verdict, chart, table and race."""
    with gr.Tab("Compare", id="compare") as tab:
        gr.Markdown("Runs the prompt and settings above through `ar` and the chosen methods, same seed: "
                    "press **Compare**. Each method gets one short untimed warm-up per process.")
        with gr.Row():
            with gr.Column(scale=2):
                methods = CheckboxGroup(list(SPEC_METHODS), value=["full", "nanospec"],
                                        label="Methods to compare with ar", elem_id="compare-methods")
                offered, about = peers.control_info()
                # without vLLM the rows are offered disabled, the reason in their info line
                outside = CheckboxGroup(list(peers.CHOICES), value=[],
                                        label="vLLM rows (optional)" + ("" if offered else ": not available"),
                                        info=about, interactive=offered, elem_id="compare-peers",
                                        elem_classes=[] if offered else ["unavailable"])
            with gr.Column():
                button = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                stop = gr.Button("Stop", variant="stop")
        verdict = gr.Markdown(elem_id="compare-verdict")
        plot = gr.Plot(label="Speed", elem_id="compare-plot", show_label=False)
        table = gr.Dataframe(headers=COMPARE_COLUMNS, label="Results", interactive=False, elem_id="compare-table")
        runs = gr.State(None)  # the runs just made, for the race
        race_btn = gr.Button("Race these runs ▶ (replay them side by side in their recorded time)",
                             elem_id="compare-race-btn")
        race = race_component(elem_id="compare-race")
    return ComparePanel(tab, methods, outside, button, stop, verdict, plot, table, runs, race_btn, race)


def wire_live(explorer: Explorer, header: Header, live: LivePanel, tabs: gr.Tabs) -> None:
    """Run, Stop, the step slider and replay."""
    named = {**live.named, "pair": header.pair_md}
    outputs = [named[name] for name in LIVE_OUTPUTS]
    run_btn = header.run_btn
    # Stop tells the run to end after its current step; the run then sends its last values itself
    # (a Gradio cancel would race the run's last streamed values against Stop's: see `LiveRun`)
    run_btn.click(explorer.run_requested, None, None, queue=False, api_visibility="undocumented")
    # Run shows its run: from the Lesson tab it opens Live
    run_btn.click(lambda: gr.Tabs(selected="live"), None, tabs, queue=False, api_visibility="undocumented",
                  show_progress="hidden")
    # the knobs go by name (`inputs_kwargs`): each callback gets them as one dict, and the API's parameters
    # are the prompt and the option names
    run_btn.click(explorer.run_live, [header.prompt], outputs, inputs_kwargs=header.knobs, api_name="run",
                  concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                  # an empty prompt is told on the prompt box itself (Gradio's validator): no run, no toast
                  # over the controls, no error badges on the outputs
                  validator=check_prompt,
                  show_progress_on=[header.run_status, live.named["answer"]])  # next to Run: in view when pressed
    header.stop_btn.click(explorer.after_stop, [live.named["view"]], outputs, api_name="stop",
                          show_progress="hidden", concurrency_limit=None)
    step = live.named["step"]
    step.input(explorer.scrub, [live.named["view"], step], live.named["tree_plot"], api_name="scrub",
               trigger_mode="always_last", concurrency_limit=None, show_progress="hidden")
    # a bad file: its message (a toast) and nothing else, not an error badge on every output
    live.replay_file.upload(explorer.replay, [live.replay_file], outputs, api_name="replay", concurrency_limit=None,
                            show_progress="hidden")


def wire_compare(explorer: Explorer, provider: EngineProvider, header: Header, compare: ComparePanel) -> None:
    """Compare (the page's settings but the method, which Compare chooses itself), its Stop and the race."""
    settings = {name: control for name, control in header.knobs.items() if name != "method"}
    event = compare.button.click(explorer.run_compare, [header.prompt, compare.methods],
                                 [compare.table, compare.plot, compare.verdict, compare.runs],
                                 inputs_kwargs={**settings, "peers": compare.outside},
                                 api_name="compare", validator=check_prompt,
                                 concurrency_id=MODEL_QUEUE, concurrency_limit=1,
                                 show_progress_on=[compare.verdict])
    # Compare may be the run that loaded the pair: the header then names it, as after a Live run
    event.then(provider.describe, None, header.pair_md, api_visibility="undocumented", queue=False)
    compare.stop.click(None, None, None, cancels=[event], api_visibility="undocumented")
    compare.race_btn.click(explorer.race, compare.runs, compare.race, api_visibility="undocumented", queue=False)


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


def check_prompt(prompt_text, *args, **knobs):
    """Gradio validator of Run and Compare: an empty prompt is marked on the prompt box (the run itself
    refuses it again, for API clients)."""
    try:
        parse_prompt(prompt_text)
        verdict = gr.validate(True, "")
    except ValueError as exc:
        verdict = gr.validate(False, str(exc))
    return (verdict, *(gr.validate(True, "") for _ in range(len(args) + len(knobs))))  # one per input


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
        # the allowed range beside the box: a typed value outside it is kept as typed until the box loses focus
        common["info"] = f"allowed: {range_text(lo, hi)}"
        step = opt.ui_step or (1 if opt.type is int else (hi - lo) / 100)
        if (hi - lo) / step <= MAX_SLIDER_STEPS:
            return Slider(lo, hi, step=step, **common)
    return Number(minimum=lo, maximum=hi, precision=0 if opt.type is int else None, **common)


def range_text(lo, hi) -> str:
    """`1 to 512`, `0.05 to 1`: an option's range as the page states it."""
    def number(v) -> str:
        return f"{v:,}" if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1000 else f"{v:g}"
    return f"{number(lo)} to {number(hi)}"


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
