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
from app.lesson import tab as lesson_tab
from nanospec.lesson import record as lesson_traces
from nanospec.pair import DEFAULT_HEAD


def _no_model(*args, **kwargs):
    raise AssertionError("the lesson must never load a model")


@pytest.fixture
def no_model_loading(monkeypatch):
    import nanospec.loading
    import nanospec.pair

    monkeypatch.setattr(nanospec.pair, "load_pair", _no_model)
    monkeypatch.setattr(nanospec.loading, "load_target", _no_model)
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
    pid = shipped.prompt_ids[0]
    small = lc.chapter_figure(shipped, 3, pid, 1)
    large = lc.chapter_figure(shipped, 3, pid, 1, presenter=True)
    assert large.layout.font.size > small.layout.font.size


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
    assert lc.chapter(9).title == "Try it"


def test_live_settings_match_the_apps_controls(shipped):
    from app.inputs import LIMITS, METHODS

    pid = shipped.prompt_ids[0]
    for c in lc.CHAPTERS:
        s = lc.live_settings(shipped, c.number, pid)
        assert s["method"] in METHODS and s["prompt"] == shipped.prompt(pid)["text"]
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
    assert lesson_tab.shift_chapter(9, pid, False, +1)[0] == 9


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


@pytest.mark.parametrize("query, expected", [({"chapter": "5"}, (5, False)), ({"chapter": "12"}, (None, False)),
                                             ({"chapter": "x", "presenter": "1"}, (None, True)), ({}, (None, False))])
def test_deep_link_query(query, expected):
    assert lesson_tab.deep_link(SimpleNamespace(query_params=query)) == expected


# -- the recording script (tiny random engine, no real model) ----------------------------------------
def test_recording_pipeline_end_to_end(tmp_path):
    from app.devtools import tiny_loader

    engine, _ = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    item = {"id": "qa-01", "category": "qa", "split": "train", "prompt": "the draft tree accepts a token"}
    docs = lesson_traces.record_prompt(engine, item, 12, list(lesson_traces.RUNS))
    pair = {"target": "tiny", "head": "random", "head_kind": "random", "device": "cpu", "dtype": "float32",
            "vocab_size": 512, "hidden_size": 32}
    settings = {"max_new_tokens": 12, "runs": lesson_traces.RUNS}
    lesson_traces.write_runs(tmp_path / lesson_traces.RUNS_FILE, docs,
                             [{"id": "qa-01", "category": "qa", "text": item["prompt"]}], pair,
                             lesson_traces.COMMAND, settings, lesson_traces.machine_label())
    sweep = {"points": [{"vocab": v, "label": "x", "rows": 6, "ms": 1.0} for v in lesson_traces.SWEEP_VOCABS],
             "repeats": 1, "hidden": 32, "machine": lesson_traces.machine_label()}
    (tmp_path / lesson_traces.SWEEP_FILE).write_text(json.dumps(sweep))
    lesson = lc.load_lesson(tmp_path)
    assert all(r.meta["identical_to_first"] for r in lesson.runs.values())
    for number in range(1, len(lc.CHAPTERS) + 1):
        assert lc.chapter_figure(lesson, number, "qa-01", 1).data
        assert "Development traces" in lc.chapter_text(lesson, number, "qa-01", 1)


def test_lm_head_timer_and_bad_arguments():
    import torch

    assert lesson_traces.time_lm_head(1000, 16, 2, 3, torch.device("cpu")) > 0
    with pytest.raises(ValueError, match="--runs"):
        lesson_traces.main(["--runs", "nope"])
    with pytest.raises(ValueError, match="--prompts"):
        lesson_traces.main(["--prompts", "no-such-id"])


def test_missing_traces_say_how_to_record(tmp_path):
    with pytest.raises(FileNotFoundError, match="record-lesson"):
        lc.load_lesson(tmp_path)
    with gzip.open(tmp_path / lc.RUNS_FILE, "wt") as fh:
        fh.write("{}")
    with pytest.raises(ValueError, match="not a lesson bundle"):
        lc.load_lesson(tmp_path)
