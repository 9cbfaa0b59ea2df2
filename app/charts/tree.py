"""The draft tree of one step: the accepted path highlighted, the bonus token added, nodes shaped by source."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from nanospec import metrics

from app.charts.budget import budget_line
from app.charts.layout import HEIGHT, MODEBAR_PX, chart_layout, empty_spec
from app.charts.words import (ACCEPTED, BONUS, ORIGIN_COLORS, SOURCE_LEGEND, SOURCE_SYMBOLS, SOURCE_TEXT,
                              TREE_ACCEPTED, TREE_BONUS, TREE_REJECTED, VOCAB_MISS, node_label, token_label)


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
        return empty_spec("Draft tree", "no steps yet")
    rows = frame[frame["step"] == step] if step is not None else frame.iloc[[-1]]
    row = (rows if len(rows) else frame.iloc[[-1]]).iloc[0]
    t = _DrawnTree.from_row(row)
    data = _tree_edges(t) + _tree_nodes(t, token_text)
    n_copy = sum(s in ("copy", "both") for s in t.sources)
    for source in [s for s in SOURCE_LEGEND if s in t.sources]:  # legend entries for the shapes
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
    layout = chart_layout(title, showlegend=True, height=height, hovermode="closest",
                     # the legend under the axis title (~60 px below the plot area): it never grows into the title
                     legend=dict(orientation="h", yanchor="top", y=-62 / (height - top - bottom), x=0,
                                 font=dict(size=10), itemwidth=30, tracegroupgap=0),
                     margin=dict(l=30, r=20, t=top, b=bottom),
                     # room right of the deepest column for its leaves' labels
                     xaxis=dict(title=dict(text="depth"), dtick=1, range=[-0.4, max(t.x) + 0.95], zeroline=False),
                     yaxis=dict(visible=False, range=[max(t.y) + 0.6, -0.9]))  # reversed: first leaf on top
    return {"data": data, "layout": layout}



def tree_figure(frame: pd.DataFrame, step: int | None = None,
                token_text: Mapping[int, str] | None = None) -> go.Figure:
    return go.Figure(tree_spec(frame, step, token_text))
