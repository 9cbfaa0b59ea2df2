"""Chart builders and the app's pure helpers, on hand-made StepEvents (no model, no browser)."""

from __future__ import annotations

import dataclasses
import html
import math

import pytest

from app import charts
from tests import answer_text
from app.callbacks import compare_table, compare_verdict, display_table
from app.inputs import example_prompts, generation_options, parse_prompt
from app.trace import RunView, TokenDecoder, load_view, save_downloads
from nanospec import metrics
from nanospec.events import StepEvent, events_to_frame, load_trace, summarize
from nanospec.config import TreeConfig
from nanospec.data.prompts import CATEGORIES
from nanospec.timing import PHASES

V = 1000


def _phases(**ms) -> dict:
    return {p: float(ms.get(p, 0.0)) for p in PHASES}


def make_events() -> list[StepEvent]:
    """Prefill, a step that accepts 2 drafted tokens (draft miss), a step with a vocab miss."""
    prefill = StepEvent(step=0, method="nanospec", root_token=5, tree_tokens=[5], tree_parents=[-1], tree_depths=[0],
                        tree_logprobs=[0.0], tree_in_active=[True], accepted_path=[0], accepted_tokens=[],
                        bonus_token=10, tokens=[10], active_size=40, added_ids=40, vocab_size=V, coverage=None,
                        miss_kind="none", wall_ms=50.0, phases=_phases(verify_forward=45.0, vocab_update=5.0))
    # tree: 0(root 10) -> 1(11), 2(12); 1 -> 3(13), 4(14); accepted path 0-1-3, bonus 15
    step1 = StepEvent(step=1, method="nanospec", root_token=10, tree_tokens=[10, 11, 12, 13, 14],
                      tree_parents=[-1, 0, 0, 1, 1], tree_depths=[0, 1, 1, 2, 2],
                      tree_logprobs=[0.0, -0.1, -2.0, -0.5, -1.5], tree_in_active=[True] * 5,
                      accepted_path=[0, 1, 3], accepted_tokens=[11, 13], bonus_token=15, tokens=[11, 13, 15],
                      active_size=40, added_ids=6, vocab_size=V, coverage=True, miss_kind="none", wall_ms=20.0,
                      phases=_phases(draft_layers=4.0, lm_head=1.0, topk=0.5, verify_forward=10.0, accept=1.0))
    step2 = StepEvent(step=2, method="nanospec", root_token=15, tree_tokens=[15, 16, 17],
                      tree_parents=[-1, 0, 0], tree_depths=[0, 1, 1], tree_logprobs=[0.0, -0.3, -0.9],
                      tree_in_active=[True, True, True], accepted_path=[0], accepted_tokens=[], bonus_token=99,
                      tokens=[99], active_size=46, added_ids=3, vocab_size=V, coverage=False, miss_kind="vocab",
                      wall_ms=18.0, phases=_phases(draft_layers=3.0, lm_head=1.0, verify_forward=11.0))
    return [prefill, step1, step2]


@pytest.fixture()
def frame():
    return events_to_frame(make_events())


TEXT = {i: f"w{i}" for i in range(200)}


def _trace(fig, name):
    matches = [t for t in fig.data if t.name == name]
    assert matches, f"no trace named {name!r} in {[t.name for t in fig.data]}"
    return matches[0]


def test_token_origins_and_answer_spans(frame):
    assert charts.token_origins(frame) == [charts.BONUS, charts.ACCEPTED, charts.ACCEPTED, charts.BONUS,
                                           charts.VOCAB_MISS]
    spans = answer_text.answer_spans(frame, ["a", "b", "", "d", "e"])
    assert spans == [("a", charts.BONUS), ("b", charts.ACCEPTED), ("d", charts.BONUS), ("e", charts.VOCAB_MISS)]
    assert set(charts.ORIGIN_COLORS) == set(charts.ORIGIN_LABELS.values())
    assert set(charts.ORIGIN_LABELS) == set(metrics.ORIGINS)  # every origin the engine names has a colour


def test_origins_tell_the_copy_chain_from_the_head():
    events = make_events()
    events[1].tree_sources = ["root", "copy", "head", "both", "head"]  # path 0-1-3: copy, then both
    frame = events_to_frame(events)
    assert charts.token_origins(frame) == [charts.BONUS, charts.COPIED, charts.BOTH, charts.BONUS, charts.VOCAB_MISS]
    view = RunView()
    decoder = TokenDecoder(None)
    for event in events:
        view.add(event, decoder)
    assert view.origins == charts.token_origins(frame)  # the live view and the frame agree
    assert len(set(charts.ORIGIN_COLORS[o] for o in view.origins)) == 4  # four origins, four colours


def test_answer_is_readable_text_with_origins_underlined():
    pieces = ["Je", " su", "is", " ", "dé", "j", "à", "\n", "<b>ok</b>", "", "<|im_end|>"]
    origins = [charts.BONUS, charts.ACCEPTED, charts.COPIED, charts.BOTH, charts.BONUS, charts.VOCAB_MISS,
               charts.ACCEPTED, charts.ACCEPTED, charts.BONUS, charts.BONUS, charts.ACCEPTED]
    special = [False] * 10 + [True]
    shown = charts.answer_html(pieces, origins, special)
    # the text is the pieces run together, whitespace kept, markup escaped; the special token is not in it
    assert answer_text.answer_tokens(shown) == pieces[:9]
    assert "".join(answer_text.answer_tokens(shown)) == "Je suis déjà\n<b>ok</b>"
    assert "&lt;b&gt;ok&lt;/b&gt;" in shown and "<b>ok</b>" not in shown
    assert "ended with &lt;|im_end|&gt;" in shown
    for label in (charts.ACCEPTED, charts.COPIED, charts.BOTH, charts.BONUS, charts.VOCAB_MISS):
        assert f'--c:{charts.ORIGIN_COLORS[label]}" title="{html.escape(label)}"' in shown  # colour and hover per origin
    assert "white-space: pre-wrap" in charts.ANSWER_CSS
    assert "no text yet" in charts.answer_html([], [])


def test_kpis_match_engine_summary(frame):
    events = make_events()
    summary = summarize(events, "nanospec", wall_s=0.5, stop_reason="max_new_tokens")
    k = charts.kpi_from_summary(summary)
    assert k["tokens"] == summary.new_tokens == 5
    assert k["tokens_per_s"] == pytest.approx(summary.tokens_per_s)
    assert k["tau"] == pytest.approx(summary.tau) == 2.0
    assert k["coverage"] == pytest.approx(summary.coverage) == 0.75
    assert k["mean_active"] == pytest.approx(summary.mean_active) == 43.0
    assert k["draft_share"] == pytest.approx(summary.draft_share)
    assert charts.running_coverage(frame)[-1] == pytest.approx(100 * summary.coverage)  # frame path agrees
    # as serving engines report them: the first token's time (the prefill) apart from decoding's rate
    assert k["ttft_ms"] == summary.ttft_ms == 50.0
    assert k["decode_tokens_per_s"] == pytest.approx(4 / 0.45) == summary.decode_tokens_per_s
    html = charts.kpi_html(k)
    for label in ("decode tokens/s", "8.9", "time to first token", "50 ms", "10.0/s with prefill", "τ",
                  "mean active size", "coverage", "draft-time share", "4.3% of V"):
        assert label in html


def test_vocab_figure(frame):
    fig = charts.vocab_figure(frame)
    assert list(_trace(fig, "active set").y) == [40, 40, 46]
    added = _trace(fig, "ids added per step (prefill: 40, not drawn)")  # the prompt's ids: named, not a bar
    assert list(added.x) == [1, 2] and list(added.y) == [6, 3]
    assert list(_trace(fig, f"full vocabulary V = {V:,}").y) == [V] * 3
    assert fig.layout.yaxis.type == "log"
    # issue 47: the counts have a panel and a linear axis of their own, under the log panel (not drawn over its
    # gridlines on an overlaid axis), and V's line sits below the log axis's top
    top, bottom = fig.layout.yaxis.domain, fig.layout.yaxis2.domain
    assert fig.layout.yaxis2.overlaying is None and fig.layout.yaxis2.type in (None, "linear", "-")
    assert bottom[1] < top[0]
    assert fig.layout.yaxis2.range[0] == 0 and fig.layout.yaxis2.range[1] >= 6
    assert fig.layout.yaxis.range[1] > math.log10(V)


def test_step_axes_have_integer_ticks():
    short = charts.step_axis([0, 1, 2], "step")
    assert short["dtick"] == 1 and short["tickformat"] == "d" and short["tickmode"] == "linear"
    assert charts.step_axis(list(range(0, 95)), "step")["dtick"] == 10  # about ten ticks, still integers
    for builder in (charts.vocab_figure, charts.coverage_figure, charts.phase_figure):
        axis = builder(events_to_frame(make_events())).layout.xaxis
        assert axis.dtick == 1 and axis.tickformat == "d"


def test_coverage_figure(frame):
    fig = charts.coverage_figure(frame)
    vocab = _trace(fig, "vocab misses")
    assert list(vocab.x) == [1, 2] and list(vocab.y) == [0, 1]  # misses so far, not a 0/1 bar per step
    assert list(_trace(fig, "draft misses").y) == [0, 0]
    assert list(_trace(fig, "coverage %").y) == pytest.approx([100.0, 75.0])
    events = make_events() + [dataclasses.replace(make_events()[2], step=s) for s in (3, 4)]
    counts = _trace(charts.coverage_figure(events_to_frame(events)), "vocab misses")
    assert list(counts.y) == [0, 1, 2, 3]


def test_chart_coverage_equals_the_kpi_card_with_a_copied_token_outside_the_set():
    """The coverage chart's last value is the KPI card's, also when the copy chain accepted a token that
    was outside the active set (which `summarize` counts as outside)."""
    events = make_events()
    events[1].tree_sources = ["root", "head", "head", "copy", "head"]
    events[1].tree_in_active[3] = False  # the copied, accepted token 13 was not in the active set
    frame = events_to_frame(events)
    card = charts.kpi_from_summary(summarize(events, "nanospec", 1.0, "eos"))["coverage"]
    assert card == pytest.approx(0.5)
    assert charts.running_coverage(frame)[-1] == pytest.approx(100 * card)
    assert list(_trace(charts.coverage_figure(frame), "coverage %").y)[-1] == pytest.approx(100 * card)


def test_phase_figure(frame):
    fig = charts.phase_figure(frame)
    # issue 47: plain names (the engine's identifiers stay as each trace's `meta`), drafting / verification /
    # bookkeeping grouped in that order, phases that took no time left out, an explanation in each hover
    assert [t.meta for t in fig.data] == ["draft_layers", "lm_head", "topk", "verify_forward", "accept"]
    assert all(p in PHASES for p in (t.meta for t in fig.data))
    assert [t.legendgroup for t in fig.data] == ["drafting"] * 3 + ["verification"] * 2
    assert not any("_" in t.name for t in fig.data)
    assert list(_trace(fig, "draft head layers").y) == [4.0, 3.0]
    assert list(_trace(fig, "target verify").y) == [10.0, 11.0]
    assert "one forward of the target" in _trace(fig, "target verify").hovertemplate
    colours = [t.marker.color for t in fig.data]
    assert len(set(colours)) == len(colours)
    assert fig.layout.barmode == "stack"
    assert "prefill 50 ms" in fig.layout.title.text


def test_tree_figure_of_a_chosen_step(frame):
    fig = charts.tree_figure(frame, 1, TEXT)
    accepted, rejected = _trace(fig, charts.TREE_ACCEPTED), _trace(fig, charts.TREE_REJECTED)
    assert list(accepted.text) == ["w11", "w13"] and list(rejected.text) == ["w12", "w14"]
    assert list(_trace(fig, "root").text) == ["w10"]
    bonus = _trace(fig, charts.TREE_BONUS)
    assert list(bonus.text) == ["w15"] and "VOCAB MISS" not in bonus.hovertext[0]
    assert list(bonus.x) == [3.0]  # one level below the last accepted node (depth 2)
    # edges: 4 drafted edges, of which root->11, 11->13 plus 13->bonus form the accepted path
    assert sum(v is None for v in _trace(fig, "accepted path").x) == 3
    assert sum(v is None for v in _trace(fig, "edges").x) == 2
    hover = accepted.hovertext[0]
    assert "w11" in hover and "id 11" in hover and "-0.100" in hover and "in the active set" in hover


def test_tree_figure_defaults_to_latest_step_and_marks_vocab_miss(frame):
    fig = charts.tree_figure(frame, None, TEXT)
    assert "step 2" in fig.layout.title.text and "vocab miss" in fig.layout.title.text
    bonus = _trace(fig, charts.TREE_BONUS)
    assert "VOCAB MISS" in bonus.hovertext[0]
    assert bonus.marker.color == charts.ORIGIN_COLORS[charts.VOCAB_MISS]
    assert len(_trace(fig, charts.TREE_ACCEPTED).x) == 0
    assert "⟨16⟩" in _trace(charts.tree_figure(frame, 2, None), charts.TREE_REJECTED).text  # no text: ids shown


def test_tree_shows_what_the_run_kept_when_the_answer_ends_inside_a_step(frame):
    """Verification accepted 0-1-3 and a bonus, but the answer ended (EOS) at token 11: 13 and the bonus
    were never output, so they are not drawn as accepted, and the title says what was kept."""
    cut = frame.copy()
    cut.at[1, "tokens"] = [11]
    fig = charts.tree_figure(cut, 1, TEXT)
    assert list(_trace(fig, charts.TREE_ACCEPTED).text) == ["w11"]
    assert list(_trace(fig, "not kept (after the answer's end)").text) == ["w13", "w15"]
    assert len(_trace(fig, charts.TREE_BONUS).x) == 0
    assert "2 accepted, 1 kept: the answer ended at w11" in fig.layout.title.text
    assert "+ bonus" not in fig.layout.title.text
    assert sum(v is None for v in _trace(fig, "accepted path").x) == 1  # root -> 11 only
    assert sum(v is None for v in _trace(fig, "not kept").x) == 2        # 11 -> 13 -> bonus, dotted
    assert "NOT KEPT" in _trace(fig, "not kept (after the answer's end)").hovertext[0]
    whole = charts.tree_figure(frame, 1, TEXT)
    assert "2 accepted + bonus" in whole.layout.title.text
    assert not [t for t in whole.data if t.name.startswith("not kept (")]


def test_tree_labels_sit_off_the_edges_and_the_legend_stays_short(frame):
    fig = charts.tree_figure(frame, 1, TEXT)
    labelled = [t for t in fig.data if t.mode == "markers+text"]
    # labels off the edges: an inner node's above it, a leaf's to its right (no edge runs on from a leaf)
    row = frame[frame["step"] == 1].iloc[0]
    parents = {*row["tree_parents"], row["accepted_path"][-1]}  # the bonus token hangs off the path's end
    for t in labelled:
        for node, pos in zip(t.customdata, t.textposition):
            assert pos == ("top center" if node in parents else "middle right")
    assert [t.name for t in fig.data if t.showlegend is not False] == [charts.TREE_REJECTED, charts.TREE_ACCEPTED,
                                                                        "root", charts.TREE_BONUS]
    title = fig.layout.title
    assert title.yref == "container" and title.pad.t >= charts.MODEBAR_PX  # below the toolbar's band
    assert fig.layout.margin.t >= charts.MODEBAR_PX + 40


def test_tree_figure_and_kpis_mark_the_copy_chain():
    events = make_events()
    # step 1 again, with node 3 (accepted) from the copy chain, node 1 drafted by both, a copy-only leaf
    events[1].tree_tokens.append(18)
    events[1].tree_parents.append(3)
    events[1].tree_depths.append(3)
    events[1].tree_logprobs.append(0.0)
    events[1].tree_in_active.append(False)
    events[1].tree_sources = ["root", "both", "head", "copy", "head", "copy"]
    events[2].tree_sources = ["root", "head", "head"]
    frame = events_to_frame(events)
    fig = charts.tree_figure(frame, 1, TEXT)
    accepted, rejected = _trace(fig, charts.TREE_ACCEPTED), _trace(fig, charts.TREE_REJECTED)
    assert list(accepted.marker.symbol) == ["hexagram", "diamond"]
    assert list(rejected.marker.symbol) == ["circle", "circle", "diamond"]
    assert "copy chain" in accepted.hovertext[1] and "copied from the context" in accepted.hovertext[1]
    assert _trace(fig, charts.SOURCE_LEGEND["copy"]) and "3 on the copy chain" in fig.layout.title.text
    assert "copy chain" not in charts.tree_figure(frame, 2, TEXT).layout.title.text
    values = charts.kpi_from_summary(summarize(events, "nanospec", 1.0, "eos"))
    assert values["accepted_by_source"] == {"head": 0, "copy": 1, "both": 1, "retrieved": 0}
    html = charts.kpi_html(values)
    assert "accepted drafts from the copy chain" in html and "100.0%" in html
    assert "copy chain" not in charts.kpi_html(charts.kpi_from_summary(summarize(make_events(), "nanospec", 1.0,
                                                                                 "eos")))
    # a copied token outside the active set (possible with static) counts as outside in coverage
    events[1].tree_in_active[3] = False
    assert summarize(events, "nanospec", 1.0, "eos").coverage == 0.5  # (1 + bonus) of 3, 0 of 1


def test_empty_and_autoregressive_frames():
    empty = events_to_frame([])
    for builder in (charts.vocab_figure, charts.coverage_figure, charts.phase_figure, charts.tree_figure,
                    charts.depth_figure):
        assert builder(empty).layout.annotations  # a message instead of a crash
    ar = [StepEvent(step=i, method="ar", root_token=1, tree_tokens=[1], tree_parents=[-1], tree_depths=[0],
                    tree_logprobs=[0.0], tree_in_active=[True], accepted_path=[0], accepted_tokens=[],
                    bonus_token=2, tokens=[2], active_size=0, added_ids=0, vocab_size=V, coverage=None,
                    miss_kind="none", wall_ms=5.0, phases=_phases(verify_forward=5.0)) for i in range(3)]
    frame = events_to_frame(ar)
    assert charts.kpi_from_summary(summarize(ar, "ar", 1.0, "max_new_tokens"))["coverage"] is None
    assert charts.vocab_figure(frame).layout.annotations
    assert len(charts.tree_figure(frame).data) == 7  # 3 edge kinds, rejected, accepted, root, bonus
    depth = charts.depth_figure(frame)  # a note, not an empty chart
    assert not depth.data and "no drafts in plain decoding" in depth.layout.annotations[0].text
    assert charts.budget_line(ar[1].to_dict()) is None and charts.budget_html(ar) == ""


def test_compare_table_figure_and_verdict():
    events = make_events()
    ar = summarize(events, "ar", 1.0, "max_new_tokens")
    fast = summarize(events, "nanospec", 0.5, "max_new_tokens")
    other = summarize(events[:2], "full", 0.8, "max_new_tokens")
    table = compare_table({"ar": ar, "nanospec": fast, "full": other}, greedy=True)
    assert table["speedup"].tolist() == pytest.approx([1.0, 2.0, 4 / 0.8 / 5])
    assert table["identical"].tolist() == [True, True, False]
    shown = display_table(table)
    assert shown["identical to ar"].tolist() == ["✓", "✓", "✗"]
    assert "✗" in compare_verdict({"ar": ar, "full": other}, True)
    assert "✓" in compare_verdict({"ar": ar, "nanospec": fast}, True)
    assert "lossless" in compare_verdict({"ar": ar, "nanospec": fast}, False)
    fig = charts.compare_figure(table)
    assert [t.name for t in fig.data] == [label for _, label, _ in charts.COMPARE_METRICS]
    assert list(fig.data[1].y) == pytest.approx([1.0, 2.0, 1.0])


class ByteTokenizer:
    """Each id is one byte; decoding shows half a UTF-8 character as U+FFFD, like byte-level BPE."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_decoder_keeps_multibyte_characters_whole():
    decoder = TokenDecoder(ByteTokenizer())
    pieces = [decoder.push(b) for b in "aé€b".encode()]
    assert "".join(pieces) == "aé€b"
    assert pieces[:3] == ["a", "", "é"]
    long = TokenDecoder(ByteTokenizer())
    text = "word " * 40
    assert "".join(long.push(b) for b in text.encode()) == text  # across window slides
    assert TokenDecoder(None).push(7) == "⟨7⟩ "


def test_trace_downloads_round_trip(tmp_path):
    view = RunView(meta={"prompt": "hi"})
    decoder = TokenDecoder(ByteTokenizer())
    for event in make_events():
        view.add(event, decoder)
    csv_path, json_path = save_downloads(view, tmp_path)
    events, _, meta = load_trace(json_path)
    assert [e.step for e in events] == [0, 1, 2] and meta["prompt"] == "hi"
    assert [e.tokens for e in load_trace(csv_path)[0]] == [e.tokens for e in view.events]
    replay = load_view(json_path)
    assert replay.pieces == view.pieces and replay.token_text == view.token_text
    assert load_view(csv_path).pieces[0] == "⟨10⟩ "  # CSV keeps no text: ids without a tokenizer
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a NanoSpec trace"):
        load_view(bad)


def test_prompt_parsing_and_examples():
    assert parse_prompt("  What is 2+2? ") == "What is 2+2?"
    turns = parse_prompt("user: Hi\nassistant: Hello!\nuser: Name a colour\nplease")
    assert turns == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "Name a colour\nplease"}]
    for bad in ("", "   ", None, "user: hi\nassistant: yo"):
        with pytest.raises(ValueError):
            parse_prompt(bad)
    examples = example_prompts()
    assert {label.split(":")[0] for label, _ in examples[:7]} == {c.replace("_", "-") for c in CATEGORIES}
    assert all(parse_prompt(text) for _, text in examples)


def test_page_defaults_follow_the_engine_default_tree_per_device():
    from app.inputs import defaults_for
    from nanospec.config import default_tree

    for device in ("cpu", "cuda"):
        tree, start = default_tree(device), defaults_for(device)
        assert (start["depth"], start["top_k"], start["total_tokens"], start["copy_branch"], start["budget"]) == \
            (tree.depth, tree.top_k, tree.total_tokens, tree.copy_branch, tree.budget)
    assert defaults_for("cpu")["copy_branch"] == 10 and defaults_for("cuda")["copy_branch"] == 0


def test_generation_options_coerce_and_bound():
    page = dict(method="nanospec", max_new_tokens=16.0, depth=4.0, top_k=6, total_tokens=24, temperature=0, top_p=1,
                seed=0.0, capacity=3072.0)  # sliders send floats
    opts = generation_options(page)
    assert opts == {"method": "nanospec", "max_new_tokens": 16, "depth": 4, "top_k": 6, "total_tokens": 24,
                    "temperature": 0.0, "top_p": 1.0, "seed": 0, "capacity": 3072, "copy_branch": 10,
                    "budget": TreeConfig().budget}  # the engine's default
    assert all(type(opts[k]) is int for k in ("max_new_tokens", "depth", "seed", "capacity"))
    assert generation_options({**page, "copy_branch": 4.0})["copy_branch"] == 4
    assert generation_options({**page, "budget": True})["budget"] is True
    assert generation_options({**page, "budget": None})["budget"] is TreeConfig().budget  # None: the default
    for bad in (1, "true", "on", [], 0.0):
        with pytest.raises(ValueError, match="budget must be True or False"):
            generation_options({**page, "budget": bad})
    for change, match in (({"copy_branch": 99}, r"copy_branch must be in \[0, 16\] in this app"),
                          ({"method": "bogus"}, "method must be one of ar, full"),
                          ({"max_new_tokens": 10_000}, "max_new_tokens"),
                          ({"temperature": -1.0}, "temperature"),
                          ({"seed": 2.5}, "seed"),
                          ({"max_new_tokens": "many"}, "max_new_tokens"),
                          ({"temperature": True}, "temperature must be a number"),
                          ({"top_p": "1"}, "top_p must be a number"),
                          ({"bogus": 1}, "unknown options")):
        with pytest.raises(ValueError, match=match):
            generation_options({**page, **change})
    assert not math.isnan(generation_options(dict(method="ar", max_new_tokens=1, depth=1, top_k=1, total_tokens=2,
                                                  temperature=2.0, top_p=0.05, seed=2**31 - 1, capacity=64))["top_p"])


def test_streamed_payload_is_the_validated_figure(frame):
    """The live run sends the plain dicts unvalidated; they must be what the validated `go.Figure` holds."""
    import json

    import plotly.graph_objects as go

    from app.callbacks import plot_data

    for spec in (charts.vocab_spec(frame), charts.coverage_spec(frame), charts.phase_spec(frame),
                 charts.tree_spec(frame, 1, TEXT), charts.vocab_spec(events_to_frame([])),
                 charts.depth_spec(frame), charts.tree_spec(events_to_frame(budgeted_events()), 1, TEXT)):
        payload = plot_data(spec)
        assert payload.type == "plotly"
        sent = json.loads(payload.plot)
        assert isinstance(sent["layout"]["template"], dict)  # expanded: plotly.js knows no template names
        assert json.loads(go.Figure(spec).to_json()) == sent  # go.Figure raises on any invalid key


def test_page_shows_head_paths_without_machine_folders(tmp_path):
    from pathlib import Path

    from app.models import _short_path

    root = Path(__file__).resolve().parent.parent
    assert _short_path(str(root / "assets" / "heads" / "h")) == str(Path("assets") / "heads" / "h")
    assert _short_path(str(tmp_path / "my-head")) == "my-head"
    assert _short_path("yuhuili/EAGLE-LLaMA3.2-Instruct-1B") == "yuhuili/EAGLE-LLaMA3.2-Instruct-1B"


def test_compare_tab_flags_speeds_it_cannot_trust():
    from app.callbacks import compare_trust

    events = make_events()
    ar = summarize([StepEvent(**{**e.to_dict(), "method": "ar"}) for e in events], "ar", 1.0, "eos")
    fast = summarize(events, "nanospec", 1.0 / 24.3, "eos")  # 24.3x ar with τ 2.0: impossible
    table = compare_table({"ar": ar, "nanospec": fast}, greedy=True)
    assert table["speedup"].iloc[1] == pytest.approx(24.3)
    warning = compare_trust(table, {"ar": 0.95, "nanospec": 0.95})
    assert "Do not read these speeds as findings" in warning and "exceeds its τ 2.00" in warning
    assert "busy" in compare_trust(table.iloc[[0]], {"ar": 0.3})
    plausible = compare_table({"ar": ar, "nanospec": summarize(events, "nanospec", 1.0 / 1.8, "eos")}, greedy=True)
    assert compare_trust(plausible, {"ar": 0.95, "nanospec": 0.9}) == ""


# -- the draft budget and acceptance by draft position ------------------------------------------

def budgeted_events() -> list[StepEvent]:
    """`make_events` as a run with the draft budget: step 1 verified 4 of the 9 nodes it drafted, step 2
    verified none of its 5 (a plain step: the root alone, then the target's token)."""
    events = make_events()
    events[1].drafted_nodes, events[1].expected_tokens, events[1].budget_threshold = 10, 2.4137, 0.234
    plain = events[2]
    plain.tree_tokens, plain.tree_parents, plain.tree_depths = [15], [-1], [0]
    plain.tree_logprobs, plain.tree_in_active, plain.miss_kind = [0.0], [True], "none"
    plain.drafted_nodes, plain.expected_tokens, plain.budget_threshold = 6, 1.0, 0.31
    return events


def _plain(title: str) -> str:
    """A Plotly title as text: line breaks as spaces, tags dropped, entities decoded."""
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", title.replace("<br>", " ")))


def test_budget_line_of_a_budgeted_step_and_of_a_plain_step():
    events = budgeted_events()
    assert charts.budget_line(events[1].to_dict()) == (
        "verified the 4 likeliest of 9 drafted nodes; expected 2.41 tokens; more would have cost more time than "
        "they were likely to bring")
    assert charts.budget_line(events[2].to_dict()) == "nothing drafted paid for its verification time: a plain step"
    assert charts.budget_line(events[0].to_dict()) is None  # prefill
    assert all(charts.budget_line(e.to_dict()) is None for e in make_events())  # a run without the budget
    frame = events_to_frame(events)  # the frame's rows say the same (NaN where an event held None)
    assert [charts.budget_line(row) for _, row in frame.iterrows()] == [charts.budget_line(e.to_dict())
                                                                          for e in events]


def test_tree_title_says_what_the_budget_kept():
    frame = events_to_frame(budgeted_events())
    title = _plain(charts.tree_figure(frame, 1, TEXT).layout.title.text)
    assert "4 verified, 2 accepted + bonus" in title
    assert "verified the 4 likeliest of 9 drafted nodes; expected 2.41 tokens; more would have cost more time " \
           "than they were likely to bring" in title
    plain = charts.tree_figure(frame, 2, TEXT)
    assert "nothing drafted paid for its verification time: a plain step" in _plain(plain.layout.title.text)
    assert len(_trace(plain, charts.TREE_BONUS).x) == 1 and len(_trace(plain, charts.TREE_REJECTED).x) == 0
    budget_top = plain.layout.margin.t
    assert budget_top > charts.tree_figure(events_to_frame(make_events()), 1, TEXT).layout.margin.t  # room for it
    assert "verified" not in charts.tree_figure(events_to_frame(make_events()), 1, TEXT).layout.title.text


def test_budget_note_under_the_kpis():
    events = budgeted_events()
    curve = {"sizes": [1, 2, 4], "ms": [10.0, 13.0, 19.0], "key": {"device": "cpu:cpu"}, "per_token_ms": 3.0,
             "text": "target forward ms by verified tokens (1: 10.0, 2: 13.0, 4: 19.0)"}
    note = charts.budget_html(events, curve)
    assert 'id="budget-note"' in note and "Draft budget on" in note
    assert "cost per extra verified token: <b>3.00 ms</b> (measured on this device: cpu)" in note
    assert "verified 4 of 14 drafted nodes over 2 steps, 1 of them plain steps" in note
    assert "1: 10.0" in note  # the whole curve in the hover
    assert "the device that recorded this trace" in charts.budget_html(events, curve, replayed=True)
    assert "cost per extra" not in charts.budget_html(events)  # a CSV trace keeps no curve: counts only
    assert charts.budget_html(make_events()) == ""
    # a replayed file's meta may hold anything: a curve without a number is left out, never a crash
    junk = (("x", False), ({"per_token_ms": "fast"}, False), ({"per_token_ms": 2.0, "key": "cpu"}, True))
    for curve, shows_cost in junk:
        shown = charts.budget_html(events, curve)
        assert "verified 4 of 14" in shown and ("<b>2.00 ms</b> (measured on this device: ?)" in shown) is shows_cost


def test_acceptance_by_draft_position():
    """Entry d of `metrics.accepted_depth_counts` over entry 0, with the counts in the hover."""
    events = make_events()  # step 1 accepted 2 drafted tokens (tree depth 2), step 2 none (depth 1)
    fig = charts.depth_figure(events_to_frame(events))
    bars, reached = _trace(fig, "accepted at this position"), _trace(fig, "verified tree reached it")
    assert list(bars.x) == [1, 2] and list(bars.y) == [50.0, 50.0]
    assert [list(c) for c in bars.customdata] == [[1, 2], [1, 2]]
    assert "accepted in %{customdata[0]} of %{customdata[1]} decode steps" in bars.hovertemplate
    assert list(reached.y) == [100.0, 50.0]
    # more steps: accepted 3, 1, 0, 2 of depth-3 trees -> counts [4, 3, 2, 1]
    more = [dataclasses.replace(events[1], step=i + 1) for i in range(4)]
    for event, n in zip(more, (3, 1, 0, 2)):
        event.tree_depths = [0, 1, 2, 3]
        event.tree_tokens, event.tree_parents = [1, 2, 3, 4], [-1, 0, 1, 2]
        event.accepted_tokens, event.accepted_path = [2, 3, 4][:n], [0, 1, 2, 3][:n + 1]
    fig = charts.depth_figure(events_to_frame([events[0], *more]))
    bars = _trace(fig, "accepted at this position")
    assert metrics.accepted_depth_counts([3, 1, 0, 2]) == [4, 3, 2, 1]
    assert list(bars.y) == [75.0, 50.0, 25.0] and [list(c) for c in bars.customdata] == [[3, 4], [2, 4], [1, 4]]
    assert list(bars.text) == ["75%", "50%", "25%"]
    # with the budget: the plain step reached no position; depths never verified show no bar
    budget = charts.depth_figure(events_to_frame(budgeted_events()))
    assert list(_trace(budget, "accepted at this position").y) == [50.0, 50.0]
    assert list(_trace(budget, "verified tree reached it").y) == [50.0, 50.0]
    only_plain = budgeted_events()[::2]  # prefill and the plain step
    assert "every step was a plain step" in charts.depth_figure(events_to_frame(only_plain)).layout.annotations[0].text


# -- issue 47: words, tree labels, the last step's miss --------------------------------------------------------
def test_punctuation_node_labels_read_as_tokens():
    text = {1: ".", 2: ",", 3: " the", 4: "a_very_long_token_text", 5: " "}
    assert charts.node_label(1, text) == "“.”" and charts.node_label(2, text) == "“,”"
    assert charts.node_label(3, text) == " the"  # a word keeps its leading space, as before
    long = charts.node_label(4, text)
    assert len(long) == charts.NODE_LABEL_CHARS and long.endswith("…")
    assert charts.node_label(5, text) == "·"  # whitespace stays visible as before


def test_a_miss_on_the_last_step_is_drawn_inside_the_chart(frame):
    fig = charts.coverage_figure(frame)  # the vocab miss is on step 2, the last
    vocab = _trace(fig, "vocab misses")
    assert list(vocab.marker.size) == [0, 8]  # a marker where the miss happened
    assert fig.layout.xaxis.range[1] >= 2.5 and fig.layout.xaxis.range[0] <= 0.5


def test_one_vocabulary_for_token_origins(frame):
    answer = charts.answer_html(["a", "b", "c"], [charts.ACCEPTED, charts.BONUS, charts.VOCAB_MISS])
    assert ">accepted draft<" in answer and ">bonus token<" in answer and ">vocab miss<" in answer
    assert ">head<" not in answer
    tree = charts.tree_figure(frame, 1, TEXT)
    names = {t.name for t in tree.data}
    assert {charts.TREE_ACCEPTED, charts.TREE_BONUS} <= names
    # the tree's words are the legend's: an accepted draft token, a bonus token
    assert charts.ORIGIN_SHORT[charts.ACCEPTED] in charts.TREE_ACCEPTED
    assert charts.ORIGIN_SHORT[charts.BONUS] == charts.TREE_BONUS


def test_counts_agree_with_their_nouns():
    assert charts.plural(1, "step") == "1 step" and charts.plural(2, "step") == "2 steps"
    events = make_events()
    for e in events[1:]:
        e.budget_threshold, e.drafted_nodes = 0.1, len(e.tree_tokens) + 2
    note = charts.budget_html(events[:2])
    assert "over 1 step," in note and "over 1 steps" not in note
    one = charts.kpi_html({"steps": 1, "tau": 1.0})
    assert "1 decode step<" in one


def test_every_engine_phase_has_a_plain_name_a_group_and_a_colour():
    from nanospec.timing import PHASES
    from app.charts.words import PHASE_COLORS, PHASE_NAMES
    assert set(PHASE_NAMES) == set(PHASES) and set(PHASE_COLORS) == set(PHASES)
    assert len(set(PHASE_COLORS.values())) == len(PHASES), "two phases share a colour"
    assert {p.group for p in PHASE_NAMES.values()} == {"drafting", "verification", "bookkeeping"}
