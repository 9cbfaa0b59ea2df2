"""The Lesson tab renders every chapter from the shipped traces, fast, without ever loading a model."""

from __future__ import annotations

import gzip
import json
import time
from types import SimpleNamespace

import gradio as gr
import plotly.graph_objects as go
import pytest

from app import lesson as lc
from app.lesson import questions
from app.lesson import tab as lesson_tab
from nanospec.lesson import record as lesson_traces
from nanospec.pair import DEFAULT_HEAD


def _no_model(*args, **kwargs):
    raise AssertionError("the lesson must never load a model")


@pytest.fixture
def no_model_loading(monkeypatch):
    import nanospec.loaders.loading
    import nanospec.pair

    monkeypatch.setattr(nanospec.pair, "load_pair", _no_model)
    monkeypatch.setattr(nanospec.loaders.loading, "load_target", _no_model)
    monkeypatch.setattr(nanospec.pair, "load_target", _no_model, raising=False)
    lesson_tab.lesson_data.cache_clear()
    yield
    lesson_tab.lesson_data.cache_clear()


@pytest.fixture(scope="module")
def shipped() -> lc.Lesson:
    return lc.load_lesson()


# -- the shipped traces -------------------------------------------------------------------------
def test_shipped_traces_are_small_and_complete(shipped):
    files = list(lc.LESSON_DIR.glob("*"))
    assert sum(f.stat().st_size for f in files) < 5e6
    assert (lc.LESSON_DIR / "README.md").exists()
    assert len(shipped.prompts) >= 3
    for pid in shipped.prompt_ids:
        assert set(shipped.keys(pid)) == set(lesson_traces.RUNS)
        for key in lesson_traces.RUNS:
            run = shipped.run(pid, key)
            assert 1 <= run.summary.new_tokens <= 96
            assert run.meta["identical_to_first"], f"{pid}/{key}: greedy output differs from ar"
            assert len(run.meta["top3"]) == len(run.meta["prompt_ids"]) + len(run.output_ids)
    sweep = shipped.sweep
    assert sweep and {p["vocab"] for p in sweep["points"]} >= {32000, 49152, 128256, 151936, 256000}
    assert sweep["hidden"] == 576 and sweep["machine"]["text"]


def test_shipped_traces_use_the_shipped_head(shipped):
    if not (DEFAULT_HEAD / "model.safetensors").exists():
        pytest.skip("the shipped head is not in assets/ yet: traces are development traces")
    pair = shipped.info["pair"]
    assert pair["head_kind"] == "shipped", "re-record with `python -m nanospec record-lesson`"
    assert pair["head_sha256"] == lesson_traces.head_digest(DEFAULT_HEAD), \
        "the shipped head changed since the traces were recorded: re-record with `python -m nanospec record-lesson`"


def test_lesson_loads_fast(no_model_loading):
    t0 = time.perf_counter()
    lesson = lesson_tab.lesson_data()
    lc.chapter_figure(lesson, 1, lesson.prompt_ids[0], 1)
    assert time.perf_counter() - t0 < 2.0


# -- chapter builders ---------------------------------------------------------------------------
@pytest.mark.parametrize("number", range(1, len(lc.CHAPTERS) + 1))
def test_every_chapter_renders_every_prompt(shipped, number, no_model_loading):
    for pid in shipped.prompt_ids:
        last = lc.chapter_steps(shipped, number, pid)
        for step in sorted({0, lc.start_step(shipped, number, pid), last}):
            text = lc.chapter_text(shipped, number, pid, step)
            assert text.startswith(f"## Chapter {number} ·")
            assert "Real recorded trace" in text and lc.COMMAND in text
            fig = lc.chapter_figure(shipped, number, pid, step, presenter=step == last)
            assert isinstance(fig, go.Figure) and fig.data
            fig.to_json()
            assert "class='tok" in lc.chapter_tokens(shipped, number, pid, step)


def test_figures_highlight_the_current_step(shipped):
    pid = shipped.prompt_ids[0]
    for number in (1, 2, 4, 6, 7, 8):
        step = max(1, lc.start_step(shipped, number, pid))
        fig = lc.chapter_figure(shipped, number, pid, step)
        assert any(s.x0 == step and s.x1 == step for s in fig.layout.shapes), f"chapter {number}"


def test_presenter_figures_use_larger_fonts(shipped):
    from app.lesson import figures

    pid = shipped.prompt_ids[0]
    small = lc.chapter_figure(shipped, 3, pid, 1)
    large = lc.chapter_figure(shipped, 3, pid, 1, presenter=True)
    assert large.layout.font.size > small.layout.font.size
    # presenter text grows with the page it fills: >= 18 px on a 1080 px projector, smaller on 720 px
    assert figures.text_size(True, 1080) >= 18 > figures.text_size(True, 720) > figures.text_size(False, 1080)


def _figure_text_sizes(fig) -> list[tuple[str, float]]:
    """(what, px) for every text a figure sets: title, legend, annotations, axis titles and ticks, trace text."""
    layout = fig.layout
    sizes = [("title", layout.title.font.size), ("legend", layout.legend.font.size)]
    sizes += [(f"annotation {a.text[:20]!r}", a.font.size) for a in layout.annotations]
    for name in dir(layout):
        if name.startswith(("xaxis", "yaxis")) and getattr(layout, name, None) is not None:
            axis = getattr(layout, name)
            sizes += [(f"{name} ticks", axis.tickfont.size), (f"{name} title", axis.title.font.size)]
    sizes += [(f"{t.type} text", t.textfont.size) for t in fig.data if getattr(t, "text", None) is not None]
    return sizes


@pytest.mark.parametrize("number", range(1, len(lc.CHAPTERS) + 1))
def test_presenter_mode_reaches_every_text_of_every_chart(shipped, number):
    from app.lesson import figures

    pid = shipped.prompt_ids[0]
    step = lc.start_step(shipped, number, pid)
    want = figures.text_size(True, 1080)
    fig = lc.chapter_figure(shipped, number, pid, step, presenter=True, height=800, screen=1080)
    small = [(what, size) for what, size in _figure_text_sizes(fig) if size is None or size < want]
    assert not small, f"chapter {number}: text left at its desk size in presenter mode: {small}"


def test_lesson_glyphs_exist_in_the_installed_fonts(shipped):
    """Every character the lesson writes itself (texts, buttons, chart labels; not the model's tokens) is
    drawn by some installed font: no empty boxes such as Debian's for ✋ and ⏸."""
    import shutil
    import subprocess

    if not shutil.which("fc-list") or "DejaVu Sans" not in subprocess.run(
            ["fc-list", ":", "family"], capture_output=True, text=True).stdout:
        pytest.skip("needs fontconfig and the DejaVu fonts (Debian's defaults)")
    from app.lesson import callbacks, chapters, figures, narration, style

    pid = shipped.prompt_ids[0]
    strings = [callbacks.PLAY, callbacks.PAUSE, style.CSS, open(lesson_tab.__file__, encoding="utf-8").read()]
    for number in range(1, len(lc.CHAPTERS) + 1):
        step = lc.start_step(shipped, number, pid)
        c = lc.chapter(number)
        strings += [c.title, c.idea, chapters.predict_text(shipped, number, pid),
                    narration.provenance(shipped, lc.chapter_run(shipped, number, pid))]
        fig = lc.chapter_figure(shipped, number, pid, step)
        strings += [fig.layout.title.text or "", *(a.text or "" for a in fig.layout.annotations)]
    strings.append(figures.predict_figure().layout.annotations[0].text)
    wide = sorted({ch for text in strings for ch in text if ord(ch) > 0x2000 and not 0xFE00 <= ord(ch) <= 0xFE0F})
    missing = [ch for ch in wide if not subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"],
                                                       capture_output=True, text=True).stdout.strip()]
    assert not missing, f"no installed font draws {missing}: use a common glyph or a word"


def test_locality_categories():
    prompt = [1, 2, 3]
    top3 = [[9, 8, 7], [4, 5, 6], [10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]]
    # row i holds the guesses for position i + 1; outputs sit at positions 3, 4, 5:
    # 2 is in the prompt, 4 was guessed for position 2, 30 only by its own guess (row 4) -> new
    assert lc.locality(prompt, [2, 4, 30], top3) == ["prompt", "top3", "new"]
    assert lc.locality(prompt, [2, 4, 20], top3) == ["prompt", "top3", "top3"]  # 20 guessed for position 4
    assert lc.locality(prompt, [50, 50], top3) == ["new", "output"]


def test_chapter_bounds():
    with pytest.raises(ValueError, match="chapter must be"):
        lc.chapter(0)
    assert lc.chapter(10).title == "Try it" and lc.chapter(9).title == "The draft budget"


def test_live_settings_match_the_apps_controls(shipped):
    from app.inputs import LIMITS, METHODS

    pid = shipped.prompt_ids[0]
    for c in lc.CHAPTERS:
        s = lc.live_settings(shipped, c.number, pid)
        assert s["method"] in METHODS and s["prompt"] == shipped.prompt(pid)["text"]
        assert s["copy_branch"] == lc.recorded_copy_branch(shipped) == 0  # as the traces were recorded
        for name, (lo, hi) in LIMITS.items():
            assert lo <= s[name] <= hi, (c.number, name)


# -- the Gradio tab -----------------------------------------------------------------------------
def test_standalone_demo_builds_without_a_model(no_model_loading):
    demo = lesson_tab.build_lesson_demo()
    config = demo.get_config_file()
    ids = {c.get("props", {}).get("elem_id") for c in config["components"]}
    assert {"lesson-root", "lesson-chapter", "lesson-step", "lesson-next-chapter", "lesson-play",
            "lesson-presenter", "lesson-plot"} <= ids
    # every callback the tab wires runs on the traces alone
    pid = lesson_tab.lesson_data().prompt_ids[0]
    for number in range(1, len(lc.CHAPTERS) + 1):
        out = lesson_tab.open_chapter(number, pid, False)
        assert out[0] == number and "Chapter" in out[2]
        step, *_ = lesson_tab.move(number, pid, 0, True, +1)
        assert step == 1
    last = lc.chapter_steps(lesson_tab.lesson_data(), 1, pid)
    *_, timer, button, playing = lesson_tab.tick(1, pid, last - 1, False)
    assert playing is False and timer.active is False
    last_chapter = len(lc.CHAPTERS)
    assert lesson_tab.shift_chapter(last_chapter, pid, False, +1)[0] == last_chapter


def test_integration_try_it_sets_controls_and_switches_tab(no_model_loading):
    with gr.Blocks() as demo:
        prompt = gr.Textbox()
        method = gr.Radio(["ar", "full", "nanospec"])
        depth = gr.Slider(1, 12)
        with gr.Tabs() as tabs:
            with gr.Tab("Live", id="live"):
                gr.Markdown("live")
            handles = lesson_tab.build_lesson_tab({"prompt": prompt, "method": method, "depth": depth}, tabs)
        lesson_tab.register_deep_link(demo, handles)
    assert handles.available and handles.try_it is not None
    deps = demo.get_config_file()["dependencies"]
    try_dep = next(d for d in deps if handles.try_it._id in [t[0] for t in d["targets"]])
    assert try_dep["outputs"] == [prompt._id, method._id, depth._id, tabs._id]
    pid = lesson_tab.lesson_data().prompt_ids[0]
    values = lesson_tab.try_it_values(2, pid, ["prompt", "method", "depth"], "live")
    assert values[1] == "full" and values[2] == 5 and values[3].selected == "live"


@pytest.mark.parametrize("query, expected", [({"chapter": "5"}, (5, False)), ({"chapter": str(len(lc.CHAPTERS) + 1)}, (None, False)),
                                             ({"chapter": "x", "presenter": "1"}, (None, True)), ({}, (None, False))])
def test_deep_link_query(query, expected):
    assert lesson_tab.deep_link(SimpleNamespace(query_params=query)) == expected


# -- the recording script (tiny random engine, no real model) ----------------------------------------
def test_recording_pipeline_end_to_end(tmp_path):
    from app.dev.devtools import tiny_loader

    engine, _ = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    item = {"id": "qa-01", "category": "qa", "split": "train", "prompt": "the draft tree accepts a token"}
    docs = lesson_traces.record_prompt(engine, item, 12, list(lesson_traces.RUNS), repeats=2)
    for doc in docs:  # every repeat is kept in the meta; the trace is the median-speed one
        reps = doc["meta"]["repeats"]
        assert len(reps["tokens_per_s"]) == 2 and doc["summary"]["tokens_per_s"] in reps["tokens_per_s"]
        assert len(reps["speedup"]) == 2 and all(0 < c for c in reps["cpu_share"])
    pair = {"target": "tiny", "head": "random", "head_kind": "random", "device": "cpu", "dtype": "float32",
            "vocab_size": 512, "hidden_size": 32}
    settings = {"max_new_tokens": 12, "runs": lesson_traces.RUNS}
    sampled = {"qa-01": lesson_traces.record_sampling(engine, item, 12, runs=6)}
    lesson_traces.write_runs(tmp_path / lesson_traces.RUNS_FILE, docs,
                             [{"id": "qa-01", "category": "qa", "text": item["prompt"]}], pair,
                             lesson_traces.COMMAND, settings, lesson_traces.machine_label(), sampled)
    sweep = {"points": [{"vocab": v, "label": "x", "rows": 6, "ms": 1.0} for v in lesson_traces.SWEEP_VOCABS],
             "repeats": 1, "hidden": 32, "machine": lesson_traces.machine_label()}
    (tmp_path / lesson_traces.SWEEP_FILE).write_text(json.dumps(sweep))
    lesson = lc.load_lesson(tmp_path)
    assert all(r.meta["identical_to_first"] for r in lesson.runs.values())
    assert lesson.checks["qa-01"]["runs"] == 6 and lesson.run("qa-01", "sampled").meta["trials"]
    for number in range(1, len(lc.CHAPTERS) + 1):
        assert lc.chapter_figure(lesson, number, "qa-01", 1).data
        assert "Development traces" in lc.chapter_text(lesson, number, "qa-01", 1)


def test_a_noisy_recording_is_refused():
    from nanospec.bench import trust as stability

    steady = {"code-06/ar": {"tokens_per_s": [18.0, 18.5, 17.9], "speedup": [1, 1, 1], "cpu_share": [0.97] * 3},
              "code-06/full": {"tokens_per_s": [22.0, 22.4, 21.8], "speedup": [1.22, 1.21, 1.22],
                               "cpu_share": [0.95] * 3}}
    assert stability.problems(steady, {"before": 18.2, "after": 18.0}) == []
    noisy = {**steady, "sum-06/hybrid": {"tokens_per_s": [4.9, 1.3, 2.0], "speedup": [3.8, 1.0, 1.6],
                                          "cpu_share": [0.9, 0.4, 0.8]}}
    found = stability.problems(noisy, {"before": 18.2, "after": 9.0})
    assert any("sum-06/hybrid: tokens/s varied" in f for f in found)
    assert any("speedup over ar varied" in f for f in found)
    assert any("the machine was busy" in f for f in found)
    assert any("before the recording" in f for f in found)
    assert stability.median_index([3.0, 1.0, 2.0]) == 2
    # from 4 repeats the spread is the interquartile range: one outlier does not move the kept median
    assert stability.spread([10.0, 10.2, 9.9, 10.1, 14.0]) < 0.05
    assert stability.spread([8.0, 10.0, 12.0, 14.0, 16.0]) > stability.MAX_SPREAD


def test_shipped_recording_is_plausible(shipped):
    """The shipped figures come from a steady machine: every run's repeats agree and plain decoding ran at
    the machine's calibrated speed. Whether a method beats plain decoding is not checked: a method slower
    than `ar` is a valid result (tests/test_lesson_truth.py checks the figures against their traces)."""
    import gzip as gz
    import statistics

    from nanospec.bench import trust as stability

    bundle = json.loads(gz.open(lc.LESSON_DIR / lesson_traces.RUNS_FILE, "rt").read())
    docs, calibration = bundle["runs"], bundle["calibration"]
    again = f"re-record with `{lesson_traces.COMMAND}` on an idle machine"
    assert not bundle.get("unsteady"), f"a development recording (--allow-unsteady): {again}"
    assert not bundle.get("merged"), f"a development recording (--merge kept {bundle.get('merged')}): {again}"
    assert calibration and bundle["settings"]["run_repeats"] >= 3
    assert lesson_traces.check_recording(docs, calibration) == []
    ar = [d["summary"]["tokens_per_s"] for d in docs if d["meta"]["run"] == "ar"]
    mid = statistics.median([calibration["before"], calibration["after"]])
    assert all(abs(t / mid - 1) < 0.25 for t in ar), (ar, calibration)
    assert stability.MAX_SPREAD <= 0.25


def test_lm_head_timer_and_bad_arguments():
    import torch

    assert lesson_traces.time_lm_head(1000, 16, 2, 3, torch.device("cpu")) > 0
    with pytest.raises(ValueError, match="--runs"):
        lesson_traces.main(["--runs", "nope"])
    with pytest.raises(ValueError, match="--prompts"):
        lesson_traces.main(["--prompts", "no-such-id"])
    with pytest.raises(ValueError, match="--run-repeats"):
        lesson_traces.main(["--run-repeats", "0"])


def test_missing_traces_say_how_to_record(tmp_path):
    with pytest.raises(FileNotFoundError, match="record-lesson"):
        lc.load_lesson(tmp_path)
    with gzip.open(tmp_path / lc.RUNS_FILE, "wt") as fh:
        fh.write("{}")
    with pytest.raises(ValueError, match="not a lesson bundle"):
        lc.load_lesson(tmp_path)


# -- the draft budget (its chapter) ---------------------------------------------------------------------------
BUDGET_CHAPTER = next(c.number for c in lc.CHAPTERS if c.run == "budget")


def _budget_checks(run) -> None:
    """Every decode step's node log agrees with its event and with the budget's rule: the likeliest k nodes,
    k where their summed p most exceeds their summed prices (each rank's λ·(c(1 + k) - c(k)))."""
    steps = run.meta["budget"]["steps"]
    assert len(steps) == len(run.events) and steps[0] is None
    for entry, e in zip(steps, run.events):
        if e.step == 0:
            continue
        kept = [t for t, k in zip(entry["tokens"], entry["kept"]) if k]
        assert kept == e.tree_tokens and entry["kept"][0] and entry["p"][0] == 1.0
        assert e.drafted_nodes == len(entry["tokens"]) and entry["threshold"] == pytest.approx(e.budget_threshold,
                                                                                                abs=1e-5)
        order = sorted(range(1, len(entry["p"])), key=lambda i: -entry["p"][i])
        real = [i for i in order if entry["sources"][i] != "pad"]
        n_kept = sum(entry["kept"][1:])
        assert all(entry["kept"][i] for i in real[:n_kept]), (e.step, "the kept nodes are the likeliest")
        prices = entry["prices"]
        assert len(prices) == len(order) and all(x >= 0 for x in prices)
        if entry["explore"]:
            assert prices[0] == 0.0, "after plain steps the likeliest node goes through anyway"
        gains = [0.0]
        for rank, i in enumerate(order):
            gains.append(gains[-1] + entry["p"][i] - prices[rank])
        assert gains[n_kept] >= max(gains) - 1e-3, (e.step, n_kept, gains)
        for i, parent in enumerate(entry["parents"]):   # kept nodes form a tree: a child's p <= its parent's
            if parent >= 0:
                assert entry["p"][i] <= entry["p"][parent] + 1e-5 and (not entry["kept"][i] or entry["kept"][parent])


def test_budget_tap_logs_every_drafted_node_without_touching_the_step():
    """The recorder's log of the budget (dropped nodes included) from a tiny engine whose cost curve makes
    the budget prune: it agrees with the events, and the run's output is still plain greedy decoding's."""
    from app.dev.devtools import tiny_loader
    from nanospec.data.prompts import prompt_messages
    from nanospec.decoding.budget import DraftBudget
    from nanospec.decoding.cost_curve import CostCurve
    from nanospec.events import RunSummary, StepEvent

    engine, _ = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    # 10 ms per verified token: an untrained head's nodes never pay, so every step drops them, and after
    # plain steps in a row the likeliest one is verified anyway
    engine.use_cost_curve(CostCurve([1, 2, 4, 8, 16], [10.0, 20.0, 40.0, 80.0, 160.0], {"device": "made up"}))
    messages = prompt_messages({"id": "qa-01", "prompt": "the draft tree accepts a token"})
    hook, select = engine.before_step, DraftBudget.select
    doc = lesson_traces.record_run(engine, messages, "budget", 16)
    assert engine.before_step is hook and DraftBudget.select is select   # the tap let go
    run = lc.LessonRun("qa-01", "budget", [StepEvent.from_dict(e) for e in doc["events"]],
                       RunSummary(**doc["summary"]), doc["meta"])
    _budget_checks(run)
    steps = doc["meta"]["budget"]["steps"][1:]
    assert all(not all(s["kept"]) for s in steps) and any(s["explore"] for s in steps)
    assert doc["meta"]["budget"]["cost_curve"]["ms"] == [10.0, 20.0, 40.0, 80.0, 160.0]
    ar = lesson_traces.record_run(engine, messages, "ar", 16)
    assert doc["summary"]["output_ids"] == ar["summary"]["output_ids"]


def test_shipped_budget_run_logs_every_drafted_node(shipped):
    for pid in shipped.prompt_ids:
        run = shipped.run(pid, "budget")
        assert run.meta["config"]["tree"]["budget"] is True
        assert all(shipped.run(pid, k).meta["config"]["tree"].get("budget", False) is False
                   for k in lesson_traces.RUNS if k not in ("ar", "budget"))   # earlier chapters: the fixed tree
        _budget_checks(run)


def test_budget_chapter_explains_a_step_with_kept_and_dropped_nodes(shipped):
    from app.lesson.data import budget_step
    from nanospec.decoding.cost_curve import CostCurve

    for pid in shipped.prompt_ids:
        run = lc.chapter_run(shipped, BUDGET_CHAPTER, pid)
        assert run.key == "budget"
        step = lc.start_step(shipped, BUDGET_CHAPTER, pid)
        bs = budget_step(run, step)
        assert bs.kept and bs.dropped, f"{pid}: the chapter opens on a step that kept and dropped nodes"
        e = run.event(step)
        assert len(bs.kept) == len(e.tree_tokens) - 1 and len(bs.nodes) == e.drafted_nodes - 1
        assert bs.expected == e.expected_tokens and bs.threshold == pytest.approx(e.budget_threshold, abs=1e-5)
        curve = run.meta["budget"]["cost_curve"]
        assert bs.per_token_ms == CostCurve.from_dict(curve).per_token_ms > 0
        # the narration quotes this step's recorded numbers, not typed-in ones
        text = lc.chapter_text(shipped, BUDGET_CHAPTER, pid, step)
        for number in (f"λ = **{bs.rate * 1e3:.1f} tokens/s**", f"**{len(bs.kept)}** likeliest of **{len(bs.nodes)}** "
                       f"drafted", f"**{bs.kept_price / bs.rate:.1f} ms** longer", f"**{bs.kept_price:.2g} tokens**",
                       f"summed chance **{bs.kept_chance:.2f}**",
                       f"{len(bs.dropped)} are dropped", f"expected **{bs.expected:.2f} tokens**",
                       f"written **{len(e.tokens)}**",
                       f"τ {run.summary.tau:.2f}", f"{run.summary.tokens_per_s:.1f} tokens/s",
                       f"fixed tree: τ {shipped.run(pid, 'nanospec').summary.tau:.2f}"):
            assert number in text, (pid, number)
        # the chart: one bar per drafted node at its p, coloured by its fate, the price line and the cost curve
        fig = lc.chapter_figure(shipped, BUDGET_CHAPTER, pid, step)
        bars = {t.name: list(t.x) for t in fig.data if t.type == "bar"}
        assert sorted(bars["accepted"] + bars["verified"]) == sorted(n.p for n in bs.kept)
        assert sorted(bars["dropped"]) == sorted(n.p for n in bs.dropped)
        assert len(bars["accepted"]) == len(e.accepted_tokens)
        ticks = next(t for t in fig.data if t.name.startswith("price"))
        assert list(ticks.x) == bs.prices and len(bs.prices) == len(bs.nodes)
        assert f"verified {len(bs.kept)} of {len(bs.nodes)} drafted nodes" in fig.layout.title.text
        curve_trace = next(t for t in fig.data if t.name == "measured")
        assert list(curve_trace.x) == curve["sizes"] and list(curve_trace.y) == curve["ms"]


def test_budget_chapter_tries_it_live_with_the_budget_on(shipped):
    pid = shipped.prompt_ids[0]
    assert lc.live_settings(shipped, BUDGET_CHAPTER, pid)["budget"] is True
    for number in range(1, BUDGET_CHAPTER):   # the chapters before show the fixed tree: so does their live run
        assert lc.live_settings(shipped, number, pid)["budget"] is False
    assert lesson_tab.try_it_values(BUDGET_CHAPTER, pid, ["method", "budget", "copy_branch"], "live")[:3] == \
        ("nanospec", True, 0)


def test_the_app_hands_the_budget_to_try_it_live(no_model_loading):
    from app.ui import build_app

    demo = build_app(_no_model)
    config = demo.get_config_file()
    by_elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}
    try_id = by_elem["lesson-try"]
    dep = next(d for d in config["dependencies"] if try_id in [t[0] for t in d["targets"]])
    assert by_elem["budget"] in dep["outputs"]


def test_bundles_without_a_budgeted_run_still_load(shipped, tmp_path):
    """A bundle recorded before the budget chapter: the chapter falls back to the fixed-tree run and says how
    to record the budgeted one; every other chapter is unchanged."""
    bundle = json.loads(gzip.open(lc.LESSON_DIR / lesson_traces.RUNS_FILE, "rt").read())
    bundle["runs"] = [d for d in bundle["runs"] if d["meta"]["run"] != "budget"]
    with gzip.open(tmp_path / lesson_traces.RUNS_FILE, "wt") as fh:
        json.dump(bundle, fh)
    old = lc.load_lesson(tmp_path)
    pid = old.prompt_ids[0]
    assert lc.chapter_run(old, BUDGET_CHAPTER, pid).key == "nanospec"
    assert "re-record" in lc.chapter_text(old, BUDGET_CHAPTER, pid, 1)
    assert lc.chapter_figure(old, BUDGET_CHAPTER, pid, 1).data
    q = lc.chapter(BUDGET_CHAPTER).question(old, lc.chapter_run(old, BUDGET_CHAPTER, pid))
    assert q.options[q.answer] == "no"


# -- predict, then reveal -----------------------------------------------------------------------------
def _independent_answer(lesson, number: int, pid: str, q) -> str:
    """Each chapter's right answer, recomputed here straight from the trace."""
    from nanospec.timing import DRAFT_PHASES

    run = lc.chapter_run(lesson, number, pid)
    e = run.event(q.step)
    decode = run.frame[run.frame["step"] > 0]
    if number == 2:
        return str(len(e.accepted_tokens))
    if number == 3:
        return str(len(e.accepted_tokens) + 1)
    if number in (4, 8):
        totals = {p: decode[f"phase_{p}"].sum() for p in DRAFT_PHASES}
        return questions.PHASE_WORDS[max(totals, key=totals.get)]
    if number == 5:
        kinds = lc.run_locality(run)
        seen = sum(k != "new" for k in kinds) / len(kinds)
        return next(label for upper, label in questions.SHARE_BINS if seen < upper)
    if number == 6:
        frac = decode["active_size"].mean() / run.summary.vocab_size
        return next(label for upper, label in questions.ACTIVE_BINS if frac < upper)
    if number == 7:
        first = next(x for x in run.events if x.step > 0 and x.miss_kind != "none")
        assert q.step == first.step
        return questions.MISS_WORDS[first.miss_kind]
    if number == 9:  # from the recorder's per-node log: drafted nodes and the ones verified
        entry = run.meta["budget"]["steps"][q.step]
        drafted, kept = len(entry["tokens"]) - 1, sum(entry["kept"]) - 1
        assert kept == len(e.tree_tokens) - 1
        share = ("none: a plain step" if kept == 0 else f"all {drafted}" if kept == drafted
                 else "fewer than half" if 2 * kept < drafted else "half or more, but not all")
        return share
    raise AssertionError(number)


@pytest.mark.parametrize("number", range(2, 10))
def test_every_question_is_answered_by_its_trace(shipped, number):
    for pid in shipped.prompt_ids:
        c = lc.chapter(number)
        q = c.question(shipped, lc.chapter_run(shipped, number, pid))
        assert 2 <= len(q.options) == len(set(q.options)) and 0 <= q.answer < len(q.options)
        assert q.options[q.answer] == _independent_answer(shipped, number, pid, q), (number, pid)
        assert 0 <= q.step <= lc.chapter_steps(shipped, number, pid)
        assert "right." in q.verdict(q.options[q.answer]) and "the answer is" in q.verdict(q.options[0] + "x")
    assert lc.chapter(1).question is None and lc.chapter(10).question is None


def test_a_question_hides_the_chart_until_answered(no_model_loading):
    pid = lesson_tab.lesson_data().prompt_ids[0]
    chapter, slider, text, fig, tokens, quiz, reveal, pending, race = lesson_tab.open_chapter(2, pid, False)
    assert pending is True and quiz.visible and "Predict first" in text and tokens == ""
    assert "Predict first" in fig.layout.annotations[0].text
    q = questions.chain_question(lesson_tab.lesson_data(), lesson_tab.lesson_data().run(pid, "greedy"))
    assert slider.value == q.step and quiz.choices == [(o, o) for o in q.options]
    step, text, fig, tokens, quiz, reveal, pending = lesson_tab.answer(2, pid, q.options[q.answer], False)
    assert step == q.step and pending is False and quiz.visible is False
    assert "right." in reveal and f"**Step {q.step}:**" in text and "class='tok" in tokens
    # stepping instead of answering also shows the chart (and leaves the question unanswered)
    assert lesson_tab.move(2, pid, q.step, False, +1)[-1] is False
    # chapters without a question open on their chart
    assert lesson_tab.open_chapter(1, pid, False)[7] is False


def test_lesson_first_charts_fit_the_page(no_model_loading):
    from app.lesson import callbacks

    pid = lesson_tab.lesson_data().prompt_ids[0]
    for number in range(1, len(lc.CHAPTERS) + 1):
        for height in (720, 1080):
            fig = lesson_tab.render(number, pid, 1, True, fit=height)[1]
            assert fig.layout.height == callbacks.chart_height(height, number, presenter=True) < height - 200
    assert callbacks.chart_height(0) is None  # not lesson-first: each chart keeps its own height


# -- the race ---------------------------------------------------------------------------------------------
def test_race_lanes_replay_the_recorded_step_times(shipped):
    import html as html_lib
    import re

    pid = shipped.prompt_ids[0]
    markup = lc.chapter(12).race(shipped, pid)
    data = json.loads(html_lib.unescape(re.search(r'data-race="([^"]*)"', markup).group(1)))
    assert [lane["label"] for lane in data["lanes"]] == ["ar", "full", "nanospec"]
    for lane in data["lanes"]:
        run = shipped.run(pid, lane["label"])
        cumulative = 0.0
        for t, c, e in zip(lane["t"], lane["c"], run.events):
            cumulative += e.wall_ms
            assert t == pytest.approx(cumulative, abs=0.01) and c == run.tokens_through(e.step)
        assert "".join(lane["p"]) == "".join(run.pieces) and lane["tau"] == run.summary.tau
    assert shipped.info["machine"]["text"] in html_lib.unescape(markup)
    assert lesson_tab.open_chapter(12, pid, False)[8].visible is True
    assert lesson_tab.open_chapter(11, pid, False)[8].visible is False


def test_race_lane_from_events():
    from app.race import lane, race_html

    with pytest.raises(ValueError, match="no steps"):
        lane("ar", [], None)
    assert "Nothing to race" in race_html([], "")


# -- sampling ---------------------------------------------------------------------------------------------
def test_sampling_trials_follow_the_acceptance_rule():
    import torch

    from nanospec.lesson.sampling import step_trials

    # root (node 0) with children 1 and 2 (tokens 3, 1); node 1 has child 3 (token 2)
    event = {"tree_tokens": [0, 3, 1, 2], "tree_parents": [-1, 0, 0, 1], "accepted_path": [0, 2], "bonus_token": 0}
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.2, 0.2]])
    levels = step_trials(event, 0, probs)
    tried = levels[0]["tried"]
    # token 3 first: accepted with p = 0.4; rejected, so token 1 is tried with 0.2 / (1 - 0.4)
    assert [t["token"] for t in tried] == [3, 1] and [t["accepted"] for t in tried] == [False, True]
    assert tried[0]["accept_prob"] == pytest.approx(0.4) and tried[1]["accept_prob"] == pytest.approx(0.2 / 0.6)
    # node 2 has no children: the bonus is drawn from the whole of p at the next position
    assert levels[1]["tried"] == [] and levels[1]["bonus"]["residual_p"] == pytest.approx(0.5)


def test_shipped_sampling_material(shipped):
    for pid in shipped.prompt_ids:
        run, check = shipped.run(pid, "sampled"), shipped.checks[pid]
        assert run.meta["config"]["sampling"]["temperature"] > 0 and run.meta["identical_to_first"] is None
        for entry, e in zip(run.meta["trials"], run.events):
            if e.step == 0:
                continue
            root = entry["levels"][0]
            first = next((t["token"] for t in root["tried"] if t["accepted"]), root.get("bonus", {}).get("token"))
            assert first == e.tokens[0]   # the acceptance log ends where the recorded step went
            assert all(0 <= t["accept_prob"] <= 1 + 1e-6 for t in root["tried"])
        assert check["kept"] <= check["runs"] and sum(t["count"] for t in check["tokens"]) == check["kept"]
        assert 0 <= check["total_variation"] <= 1 and 0 <= check["total_variation_exact"] <= 1


def test_chapter_buttons_lead_somewhere():
    """No Previous before chapter 1 and no Next after the last chapter."""
    first_prev, first_next = lesson_tab.chapter_ends(1)
    last_prev, last_next = lesson_tab.chapter_ends(len(lc.CHAPTERS))
    assert first_prev.interactive is False and first_next.interactive is True
    assert last_prev.interactive is True and last_next.interactive is False


@pytest.mark.parametrize("value,label", [(0.0, "under a quarter"), (0.2499, "under a quarter"),
                                         (0.25, "a quarter up to a half"), (0.5, "a half up to three quarters"),
                                         (48 / 64, "three quarters or more"), (1.0, "three quarters or more")])
def test_share_answers_name_the_boundaries_right(value, label):
    assert questions.SHARE_BINS[questions._bin(value, questions.SHARE_BINS)][1] == label


@pytest.mark.parametrize("value,label", [(0.0057, "under 1% of V"), (0.01, "1% up to 5% of V"),
                                         (0.25, "25% of V or more"), (1.0, "25% of V or more")])
def test_active_answers_name_the_boundaries_right(value, label):
    assert questions.ACTIVE_BINS[questions._bin(value, questions.ACTIVE_BINS)][1] == label


def test_shipped_recording_names_no_machine_paths():
    """The bundle says which model and head it used by name, never where one machine kept them."""
    import gzip as gz
    import re

    text = gz.open(lc.LESSON_DIR / lesson_traces.RUNS_FILE, "rt").read()
    found = sorted(set(re.findall(r'"(/(?:root|home|tmp|work|Users|var)/[^"]*)"', text)))
    assert not found, f"absolute paths of the recording machine in the shipped bundle: {found}"


def test_first_rejection_skips_steps_that_tried_nothing():
    """A sampled run under the draft budget has plain steps, whose trial log tries no drafted token: the
    sampling chapter opens at the first real rejection instead of failing on them."""
    from types import SimpleNamespace

    from app.lesson.chapters import first_rejection
    trials = [{"step": 1, "levels": [{"tried": []}]},
              {"step": 2, "levels": [{"tried": [{"accepted": False}]}]},
              {"step": 3, "levels": [{"tried": [{"accepted": False}, {"accepted": True}]}]}]
    run = SimpleNamespace(meta={"trials": trials}, events=[])
    assert first_rejection(run) == 3
    run.meta["trials"] = trials[:2]
    assert first_rejection(run) == 2
    run.meta["trials"] = trials[:1]
    assert first_rejection(run) == 0  # nothing rejected, no decode step: the chapter opens at the start
