"""Chart builders: pure functions from the events frame (`events_to_frame`) to Plotly figures, one module per
chart, plus the answer text and the KPI cards (their HTML and CSS in app/templates/).

Every builder takes the frame (one row per step, step 0 = prefill) and returns a `go.Figure`
(`*_figure`) or the same figure as a plain dict (`*_spec`, what the live run streams: building a
validated `go.Figure` costs ~40 ms per chart on a slow CPU, which the live run would pay on every
redraw); none touches the engine, Gradio or the disk, so each is testable without a browser.

    words     token origins, tree node kinds, phase names and colours, token labels
    layout    the shared Plotly layout, empty figures, step axes
    answer    the answer text, tokens underlined by origin
    kpis      the KPI cards and the break-even τ
    vocab     active draft vocabulary per step         coverage  misses by kind and running coverage
    phases    time per decode step by phase             tree      the draft tree of one step
    depth     acceptance by draft position              budget    what the draft budget did
    compare   the Compare tab's bars
"""

from app.charts.answer import ANSWER_CSS, answer_html, token_origins
from app.charts.budget import budget_html, budget_line, is_budgeted
from app.charts.compare import COMPARE_METRICS, compare_figure
from app.charts.coverage import MISS_TEXT, coverage_figure, coverage_spec, running_coverage
from app.charts.depth import depth_figure, depth_spec
from app.charts.kpis import BreakEven, break_even, kpi_from_summary, kpi_html
from app.charts.layout import HEIGHT, MODEBAR_PX, step_axis
from app.charts.phases import phase_figure, phase_spec
from app.charts.tree import tree_figure, tree_spec
from app.charts.vocab import VOCAB_PANELS, vocab_figure, vocab_spec
from app.charts.words import (ACCEPTED, BONUS, BOTH, COPIED, NODE_LABEL_CHARS, ORIGIN_COLORS, ORIGIN_LABELS,
                              ORIGIN_SHORT, PHASE_COLORS, PHASE_GROUPS, PHASE_NAMES, RETRIEVED, SOURCE_LEGEND,
                              SOURCE_SYMBOLS, SOURCE_TEXT, TREE_ACCEPTED, TREE_BONUS, TREE_REJECTED, VOCAB_MISS,
                              PhaseName, node_label, phase_name, plural, token_label)

__all__ = [
    "ANSWER_CSS", "answer_html", "token_origins", "budget_html", "budget_line", "is_budgeted", "COMPARE_METRICS",
    "compare_figure", "MISS_TEXT", "coverage_figure", "coverage_spec", "running_coverage", "depth_figure",
    "depth_spec", "BreakEven", "break_even", "kpi_from_summary", "kpi_html", "HEIGHT", "MODEBAR_PX", "step_axis",
    "phase_figure", "phase_spec", "tree_figure", "tree_spec", "VOCAB_PANELS", "vocab_figure", "vocab_spec",
    "ACCEPTED", "BONUS", "BOTH", "COPIED", "NODE_LABEL_CHARS", "ORIGIN_COLORS", "ORIGIN_LABELS", "ORIGIN_SHORT",
    "RETRIEVED",
    "PHASE_COLORS", "PHASE_GROUPS", "PHASE_NAMES", "SOURCE_LEGEND", "SOURCE_SYMBOLS", "SOURCE_TEXT",
    "TREE_ACCEPTED", "TREE_BONUS", "TREE_REJECTED", "VOCAB_MISS", "PhaseName", "node_label", "phase_name",
    "plural", "token_label",
]
