"""Chart builders: pure functions from the events frame (`events_to_frame`) to Plotly figures.

Every builder takes the frame (one row per step, step 0 = prefill) and returns a `go.Figure`
(`*_figure`) or the same figure as a plain dict (`*_spec`, what the live run streams: no
validation cost); none touches the engine, Gradio or the disk, so each is testable without a browser.
"""

from __future__ import annotations

import functools
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

# token origins (`nanospec.metrics.ORIGINS`), as shown in the answer's legend
ACCEPTED = "accepted draft token"
BONUS = "bonus token (target)"
VOCAB_MISS = "bonus token: vocab miss"
ORIGIN_LABELS = {metrics.ORIGIN_HEAD: ACCEPTED, metrics.ORIGIN_BONUS: BONUS, metrics.ORIGIN_VOCAB_MISS: VOCAB_MISS}
ORIGIN_COLORS = {ACCEPTED: "#2e9d5b", BONUS: "#3b6fd8", VOCAB_MISS: "#d64545"}

PHASE_COLORS = {  # draft phases warm, target/bookkeeping phases cool
    "draft_layers": "#e8743b", "lm_head": "#f2b134", "gather_wait": "#c0504d", "topk": "#f7d488",
    "copy_lookup": "#d98cb3", "tree_build": "#9b7fc7", "verify_forward": "#3b6fd8", "accept": "#5bc0de",
    "kv_compact": "#7f8c8d", "vocab_update": "#2e9d5b",
}
# where a draft-tree node came from (StepEvent.tree_sources): marker shape and hover text
SOURCE_SYMBOLS = {"head": "circle", "copy": "diamond", "both": "hexagram"}
SOURCE_LEGEND = {"copy": "copy chain (prompt lookup)", "both": "head and copy chain"}
SOURCE_TEXT = {"head": "the draft head", "copy": "the context-copy chain (prompt lookup)",
               "both": "the draft head and the copy chain"}
HEIGHT = 330
_LAYOUT = dict(template="plotly_white", height=HEIGHT, margin=dict(l=60, r=20, t=56, b=44),
               legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, font=dict(size=11)),
               title=dict(font=dict(size=14), x=0, xanchor="left", y=0.985, yanchor="top"))


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
    """Legend label (`ORIGIN_LABELS`) of every emitted token's origin (`nanospec.metrics.token_origins`)."""
    origins = metrics.token_origins(frame["n_accepted"], frame["tokens"].map(len), frame["coverage"])
    return [ORIGIN_LABELS[o] for o in origins]


def answer_spans(frame: pd.DataFrame, pieces: Sequence[str], origins: Sequence[str] | None = None
                 ) -> list[tuple[str, str]]:
    """(text, origin) pairs for `gr.HighlightedText`; `pieces` is the text of each emitted token.
    Pass `origins` when already known (the live view keeps them) to skip reading the frame."""
    origins = token_origins(frame) if origins is None else origins
    return [(piece, origin) for piece, origin in zip(pieces, origins) if piece]


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
    decode = values.get("decode_tokens_per_s", math.nan)
    ttft = values.get("ttft_ms", math.nan)
    cards = [
        card("decode tokens/s", "–" if math.isnan(decode) else f"{decode:.1f}",
             f"{values.get('tokens', 0)} tokens · {'–' if math.isnan(tps) else f'{tps:.1f}'}/s with prefill"),
        card("time to first token", "–" if math.isnan(ttft) else
             (f"{ttft / 1e3:.2f} s" if ttft >= 1e3 else f"{ttft:.0f} ms"), "the prompt's prefill"),
        card("τ (tokens per target forward)", "–" if math.isnan(tau) else f"{tau:.2f}",
             f"{values.get('steps', 0)} decode steps"),
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
def vocab_spec(frame: pd.DataFrame) -> dict:
    """Active vocabulary size per step (log y) against the full vocabulary; ids added per step."""
    title = "Active draft vocabulary per step"
    if frame.empty:
        return _empty_spec(title, "no steps yet")
    vocab = int(frame["vocab_size"].iloc[0])
    steps = frame["step"].tolist()
    active = [int(a) if a > 0 else None for a in frame["active_size"]]
    data = [
        dict(type="bar", x=steps, y=frame["added_ids"].tolist(), name="ids added", yaxis="y2", opacity=0.45,
             marker=dict(color="#9b7fc7"), hovertemplate="step %{x}<br>%{y} ids added<extra></extra>"),
        dict(type="scatter", x=steps, y=active, name="active set", mode="lines+markers",
             line=dict(color="#e8743b", width=2), marker=dict(size=5),
             hovertemplate="step %{x}<br>%{y:,} active rows<extra></extra>"),
        dict(type="scatter", x=steps, y=[vocab] * len(steps), name=f"full vocabulary V = {vocab:,}", mode="lines",
             line=dict(color="#555", dash="dash"), hoverinfo="skip"),
    ]
    layout = _layout(title, bargap=0.2, xaxis=dict(title=dict(text="step (0 = prefill)"), domain=[0, 0.94]),
                     yaxis=dict(type="log", dtick=1, title=dict(text="rows scored")),
                     yaxis2=_right_axis("ids added", rangemode="tozero"))
    if all(a is None for a in active):
        layout["annotations"] = [_note("autoregressive: no drafter, no active set")]
    return {"data": data, "layout": layout}


def running_coverage(frame: pd.DataFrame) -> list[float | None]:
    """Coverage % after each decode step (None until the first step with a drafter)."""
    return [None if c is None else 100.0 * c
            for c in metrics.running_coverage(frame["n_accepted"], frame["coverage"])]


def coverage_spec(frame: pd.DataFrame) -> dict:
    """Misses per step by kind (vocab vs draft) with the running coverage %."""
    title = "Misses per step and running coverage"
    decode = _decode_rows(frame)
    if decode.empty:
        return _empty_spec(title, "no decode steps yet")
    steps = decode["step"].tolist()
    data = [dict(type="bar", x=steps, y=(decode["miss_kind"] == kind).astype(int).tolist(), name=name,
                 marker=dict(color=color), hovertemplate="step %{x}<extra>" + kind + "</extra>")
            for kind, name, color in (("vocab", "vocab miss (token outside the active set)", "#d64545"),
                                      ("draft", "draft miss (in the set, ranked too low)", "#f2b134"))]
    data.append(dict(type="scatter", x=steps, y=running_coverage(decode), name="running coverage %", mode="lines",
                     yaxis="y2", line=dict(color="#2e9d5b", width=2),
                     hovertemplate="step %{x}<br>coverage %{y:.1f}%<extra></extra>"))
    layout = _layout(title, barmode="stack", bargap=0.2,
                     xaxis=dict(title=dict(text="decode step"), domain=[0, 0.94]),
                     yaxis=dict(title=dict(text="miss"), range=[0, 1.05], dtick=1),
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
    for phase in PHASES:
        kind = "draft" if phase in DRAFT_PHASES else "target / bookkeeping"
        data.append(dict(type="bar", x=steps, y=[float(v) for v in decode[f"phase_{phase}"]], name=phase,
                         marker=dict(color=PHASE_COLORS[phase]),
                         hovertemplate="step %{x}<br>%{y:.2f} ms<extra>" + f"{phase} ({kind})</extra>"))
    layout = _layout(title, barmode="stack", bargap=0.15, height=HEIGHT + 30,
                     margin=dict(l=60, r=20, t=86, b=44),
                     xaxis=dict(title=dict(text="decode step")), yaxis=dict(title=dict(text="ms")))
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
    """One step's draft tree as drawn: the bonus token hangs off the last accepted node as one more node."""
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
    miss: bool  # the bonus token was a vocabulary miss

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
        return cls(row, tokens, parents, depths, list(row["tree_logprobs"]), list(row["tree_in_active"]), path,
                   sources, bonus, [float(d) for d in depths], _tree_y(parents), set(path),
                   metrics.as_flag(row["coverage"]) is False)

    def hover(self, i: int, token_text: Mapping[int, str] | None) -> str:
        label = token_label(self.tokens[i], token_text)
        if i == self.bonus:
            status = "bonus token from the target" + (" — VOCAB MISS (outside the active set)" if self.miss else "")
            return f"<b>{label}</b><br>id {self.tokens[i]}<br>{status}"
        kind = "root (last emitted token)" if i == 0 else ("accepted" if i in self.on_path else "rejected")
        active = "in" if self.in_active[i] else "OUT of"
        source = self.sources[i]
        origin = "" if i == 0 else f"<br>from {SOURCE_TEXT.get(source, source)}"
        score = "copied from the context" if source == "copy" else f"draft log-prob {self.logprobs[i]:.3f}"
        return (f"<b>{label}</b><br>id {self.tokens[i]} · depth {self.depths[i]}<br>"
                f"{score}<br>{active} the active set<br>{kind}{origin}")


def _tree_edges(t: _DrawnTree) -> list[dict]:
    """Grey edges, and the accepted path (with the bonus edge) in green."""
    edge_x, edge_y, path_x, path_y = [], [], [], []
    for child, parent in enumerate(t.parents):
        if parent < 0:
            continue
        accepted_edge = child in t.on_path or child == t.bonus
        (path_x if accepted_edge else edge_x).extend([t.x[parent], t.x[child], None])
        (path_y if accepted_edge else edge_y).extend([t.y[parent], t.y[child], None])
    return [dict(type="scatter", x=edge_x, y=edge_y, mode="lines", name="edges", hoverinfo="skip",
                 line=dict(color="#c8c8c8", width=1.2)),
            dict(type="scatter", x=path_x, y=path_y, mode="lines", name="accepted path", hoverinfo="skip",
                 line=dict(color="#2e9d5b", width=3.5))]


def _tree_nodes(t: _DrawnTree, token_text: Mapping[int, str] | None) -> list[dict]:
    """One marker trace per node group (rejected, accepted, root, bonus); drafted nodes' shape is their source."""
    groups = (
        ("drafted (rejected)", [i for i in range(1, t.bonus) if i not in t.on_path], "#b9c4d6", "circle", 11),
        ("accepted", [i for i in t.path if i != 0], ORIGIN_COLORS[ACCEPTED], "circle", 14),
        ("root", [0], "#555", "square", 14),
        ("bonus", [t.bonus], ORIGIN_COLORS[VOCAB_MISS if t.miss else BONUS], "star", 20),
    )
    data = []
    for name, idx, color, symbol, size in groups:
        outline = ["#d64545" if i < t.bonus and not t.in_active[i] else "white" for i in idx]
        if symbol == "circle":  # drafted nodes: the shape says which source proposed them
            symbol = [SOURCE_SYMBOLS.get(t.sources[i], "circle") for i in idx]
        data.append(dict(
            type="scatter", x=[t.x[i] for i in idx], y=[t.y[i] for i in idx], mode="markers+text", name=name,
            text=[token_label(t.tokens[i], token_text)[:14] for i in idx], textposition="middle right",
            textfont=dict(size=11, color="#333"), customdata=list(idx),
            hovertext=[t.hover(i, token_text) for i in idx], hoverinfo="text",
            marker=dict(color=color, symbol=symbol, size=size, line=dict(color=outline, width=1.5))))
    return data


def tree_spec(frame: pd.DataFrame, step: int | None = None,
              token_text: Mapping[int, str] | None = None) -> dict:
    """The draft tree of one step (default: the latest): accepted path highlighted, bonus token added."""
    if frame.empty:
        return _empty_spec("Draft tree", "no steps yet")
    rows = frame[frame["step"] == step] if step is not None else frame.iloc[[-1]]
    row = (rows if len(rows) else frame.iloc[[-1]]).iloc[0]
    t = _DrawnTree.from_row(row)
    data = _tree_edges(t) + _tree_nodes(t, token_text)
    n_copy = sum(s in ("copy", "both") for s in t.sources)
    for source in ("copy", "both") if n_copy else ():  # legend entries for the shapes
        data.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=SOURCE_LEGEND[source],
                         marker=dict(color="#888", symbol=SOURCE_SYMBOLS[source], size=11)))
    n_acc = len(t.path) - 1
    title = (f"Draft tree of step {int(row['step'])}: {len(row['tree_tokens']) - 1} drafted"
             + (f" ({n_copy} on the copy chain)" if n_copy else "")
             + f", {n_acc} accepted + bonus" + (" (vocab miss)" if t.miss else ""))
    layout = _layout(title, showlegend=True, height=max(HEIGHT, 26 * (max(t.y) + 1) + 110), hovermode="closest",
                     xaxis=dict(title=dict(text="depth"), dtick=1, range=[-0.3, max(t.x) + 0.9], zeroline=False),
                     yaxis=dict(visible=False, autorange="reversed"))
    return {"data": data, "layout": layout}


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
    """One bar panel per metric (`COMPARE_METRICS`), one bar per method; `ar` in grey."""
    if table.empty:
        return _empty("Compare", "no runs yet")
    fig = make_subplots(rows=1, cols=len(COMPARE_METRICS), subplot_titles=[m[1] for m in COMPARE_METRICS],
                        horizontal_spacing=0.07)
    colors = ["#7f8c8d" if m == "ar" else "#3b6fd8" for m in table["method"]]
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
