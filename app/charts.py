"""Chart builders: pure functions from the events frame (`events_to_frame`) to Plotly figures.

Every builder takes the frame (one row per step, step 0 = prefill) and returns a `go.Figure`
(`*_figure`) or the same figure as a plain dict (`*_spec`, what the live run streams: no
validation cost); none touches the engine, Gradio or the disk, so each is testable without a browser.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from nanospec import metrics
from nanospec.events import ACCEPT_SOURCES
from nanospec.timing import DRAFT_PHASES, PHASES

# token origins (`nanospec.metrics.ORIGINS`), as named everywhere on the page (answer legend, tree, lesson) and in
# the README: an *accepted draft token* (by the source that drafted it), a *bonus token*, a *vocab miss*
ACCEPTED = "accepted draft token, drafted by the head"
COPIED = "accepted draft token, copied from the context (copy chain)"
BOTH = "accepted draft token, drafted by the head and the copy chain"
BONUS = "bonus token: the target's own next token"
VOCAB_MISS = "vocab miss: the target's token was outside the active set"
ORIGIN_LABELS = {metrics.ORIGIN_HEAD: ACCEPTED, metrics.ORIGIN_COPY: COPIED, metrics.ORIGIN_BOTH: BOTH,
                 metrics.ORIGIN_BONUS: BONUS, metrics.ORIGIN_VOCAB_MISS: VOCAB_MISS}
ORIGIN_COLORS = {ACCEPTED: "#2e9d5b", COPIED: "#b5479b", BOTH: "#13928f", BONUS: "#3b6fd8", VOCAB_MISS: "#d64545"}
ORIGIN_SHORT = {ACCEPTED: "accepted draft", COPIED: "accepted draft (copy chain)",
                BOTH: "accepted draft (head + copy)", BONUS: "bonus token",
                VOCAB_MISS: "vocab miss"}  # the answer legend's words; the full label is the hover text
# the tree's node kinds, in the same words
TREE_ACCEPTED, TREE_REJECTED, TREE_BONUS = "accepted draft token", "rejected draft token", "bonus token"

# The engine's phases (`nanospec.timing.PHASES`, the data keys) as the page names them: a plain name, the
# group it belongs to and what it is (the hover). Groups follow the metric: drafting = draft time
# (`DRAFT_PHASES`), verification = the target's forward and the acceptance rule, bookkeeping = the rest.
PHASE_GROUPS = ("drafting", "verification", "bookkeeping")


@dataclass(frozen=True)
class PhaseName:
    name: str
    group: str
    about: str


PHASE_NAMES = {
    "draft_layers": PhaseName("draft head layers", "drafting", "the draft head's decoder layer over each tree level"),
    "lm_head": PhaseName("draft LM head", "drafting",
                         "scoring the active vocabulary rows: the LM-head matmul the small vocabulary shrinks"),
    "gather_wait": PhaseName("row gather", "drafting",
                             "copying newly added LM-head rows into the active buffer (waited for on a GPU)"),
    "topk": PhaseName("top-k", "drafting", "picking the best children of each node from the draft scores"),
    "copy_lookup": PhaseName("copy lookup", "drafting", "finding a continuation of the context to copy (copy chain)"),
    "verify_forward": PhaseName("target verify", "verification",
                                "one forward of the target over the whole draft tree"),
    "accept": PhaseName("accept / reject", "verification",
                        "comparing the drafts with the target's tokens; picking the bonus token"),
    "tree_build": PhaseName("tree build", "bookkeeping", "reranking drafted nodes and building the tree's mask"),
    "kv_compact": PhaseName("cache trim", "bookkeeping", "keeping only the accepted path's entries in the KV caches"),
    "vocab_update": PhaseName("vocab update", "bookkeeping", "adding the step's new ids to the active set"),
    "budget": PhaseName("draft budget", "bookkeeping", "choosing which drafted nodes are worth verifying"),
}
# one hue family per group: oranges for drafting, blues for verification, greys/greens for bookkeeping, each
# shade far enough from its neighbours in the stack to tell apart
PHASE_COLORS = {
    "draft_layers": "#d9480f", "lm_head": "#f59f00", "gather_wait": "#862e08", "topk": "#ffd43b",
    "copy_lookup": "#f783ac",
    "verify_forward": "#1c5fc9", "accept": "#74c0fc",
    "tree_build": "#495057", "kv_compact": "#adb5bd", "vocab_update": "#2b8a3e", "budget": "#8ce99a",
}


def phase_name(phase: str) -> str:
    """The plain name of an engine phase (its identifier when the page has none)."""
    return PHASE_NAMES[phase].name if phase in PHASE_NAMES else phase


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 step`, `2 steps` (`many` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
# where a draft-tree node came from (StepEvent.tree_sources): marker shape and hover text
SOURCE_SYMBOLS = {"head": "circle", "copy": "diamond", "both": "hexagram"}
SOURCE_LEGEND = {"copy": "copy chain", "both": "head + copy"}  # short: the hover says more
SOURCE_TEXT = {"head": "the draft head", "copy": "the context-copy chain (prompt lookup)",
               "both": "the draft head and the copy chain"}
HEIGHT = 350
MODEBAR_PX = 30  # Plotly's toolbar (shown on hover) sits in the figure's top-right corner: titles start below it
_LAYOUT = dict(template="plotly_white", height=HEIGHT, margin=dict(l=60, r=20, t=MODEBAR_PX + 48, b=44),
               legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, font=dict(size=11)),
               title=dict(font=dict(size=14), x=0, xanchor="left", y=1.0, yref="container", yanchor="top",
                          pad=dict(t=MODEBAR_PX)))


# -- helpers ---------------------------------------------------------------------------
def _decode_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["step"] > 0]


def token_label(token_id: int, token_text: Mapping[int, str] | None) -> str:
    """Readable text of one token for hovers and node labels (whitespace made visible)."""
    text = (token_text or {}).get(int(token_id))
    if text is None:
        return f"⟨{int(token_id)}⟩"
    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    return shown if shown.strip() else shown.replace(" ", "·") or "∅"


NODE_LABEL_CHARS = 10


def node_label(token_id: int, token_text: Mapping[int, str] | None) -> str:
    """A draft-tree node's label: `token_label` cut to `NODE_LABEL_CHARS`, and a token of punctuation only
    ("." or ",") in quotes, so it reads as a token and not as a speck beside the marker."""
    label = token_label(token_id, token_text)
    if len(label) > NODE_LABEL_CHARS:
        label = label[:NODE_LABEL_CHARS - 1] + "…"
    core = label.replace("·", "").strip()
    if core and not any(ch.isalnum() for ch in core) and core not in ("∅", "⏎", "⇥"):
        label = f"“{label}”"
    return label


@functools.cache
def _template() -> dict:
    """`plotly_white` expanded (plotly.js knows no template names), cut to the parts these charts use
    (2-D axes, bar and scatter): ~2 KB instead of ~7 KB in every streamed figure."""
    full = pio.templates["plotly_white"].to_plotly_json()
    keep = ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor", "plot_bgcolor",
            "xaxis", "yaxis", "shapedefaults", "annotationdefaults", "title")
    return {"layout": {k: full["layout"][k] for k in keep if k in full["layout"]},
            "data": {k: full["data"][k] for k in ("bar", "scatter") if k in full["data"]}}


def _layout(title: str, **extra) -> dict:
    """The shared layout of the live charts as a plain dict, with `extra` keys on top."""
    base = {k: v for k, v in _LAYOUT.items() if k != "title"}
    return {**base, "template": _template(), "title": {**_LAYOUT["title"], "text": title}, **extra}


def _right_axis(title: str, **extra) -> dict:
    return dict(title=dict(text=title), overlaying="y", side="right", anchor="x", showgrid=False, **extra)


def _note(text: str, **font) -> dict:
    return dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(color="#777", **font))


def _empty_spec(title: str, message: str) -> dict:
    return {"data": [], "layout": _layout(title, xaxis=dict(visible=False), yaxis=dict(visible=False),
                                          annotations=[_note(message, size=13)])}


def _empty(title: str, message: str) -> go.Figure:
    return go.Figure(_empty_spec(title, message))


# -- answer text -----------------------------------------------------------------------
def token_origins(frame: pd.DataFrame) -> list[str]:
    """Legend label (`ORIGIN_LABELS`) of every emitted token's origin (`nanospec.metrics.token_origins`,
    accepted draft tokens by the source of their tree node)."""
    sources = frame["tree_sources"] if "tree_sources" in frame else [[]] * len(frame)
    accepted = [metrics.accepted_origins(path, list(src) if isinstance(src, (list, tuple)) else [])
                for path, src in zip(frame["accepted_path"], sources)]
    origins = metrics.token_origins(frame["n_accepted"], frame["tokens"].map(len), frame["coverage"], accepted)
    return [ORIGIN_LABELS[o] for o in origins]


def answer_spans(frame: pd.DataFrame, pieces: Sequence[str], origins: Sequence[str] | None = None
                 ) -> list[tuple[str, str]]:
    """(text, origin label) pairs; `pieces` is the text of each emitted token. Pass `origins` when already
    known (the live view keeps them) to skip reading the frame."""
    origins = token_origins(frame) if origins is None else origins
    return [(piece, origin) for piece, origin in zip(pieces, origins) if piece]


ANSWER_CSS = """
.answer-box { border: 1px solid #d9dde3; border-radius: 8px; padding: 8px 12px; }
.answer-legend { font-size: 0.8em; opacity: 0.85; margin-bottom: 6px; }
.answer-legend .key { margin-right: 12px; white-space: nowrap; }
.answer-legend .key::before { content: ""; display: inline-block; width: 14px; height: 0; margin-right: 4px;
  border-bottom: 3px solid var(--c); vertical-align: middle; }
.answer-text { white-space: pre-wrap; word-break: break-word; line-height: 1.7; font-size: 1.02em; }
.answer-text .tok { border-bottom: 3px solid var(--c); background: color-mix(in srgb, var(--c) 12%, transparent); }
.answer-end { font-size: 0.8em; opacity: 0.75; margin-top: 4px; }
.answer-empty { opacity: 0.6; }
"""


def answer_html(pieces: Sequence[str], origins: Sequence[str], special: Sequence[bool] | None = None) -> str:
    """The answer as readable text: the decoded pieces run together (spaces and newlines kept), each token
    underlined in its origin's colour (`ORIGIN_COLORS`; the hover names it). Special tokens (`special[i]`,
    e.g. the end-of-sequence token) are not part of the text: a line under it names them."""
    special = list(special) if special is not None else [False] * len(pieces)
    spans, ended = [], []
    for piece, origin, is_special in zip(pieces, origins, special):
        if not piece:
            continue  # half a character: the next token's piece carries it
        if is_special:
            ended.append(piece)
            continue
        color = ORIGIN_COLORS.get(origin, "#888")
        spans.append(f'<span class="tok" style="--c:{color}" title="{html.escape(origin)}">{html.escape(piece)}</span>')
    shown = set(origins)
    keys = "".join(f'<span class="key" style="--c:{ORIGIN_COLORS[label]}" title="{html.escape(label)}">'
                   f'{html.escape(ORIGIN_SHORT[label])}</span>'
                   for label in ORIGIN_COLORS if label in shown or label in (ACCEPTED, BONUS, VOCAB_MISS))
    body = "".join(spans) if spans else '<span class="answer-empty">(no text yet)</span>'
    end = (f'<div class="answer-end">ended with {html.escape(" ".join(ended))} (not part of the text)</div>'
           if ended else "")
    return (f'<div class="answer-box"><div class="answer-legend"><b>Answer</b> · underline = where each token '
            f'came from: {keys}</div><div class="answer-text" id="answer-text">{body}</div>{end}</div>')


def answer_tokens(answer: str) -> list[str]:
    """The token texts an `answer_html` value shows, in order (what a reader of the API gets back)."""
    import re

    found = re.findall(r'<span class="tok"[^>]*>(.*?)</span>', answer, flags=re.S)
    return [html.unescape(t) for t in found]


def kpi_from_summary(summary) -> dict:
    """The run's headline numbers (what `kpi_html` shows) from its `RunSummary`."""
    return {"tokens": summary.new_tokens, "steps": summary.steps, "tokens_per_s": summary.tokens_per_s,
            "tau": summary.tau if summary.steps else math.nan, "mean_active": summary.mean_active,
            "active_frac": summary.active_frac, "vocab_size": summary.vocab_size, "coverage": summary.coverage,
            "draft_share": summary.draft_share, "accepted_by_source": dict(summary.accepted_by_source),
            "decode_tokens_per_s": summary.decode_tokens_per_s, "ttft_ms": summary.ttft_ms}


# -- KPIs ------------------------------------------------------------------------------
def kpi_html(values: dict) -> str:
    """A row of KPI cards (inline styles, so the page needs no extra CSS)."""
    box = ("flex:1 1 150px;border:1px solid #d9dde3;border-radius:8px;padding:8px 12px;"
           "background:rgba(127,127,127,0.04)")

    def card(label: str, value: str, sub: str = "") -> str:
        return (f"<div class='kpi' style='{box}'><div style='font-size:1.5em;font-weight:600'>{value}</div>"
                f"<div style='font-size:0.85em'>{label}</div>"
                f"<div style='font-size:0.75em;opacity:0.7'>{sub}</div></div>")

    tps = values.get("tokens_per_s", math.nan)
    tau = values.get("tau", math.nan)
    cov = values.get("coverage")
    active = values.get("mean_active", 0.0)
    active = 0.0 if active is None or math.isnan(active) else active  # no decode step yet: no mean
    decode = values.get("decode_tokens_per_s", math.nan)
    ttft = values.get("ttft_ms", math.nan)
    cards = [
        card("decode tokens/s", "–" if math.isnan(decode) else f"{decode:.1f}",
             f"{values.get('tokens', 0)} tokens · {'–' if math.isnan(tps) else f'{tps:.1f}'}/s with prefill"),
        card("time to first token", "–" if math.isnan(ttft) else
             (f"{ttft / 1e3:.2f} s" if ttft >= 1e3 else f"{ttft:.0f} ms"), "the prompt's prefill"),
        card("τ (tokens per target forward)", "–" if math.isnan(tau) else f"{tau:.2f}",
             plural(values.get('steps', 0), "decode step")),
        card("mean active size", f"{active:,.0f}" if active else "–",
             f"{values.get('active_frac', 0.0):.1%} of V = {values.get('vocab_size', 0):,}" if active else "no drafter"),
        card("coverage", "–" if cov is None else f"{cov:.1%}", "emitted tokens that were in the active set"),
        card("draft-time share", f"{values.get('draft_share', 0.0):.1%}", "of decode wall time"),
    ]
    by_source = values.get("accepted_by_source") or {}
    accepted = sum(by_source.values())
    if by_source.get("copy") or by_source.get("both"):  # the copy branch supplied something
        share = {k: by_source.get(k, 0) / accepted for k in ACCEPT_SOURCES}
        cards.append(card("accepted drafts from the copy chain", f"{share['copy'] + share['both']:.1%}",
                          f"copy only {share['copy']:.0%} · also drafted by the head {share['both']:.0%} · "
                          f"head only {share['head']:.0%}"))
    return "<div class='kpi-row' style='display:flex;gap:8px;flex-wrap:wrap'>" + "".join(cards) + "</div>"


# -- per-step charts ---------------------------------------------------------------------
# Each chart is built as a plain Plotly figure dict (`*_spec`): building a validated `go.Figure`
# costs ~40 ms per chart on a slow CPU, which the live run pays on every redraw. `*_figure` wraps
# the same dict in a `go.Figure` for everything else (tests, the lesson, notebooks).
def step_axis(steps: Sequence[int], title: str, **extra) -> dict:
    """An x axis of step numbers: integer ticks only (about ten at most), whatever the run's length."""
    span = (max(steps) - min(steps)) if len(steps) else 0
    dtick = max(1, math.ceil(span / 10))
    return dict(title=dict(text=title), tickmode="linear", tick0=0, dtick=dtick, tickformat="d", **extra)


VOCAB_PANELS = ([0.42, 1.0], [0.0, 0.27])  # y domains: active set (log) on top, ids added below


def vocab_spec(frame: pd.DataFrame) -> dict:
    """Two panels on one step axis: the active vocabulary per step on a log axis against the full vocabulary
    V (top), and the ids added per decode step on their own linear axis (bottom), so neither is read on the
    other's scale. The prefill's count (the whole prompt's) is in the legend: as a bar it would dwarf the rest."""
    title = "Active draft vocabulary per step"
    if frame.empty:
        return _empty_spec(title, "no steps yet")
    vocab = int(frame["vocab_size"].iloc[0])
    steps = frame["step"].tolist()
    active = [int(a) if a > 0 else None for a in frame["active_size"]]
    decode = _decode_rows(frame)
    prefill_added = int(frame.loc[frame["step"] == 0, "added_ids"].sum())
    added_name = "ids added per step" + (f" (prefill: {prefill_added:,}, not drawn)" if prefill_added else "")
    data = [
        dict(type="scatter", x=steps, y=active, name="active set", mode="lines+markers",
             line=dict(color="#e8743b", width=2), marker=dict(size=5),
             hovertemplate="step %{x}<br>%{y:,} active rows<extra></extra>"),
        dict(type="scatter", x=steps, y=[vocab] * len(steps), name=f"full vocabulary V = {vocab:,}", mode="lines",
             line=dict(color="#555", dash="dash"), hoverinfo="skip"),
        dict(type="bar", x=decode["step"].tolist(), y=decode["added_ids"].tolist(), name=added_name, yaxis="y2",
             marker=dict(color="#9b7fc7"), hovertemplate="step %{x}<br>%{y:,} ids added<extra></extra>"),
    ]
    added_max = max([1, *decode["added_ids"].tolist()])
    known = [a for a in active if a] + [vocab]
    # the log axis spans the data with room above V's line, so the line never sits on the top tick
    log_range = [math.log10(max(1, min(known))) - 0.3, math.log10(vocab) + 0.35]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    layout = _layout(title, bargap=0.2, height=HEIGHT + 40,
                     xaxis=step_axis(steps, "step (0 = prefill)", anchor="y2", range=[lo - 0.5, hi + 0.5]),
                     yaxis=dict(type="log", dtick=1, domain=VOCAB_PANELS[0], range=log_range,
                                title=dict(text="rows scored (log)")),
                     yaxis2=dict(domain=VOCAB_PANELS[1], anchor="x", rangemode="tozero", range=[0, added_max * 1.15],
                                 tickformat="d", nticks=3, title=dict(text="ids added")))
    if all(a is None for a in active):
        layout["annotations"] = [_note("autoregressive: no drafter, no active set")]
    return {"data": data, "layout": layout}


def _outside(frame: pd.DataFrame) -> list[int]:
    """Per step: accepted draft tokens that were outside the active set (`StepEvent.accepted_outside`)."""
    return [sum(not flags[i] for i in list(path)[1:] if i < len(flags))
            for path, flags in zip(frame["accepted_path"], frame["tree_in_active"])]


def running_coverage(frame: pd.DataFrame) -> list[float | None]:
    """Coverage % after each decode step (None until the first step with a drafter): `metrics.running_coverage`
    with the same inputs as the run's summary (`events.summarize`), so the last value is the KPI card's."""
    return [None if c is None else 100.0 * c
            for c in metrics.running_coverage(frame["n_accepted"], frame["coverage"], _outside(frame))]


MISS_TEXT = {"vocab": "vocab misses (the target's token was outside the active set)",
             "draft": "draft misses (in the set, but the drafter ranked it too low)"}


def coverage_spec(frame: pd.DataFrame) -> dict:
    """Misses so far by kind (vocab vs draft), against the running coverage %.

    Each step ends in at most one miss, so misses per step would be 0/1 bars; running counts show
    which kind dominates and when misses come (a steep stretch = many misses in a row)."""
    title = "Misses so far by kind, and running coverage"
    decode = _decode_rows(frame)
    if decode.empty:
        return _empty_spec(title, "no decode steps yet")
    steps = decode["step"].tolist()
    data = []
    for kind, name, color in (("vocab", "vocab misses", "#d64545"), ("draft", "draft misses", "#f2b134")):
        hit = (decode["miss_kind"] == kind).tolist()
        counts = (decode["miss_kind"] == kind).astype(int).cumsum().tolist()
        # a marker on each step that ended in a miss of this kind: a miss on the last step is a dot inside
        # the chart (the axis runs half a step past it), not a stub on its border
        data.append(dict(type="scatter", x=steps, y=counts, name=name, mode="lines+markers", legendgroup=kind,
                         line=dict(color=color, width=2, shape="hv"),
                         marker=dict(color=color, size=[8 if h else 0 for h in hit]),
                         hovertemplate="after step %{x}: %{y} " + MISS_TEXT[kind] + "<extra></extra>"))
    coverage = [c for c, step in zip(running_coverage(frame), frame["step"]) if step > 0]
    data.append(dict(type="scatter", x=steps, y=coverage, name="coverage %", mode="lines", yaxis="y2",
                     line=dict(color="#2e9d5b", width=2, dash="dot"),
                     hovertemplate="after step %{x}: coverage %{y:.1f}%<extra></extra>"))
    top = max(1, int((decode["miss_kind"] != "none").sum()))
    layout = _layout(title, xaxis=step_axis(steps, "decode step", domain=[0, 0.92],
                                            range=[min(steps) - 0.5, max(steps) + 0.5]),
                     yaxis=dict(title=dict(text="misses so far"), rangemode="tozero", range=[0, top * 1.1],
                                tickformat="d", dtick=max(1, math.ceil(top / 6))),
                     yaxis2=_right_axis("coverage %", range=[0, 102]))
    if all(c is None for c in decode["coverage"]):
        layout["annotations"] = [_note("autoregressive: nothing drafted, no misses")]
    return {"data": data, "layout": layout}


def phase_spec(frame: pd.DataFrame) -> dict:
    """Wall time per decode step, stacked by phase (prefill excluded; its time is in the title)."""
    decode = _decode_rows(frame)
    prefill_ms = float(frame.loc[frame["step"] == 0, "wall_ms"].sum())
    title = f"Time per decode step by phase (prefill {prefill_ms:.0f} ms not shown)"
    if decode.empty:
        return _empty_spec(title, "no decode steps yet")
    steps = decode["step"].tolist()
    data = []
    # grouped (drafting, verification, bookkeeping: one hue family each), stacked in that order from the
    # bottom; a phase that took no time in this run (copy lookup without the copy chain, ...) is left out
    for group in PHASE_GROUPS:
        phases = [p for p in PHASES if (PHASE_NAMES[p].group if p in PHASE_NAMES else "bookkeeping") == group]
        shown = [p for p in phases if f"phase_{p}" in decode and float(decode[f"phase_{p}"].abs().sum()) > 0]
        for i, phase in enumerate(shown):
            about = PHASE_NAMES[phase].about if phase in PHASE_NAMES else phase
            data.append(dict(type="bar", x=steps, y=[float(v) for v in decode[f"phase_{phase}"]],
                             name=phase_name(phase), legendgroup=group, meta=phase,
                             legendgrouptitle=dict(text=f"<b>{group}</b>") if i == 0 else None,
                             marker=dict(color=PHASE_COLORS.get(phase, "#999")),
                             hovertemplate=f"<b>{html.escape(phase_name(phase))}</b> ({group})<br>"
                                           f"{html.escape(about)}<br>step %{{x}}: %{{y:.2f}} ms<extra></extra>"))
    for trace in data:
        if trace["legendgrouptitle"] is None:
            del trace["legendgrouptitle"]
    layout = _layout(title, barmode="stack", bargap=0.15, height=HEIGHT + 30, hovermode="closest",
                     margin=dict(l=60, r=20, t=MODEBAR_PX + 36, b=44),
                     legend=dict(orientation="v", x=0.78, xanchor="left", y=1.0, yanchor="top", font=dict(size=11),
                                 groupclick="toggleitem", tracegroupgap=6),
                     xaxis=step_axis(steps, "decode step", domain=[0, 0.74]), yaxis=dict(title=dict(text="ms")))
    return {"data": data, "layout": layout}


# -- the draft tree of one step ------------------------------------------------------------
def _tree_y(parents: Sequence[int]) -> list[float]:
    """Leaves get consecutive rows in depth-first order; a parent sits at its children's mean."""
    children: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    y = [0.0] * len(parents)
    next_leaf = 0.0
    stack = [(0, False)]
    while stack:  # iterative post-order so deep trees cannot hit the recursion limit
        node, done = stack.pop()
        if done or not children[node]:
            if children[node]:
                y[node] = sum(y[c] for c in children[node]) / len(children[node])
            else:
                y[node], next_leaf = next_leaf, next_leaf + 1
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children[node]))
    return y


@dataclass
class _DrawnTree:
    """One step's draft tree as drawn: the bonus token hangs off the last accepted node as one more node.

    `kept` nodes are what the run emitted (`StepEvent.tokens`): verification may accept a path that runs
    past the end of the answer (an end-of-sequence token, or the token budget), and what lies beyond
    was never part of the output."""
    row: pd.Series
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    logprobs: list[float]
    in_active: list[bool]
    path: list[int]
    sources: list[str]
    bonus: int  # the bonus token's node index
    x: list[float]
    y: list[float]
    on_path: set[int]
    miss: bool  # the bonus token was a vocabulary miss (and was kept)
    kept: set[int]  # nodes whose token the step emitted (accepted path and bonus, cut at the answer's end)

    @classmethod
    def from_row(cls, row: pd.Series) -> "_DrawnTree":
        tokens, parents = list(row["tree_tokens"]), list(row["tree_parents"])
        depths = list(row["tree_depths"])
        path = list(row["accepted_path"])
        sources = row.get("tree_sources")
        sources = list(sources) if isinstance(sources, (list, tuple)) else []
        sources = sources + ["head"] * (len(tokens) - len(sources))  # traces from before the copy branch
        bonus = len(tokens)
        tokens.append(int(row["bonus_token"]))
        parents.append(path[-1])
        depths.append(depths[path[-1]] + 1)
        kept = set([*path[1:], bonus][:len(row["tokens"])])
        return cls(row, tokens, parents, depths, list(row["tree_logprobs"]), list(row["tree_in_active"]), path,
                   sources, bonus, [float(d) for d in depths], _tree_y(parents), set(path),
                   metrics.as_flag(row["coverage"]) is False and bonus in kept, kept)

    @property
    def cut(self) -> bool:
        """The answer ended inside this step: some accepted tokens (or the bonus) were not kept."""
        return self.bonus not in self.kept

    def hover(self, i: int, token_text: Mapping[int, str] | None) -> str:
        label = token_label(self.tokens[i], token_text)
        dropped = "<br>NOT KEPT: the answer ended before it" if i != 0 and i not in self.kept else ""
        if i == self.bonus:
            status = "bonus token from the target" + (" — VOCAB MISS (outside the active set)" if self.miss else "")
            return f"<b>{label}</b><br>id {self.tokens[i]}<br>{status}{dropped}"
        kind = "root (last emitted token)" if i == 0 else (TREE_ACCEPTED if i in self.on_path else TREE_REJECTED)
        active = "in" if self.in_active[i] else "OUT of"
        source = self.sources[i]
        origin = "" if i == 0 else f"<br>from {SOURCE_TEXT.get(source, source)}"
        score = "copied from the context" if source == "copy" else f"draft log-prob {self.logprobs[i]:.3f}"
        return (f"<b>{label}</b><br>id {self.tokens[i]} · depth {self.depths[i]}<br>"
                f"{score}<br>{active} the active set<br>{kind}{origin}{dropped}")


def _tree_edges(t: _DrawnTree) -> list[dict]:
    """Grey edges; the kept path (with the bonus edge) in green; accepted edges past the answer's end dotted."""
    xs: dict[str, list] = {"edges": [], "accepted path": [], "not kept": []}
    ys: dict[str, list] = {"edges": [], "accepted path": [], "not kept": []}
    for child, parent in enumerate(t.parents):
        if parent < 0:
            continue
        kind = ("accepted path" if child in t.kept else
                "not kept" if child in t.on_path or child == t.bonus else "edges")
        xs[kind].extend([t.x[parent], t.x[child], None])
        ys[kind].extend([t.y[parent], t.y[child], None])
    styles = {"edges": dict(color="#c8c8c8", width=1.2), "accepted path": dict(color="#2e9d5b", width=3.5),
              "not kept": dict(color="#9fcfb2", width=2.5, dash="dot")}
    return [dict(type="scatter", x=xs[k], y=ys[k], mode="lines", name=k, hoverinfo="skip", showlegend=False,
                 line=style) for k, style in styles.items()]


def _tree_nodes(t: _DrawnTree, token_text: Mapping[int, str] | None) -> list[dict]:
    """One marker trace per node group; drafted nodes' shape is their source. Labels sit above their node,
    off the edges (which run level to level through the nodes' centres)."""
    groups = (
        (TREE_REJECTED, [i for i in range(1, t.bonus) if i not in t.on_path], "#b9c4d6", "circle", 11),
        (TREE_ACCEPTED, [i for i in t.path if i != 0 and i in t.kept], ORIGIN_COLORS[ACCEPTED], "circle", 14),
        ("root", [0], "#555", "square", 14),
        (TREE_BONUS, [t.bonus] if t.bonus in t.kept else [], ORIGIN_COLORS[VOCAB_MISS if t.miss else BONUS], "star",
         20),
        ("not kept (after the answer's end)", [i for i in [*t.path[1:], t.bonus] if i not in t.kept], "white",
         "circle-open", 13),
    )
    data = []
    parents = set(t.parents)
    for name, idx, color, symbol, size in groups:
        if not idx and name.startswith("not kept"):
            continue  # the legend names it only when it happens
        outline = ["#d64545" if i < t.bonus and not t.in_active[i] else "white" for i in idx]
        if symbol == "circle":  # drafted nodes: the shape says which source proposed them
            symbol = [SOURCE_SYMBOLS.get(t.sources[i], "circle") for i in idx]
        marker = dict(color=color, symbol=symbol, size=size, line=dict(color=outline, width=1.5))
        if symbol == "circle-open":
            marker = dict(color="#2e9d5b", symbol=symbol, size=size, line=dict(width=2))
        data.append(dict(
            type="scatter", x=[t.x[i] for i in idx], y=[t.y[i] for i in idx], mode="markers+text", name=name,
            # a leaf's label to its right (nothing is drawn there), an inner node's above it: labels of
            # neighbouring leaves in the deepest column never meet
            text=[node_label(t.tokens[i], token_text) for i in idx],
            textposition=["top center" if i in parents else "middle right" for i in idx],
            textfont=dict(size=12, color="#222"), customdata=list(idx),
            hovertext=[t.hover(i, token_text) for i in idx], hoverinfo="text", marker=marker))
    return data


def tree_spec(frame: pd.DataFrame, step: int | None = None,
              token_text: Mapping[int, str] | None = None) -> dict:
    """The draft tree of one step (default: the latest): the kept path highlighted, bonus token added."""
    if frame.empty:
        return _empty_spec("Draft tree", "no steps yet")
    rows = frame[frame["step"] == step] if step is not None else frame.iloc[[-1]]
    row = (rows if len(rows) else frame.iloc[[-1]]).iloc[0]
    t = _DrawnTree.from_row(row)
    data = _tree_edges(t) + _tree_nodes(t, token_text)
    n_copy = sum(s in ("copy", "both") for s in t.sources)
    for source in ("copy", "both") if n_copy else ():  # legend entries for the shapes
        data.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=SOURCE_LEGEND[source],
                         marker=dict(color="#888", symbol=SOURCE_SYMBOLS[source], size=10)))
    n_acc = len(t.path) - 1
    if t.cut:
        n_kept = len(t.kept)
        last = [*t.path[1:], t.bonus][n_kept - 1] if n_kept else None
        end = f" at {token_label(t.tokens[last], token_text)}" if last is not None else ""
        outcome = f", {n_acc} accepted, {n_kept} kept: the answer ended{end}"
    else:
        outcome = f", {n_acc} accepted + bonus" + (" (vocab miss)" if t.miss else "")
    # two lines: the step, then what happened in it (one line would run past a half-width chart); a
    # budgeted step adds what its budget kept, over two more lines
    budget = budget_line(row)
    title = (f"Draft tree of step {int(row['step'])}<br><span style='font-size:12px'>"
             f"{len(row['tree_tokens']) - 1} {'verified' if budget else 'drafted'}"
             + (f" ({n_copy} on the copy chain)" if n_copy else "") + html.escape(outcome) + "</span>")
    if budget:
        title += ("<br><span style='font-size:11px;color:#555'>"
                  + html.escape(budget).replace("; more would", ";<br>more would") + "</span>")
    top, bottom = MODEBAR_PX + (52 if budget is None else 84), 105
    height = max(HEIGHT, 40 * (max(t.y) + 1.5) + top + bottom)  # ~40 px per row: a label above each inner node
    layout = _layout(title, showlegend=True, height=height, hovermode="closest",
                     # the legend under the axis title (~60 px below the plot area): it never grows into the title
                     legend=dict(orientation="h", yanchor="top", y=-62 / (height - top - bottom), x=0,
                                 font=dict(size=10), itemwidth=30, tracegroupgap=0),
                     margin=dict(l=30, r=20, t=top, b=bottom),
                     # room right of the deepest column for its leaves' labels
                     xaxis=dict(title=dict(text="depth"), dtick=1, range=[-0.4, max(t.x) + 0.95], zeroline=False),
                     yaxis=dict(visible=False, range=[max(t.y) + 0.6, -0.9]))  # reversed: first leaf on top
    return {"data": data, "layout": layout}


# -- the draft budget ---------------------------------------------------------------------
def _number(value) -> float | None:
    """A float, or None for a missing value (a frame holds NaN where an event held None)."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def is_budgeted(row: Mapping) -> bool:
    """The step ran under the cost-aware draft budget (`StepEvent.budget_threshold` is set; prefill,
    `ar` and runs without the budget leave it None)."""
    return _number(row.get("budget_threshold")) is not None and (_number(row.get("drafted_nodes")) or 0) > 0


def budget_line(row: Mapping) -> str | None:
    """What the draft budget did in one step (a frame row or `StepEvent.to_dict()`), or None for a step
    without it. Node counts leave out the root (the last emitted token, verified every step)."""
    if not is_budgeted(row):
        return None
    verified, drafted = len(row["tree_tokens"]) - 1, int(row["drafted_nodes"]) - 1
    if verified == 0:
        return "nothing drafted paid for its verification time: a plain step"
    expected = _number(row.get("expected_tokens"))
    exp = f"; expected {expected:.2f} tokens" if expected is not None else ""
    return (f"verified the {verified} likeliest of {drafted} drafted nodes{exp}; more would have cost more time "
            "than they were likely to bring")


def budget_html(events: Sequence, curve: Mapping | None = None, replayed: bool = False) -> str:
    """The line under the KPIs of a run with the draft budget ("" for a run without it): the cost of one
    more verified token from the target's cost curve (`curve`: what the live run recorded from
    `SpecEngine.cost_curve()`, absent from CSV traces), and what the budget kept over the run."""
    steps = [e for e in events if e.step > 0 and e.budget_threshold is not None and e.drafted_nodes > 0]
    # a replayed trace's meta is whatever the file held: a curve without a number is left out
    curve = curve if isinstance(curve, Mapping) and _number(curve.get("per_token_ms")) is not None else None
    if not steps and not curve:
        return ""
    parts = []
    if curve:
        key = curve.get("key") if isinstance(curve.get("key"), Mapping) else {}
        device = str(key.get("device", "")).split(":", 1)[-1] or "?"
        where = "the device that recorded this trace" if replayed else "this device"
        ms = _number(curve["per_token_ms"])
        parts.append(f"<span title='{html.escape(str(curve.get('text', '')), quote=True)}'>cost per extra verified "
                     f"token: <b>{ms:.2f} ms</b> (measured on {where}: {html.escape(device)})</span>")
    if steps:
        verified = sum(len(e.tree_tokens) - 1 for e in steps)
        drafted = sum(e.drafted_nodes - 1 for e in steps)
        plain = sum(len(e.tree_tokens) == 1 for e in steps)
        parts.append(f"verified {verified:,} of {plural(drafted, 'drafted node')} over {plural(len(steps), 'step')}, "
                     f"{plain} of them plain steps (nothing drafted paid for its verification time)")
    return ('<p class="budget-note" id="budget-note" style="margin:6px 2px;font-size:0.9em">'
            "<b>Draft budget on</b> · " + " · ".join(parts) + "</p>")


def depth_spec(frame: pd.DataFrame) -> dict:
    """The run's acceptance rate by draft position: for each depth d, the share of decode steps that
    accepted at least d drafted tokens (`metrics.accepted_depth_counts`, entry d / entry 0; counts in
    the hover), with the share of steps whose verified tree reached depth d (a budget may stop short)."""
    title = ("Acceptance by draft position<br><span style='font-size:12px'>bar d: decode steps that accepted "
             "at least d drafted tokens</span>")
    decode = _decode_rows(frame)
    if decode.empty:
        return _empty_spec(title, "no decode steps yet")
    if (decode["method"] == "ar").all():
        return _empty_spec(title, "no drafts in plain decoding (ar): every step emits the target's own token")
    accepted = [int(n) for n in decode["n_accepted"]]
    deepest = [max(depths) for depths in decode["tree_depths"]]
    counts = metrics.accepted_depth_counts(accepted, max_depth=max([*deepest, *accepted]))
    steps = counts[0]
    positions = list(range(1, len(counts)))
    if not positions:
        return _empty_spec(title, "nothing drafted was verified yet: every step was a plain step")
    reached = [sum(d >= pos for d in deepest) for pos in positions]
    data = [
        dict(type="bar", x=positions, y=[100.0 * c / steps for c in counts[1:]], name="accepted at this position",
             marker=dict(color=ORIGIN_COLORS[ACCEPTED]), customdata=[[c, steps] for c in counts[1:]],
             text=[f"{100.0 * c / steps:.0f}%" for c in counts[1:]], textposition="outside", cliponaxis=False,
             hovertemplate="draft position %{x}: accepted in %{customdata[0]} of %{customdata[1]} decode steps "
                           "(%{y:.1f}%)<extra></extra>"),
        dict(type="scatter", x=positions, y=[100.0 * r / steps for r in reached], name="verified tree reached it",
             mode="lines+markers", line=dict(color="#3b6fd8", width=2, dash="dot"), marker=dict(size=7),
             customdata=[[r, steps] for r in reached],
             hovertemplate="draft position %{x}: verified in %{customdata[0]} of %{customdata[1]} decode steps "
                           "(%{y:.1f}%)<extra></extra>"),
    ]
    layout = _layout(title, bargap=0.3, margin=dict(l=60, r=20, t=MODEBAR_PX + 78, b=44),
                     xaxis=dict(title=dict(text="draft position (depth in the tree)"), tickmode="linear", tick0=1,
                                dtick=1, tickformat="d"),
                     yaxis=dict(title=dict(text="% of decode steps"), range=[0, 112], ticksuffix="%"))
    return {"data": data, "layout": layout}


def depth_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(depth_spec(frame))


def vocab_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(vocab_spec(frame))


def coverage_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(coverage_spec(frame))


def phase_figure(frame: pd.DataFrame) -> go.Figure:
    return go.Figure(phase_spec(frame))


def tree_figure(frame: pd.DataFrame, step: int | None = None,
                token_text: Mapping[int, str] | None = None) -> go.Figure:
    return go.Figure(tree_spec(frame, step, token_text))


# -- compare tab ------------------------------------------------------------------------
COMPARE_METRICS = (("tokens_per_s", "tokens/s", "{:.1f}"), ("speedup", "speedup over ar", "{:.2f}×"),
                   ("tau", "τ", "{:.2f}"), ("draft_ms_per_step", "draft ms / step", "{:.1f}"))


def compare_figure(table: pd.DataFrame) -> go.Figure:
    """One bar panel per metric (`COMPARE_METRICS`), one bar per method; `ar` in grey, an outside engine's rows
    (`vllm:…`) in orange."""
    if table.empty:
        return _empty("Compare", "no runs yet")
    fig = make_subplots(rows=1, cols=len(COMPARE_METRICS), subplot_titles=[m[1] for m in COMPARE_METRICS],
                        horizontal_spacing=0.07)
    colors = ["#7f8c8d" if m == "ar" else "#e08e2b" if ":" in m else "#3b6fd8" for m in table["method"]]
    for col, (key, label, fmt) in enumerate(COMPARE_METRICS, start=1):
        values = [float(v) for v in table[key]]
        fig.add_trace(go.Bar(x=table["method"].tolist(), y=values, name=label, marker_color=colors,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate="%{x}: %{y:.3g}<extra>" + label + "</extra>"), row=1, col=col)
        fig.update_yaxes(range=[0, max([1e-9, *values]) * 1.25], row=1, col=col)
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), row=1, col=2)
    fig.update_layout(**_LAYOUT, showlegend=False)
    fig.update_layout(margin=dict(l=40, r=20, t=40, b=40))
    return fig
