"""A lesson recording tells the truth: it knows the engine that made it, its figures follow from its traces,
its words are computed from them (a method slower than `ar` is said to be slower), and the README
describes the bundle that ships."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from app import lesson as lc
from nanospec.lesson import describe, fingerprint, truth
from nanospec.lesson import record as lesson_traces


@pytest.fixture(scope="module")
def bundle() -> dict:
    with gzip.open(lc.LESSON_DIR / lesson_traces.RUNS_FILE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _fingerprinted(bundle: dict) -> None:
    if "fingerprint" not in bundle:
        pytest.xfail("the shipped recording predates fingerprints: re-record with "
                     f"`{lesson_traces.COMMAND}` on an idle machine")


# -- the fingerprint ----------------------------------------------------------------------------------
def test_shipped_recording_was_made_by_this_engine(bundle):
    _fingerprinted(bundle)
    assert bundle["fingerprint"]["engine"] == fingerprint.engine_part(), \
        f"the engine changed since the lesson was recorded: re-record with `{lesson_traces.COMMAND}`"
    assert fingerprint.status(bundle) == ""
    for key in fingerprint.FIELDS:
        assert key in bundle["fingerprint"], key


def test_a_changed_engine_version_is_labelled_older(bundle):
    fresh = {**bundle, "recorded_at": "2026-12-09 10:00 UTC",
             "fingerprint": {"engine": fingerprint.engine_part(), "date": "2026-12-09 10:00 UTC"}}
    assert fingerprint.status(fresh) == "" and fingerprint.chart_tag(fresh) == ""
    old = copy.deepcopy(fresh)
    old["fingerprint"]["engine"]["cost_curve_version"] -= 1
    assert "recorded with an older engine on 2026-12-09" in fingerprint.status(old)
    assert fingerprint.chart_tag(old) == "⚠ recorded with an older engine on 2026-12-09"
    for foreign in (None, "sha:abc", {"engine": "v1"}):
        odd = {**bundle, "fingerprint": foreign}
        assert fingerprint.status(odd).startswith("unknown engine")


def test_timed_charts_say_when_the_engine_is_unknown(tmp_path, bundle):
    doc = {k: v for k, v in bundle.items() if k != "fingerprint"}
    with gzip.open(tmp_path / lc.RUNS_FILE, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    lesson = lc.load_lesson(tmp_path)
    pid = lesson.prompt_ids[0]
    for c in lc.CHAPTERS:
        title = lc.chapter_figure(lesson, c.number, pid, 1).layout.title.text
        assert ("unknown engine" in title) is c.timed, c.number
    assert "unknown engine" in lc.chapter_text(lesson, 1, pid, 1)


def test_a_corrupted_recording_gives_one_line_naming_the_file(tmp_path, bundle):
    path = tmp_path / lc.RUNS_FILE
    raw = gzip.compress(json.dumps({"format": lesson_traces.BUNDLE_FORMAT}).encode())
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError) as err:
        lc.load_lesson(tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="corrupted"):
        lc.load_lesson(tmp_path)


# -- checks of truth ---------------------------------------------------------------------------------
def _trace_problems(b: dict) -> list[str]:
    """Truth problems other than the documented ar speed (that one needs the machine class's docs)."""
    return [p for p in truth.problems(b, benchmarks="") if "benchmarks.md" not in p]


def test_shipped_runs_are_true_to_their_traces(bundle):
    assert _trace_problems(bundle) == []


def test_shipped_ar_speed_agrees_with_the_benchmarks(bundle):
    _fingerprinted(bundle)
    assert [p for p in truth.problems(bundle) if "ar ran" in p or "benchmarks.md" in p or "machine class" in p] == []


def test_an_edited_tokens_per_s_fails(bundle):
    edited = copy.deepcopy(bundle)
    run = next(d for d in edited["runs"] if d["meta"]["run"] == "nanospec")
    run["summary"]["tokens_per_s"] *= 1.3
    found = _trace_problems(edited)
    assert len(found) == 1 and f"{run['meta']['prompt_id']}/nanospec" in found[0]
    other = copy.deepcopy(bundle)
    other["runs"][1]["summary"]["output_ids"] = other["runs"][1]["summary"]["output_ids"][:-1]
    assert any("tokens differ from ar" in p for p in _trace_problems(other))


def test_a_method_slower_than_ar_is_valid(bundle):
    slow = copy.deepcopy(bundle)
    for d in slow["runs"]:   # every speculative step twice as slow: every method loses, truthfully
        if d["meta"]["run"] != "ar":
            for e in d["events"]:
                e["wall_ms"] *= 2
                e["phases"] = {k: v * 2 for k, v in e["phases"].items()}
            d["summary"]["tokens_per_s"] = d["summary"]["new_tokens"] / (sum(e["wall_ms"] for e in d["events"]) / 1e3)
    assert all(truth.measured(d, next(a for a in slow["runs"] if a["meta"]["run"] == "ar"
                                      and a["meta"]["prompt_id"] == d["meta"]["prompt_id"])) < 1.0
               for d in slow["runs"] if d["meta"]["run"] != "ar")
    assert _trace_problems(slow) == []


def test_documented_ar_speeds_by_machine_class():
    text = ("## A\nOn 2 Intel Xeon cores:\n| ar | 25.92 | 1.00× |\n| full | 27 |\n"
            "## B\nOn AMD EPYC and Intel Xeon: | ar | 99 |\n## C\n2 AMD EPYC cores, `ar` at 12.5 tok/s\n")
    assert truth.documented_ar_speeds(text) == {"Intel Xeon": [25.92], "AMD EPYC": [12.5]}
    assert truth.machine_class("Intel(R) Xeon(R) Platinum 8488C") == "Intel Xeon"
    assert truth.machine_class("AMD EPYC 9R14") == "AMD EPYC"


# -- words computed from the recording --------------------------------------------------------------
def _losing_full(tmp_path, bundle) -> lc.Lesson:
    """The shipped bundle with `full` made 2x slower per step on every prompt (a recording where it loses)."""
    doc = copy.deepcopy(bundle)
    for d in doc["runs"]:
        if d["meta"]["run"] == "full":
            for e in d["events"]:
                e["wall_ms"] *= 2
                e["phases"] = {k: v * 2 for k, v in e["phases"].items()}
            d["summary"]["tokens_per_s"] /= 2
    with gzip.open(tmp_path / lc.RUNS_FILE, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return lc.load_lesson(tmp_path)


def test_a_recording_where_full_loses_says_it_loses(tmp_path, bundle):
    lesson = _losing_full(tmp_path, bundle)
    when = next(c for c in lc.CHAPTERS if c.title == "When does speculation pay?")
    for pid in lesson.prompt_ids:
        for number in (3, 10, 12, when.number):
            text = lc.chapter_text(lesson, number, pid, 1)
            assert "`full` is **slower than plain decoding** here" in text, (pid, number)
            assert "break-even" in text or "pays only above" in text
        question = when.question(lesson, lc.chapter_run(lesson, when.number, pid))
        assert question.options[question.answer].startswith("no")


def test_when_speculation_pays_chapter_is_computed(bundle):
    lesson = lc.load_lesson()
    when = next(c for c in lc.CHAPTERS if c.title == "When does speculation pay?")
    for pid in lesson.prompt_ids:
        full = lc.verdicts.pays(lesson, pid, "full")
        question = when.question(lesson, lc.chapter_run(lesson, when.number, pid))
        assert question.text == "Will EAGLE-2's tree beat plain decoding on this machine?"
        assert question.answer == (0 if full.wins else 1)
        fig = lc.chapter_figure(lesson, when.number, pid, 1)
        names = {t.name for t in fig.data}
        assert "measured" in names and "flat cost curve (a model)" in names
        text = lc.chapter_text(lesson, when.number, pid, 1)
        assert "a model, not a measurement" in text and f"break-even {full.break_even:.2f}" in text


# -- the README describes the shipped bundle ----------------------------------------------------------
def test_readme_describes_the_shipped_recording(bundle):
    readme = (lc.LESSON_DIR / "README.md").read_text()
    assert describe.section(readme) == describe.describe(bundle), \
        "assets/lesson/README.md does not describe the shipped bundle: re-record, or run describe.write_readme"
    for fact in (bundle["recorded_at"], f"{bundle['calibration']['before']:.1f}", bundle["machine"]["cpu"]):
        assert fact in describe.section(readme)


def test_the_recorder_fingerprints_its_engine():
    from app.dev.devtools import tiny_loader

    engine, _ = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    pair = {"head_sha256": "abc", "dtype": "float32"}
    fp = fingerprint.fingerprint(engine, pair, lesson_traces.machine_label(), "2026-12-09 10:00 UTC")
    assert set(fingerprint.FIELDS) <= set(fp) and fp["engine"] == fingerprint.engine_part()
    assert fp["head_sha256"] == "abc" and fp["threads"] >= 1 and fp["date"].startswith("2026-12-09")
    assert fingerprint.status({"fingerprint": fp}) == ""
