"""The race: recorded runs of one prompt replayed side by side in their recorded time.

`race_html(lanes, caption)` renders static markup that carries the lanes as JSON; the component
made by `race_component()` animates it in the browser (tokens appear when their step finished in
the recording, a clock runs, each lane shows τ and tokens/s when it is done). No model runs and
nothing is timed again: every time comes from the recorded `StepEvent.wall_ms`.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass

import gradio as gr

from nanospec import RunSummary, StepEvent

LANE_COLORS = {"ar": "#7f8c8d", "greedy": "#9b7fc7", "full": "#3b6fd8", "static": "#f2b134", "nanospec": "#e8743b",
               "hybrid": "#2e9d5b"}


@dataclass
class Lane:
    label: str
    color: str
    t: list[float]        # ms since the start at which each recorded step finished (prefill first)
    p: list[str]          # the text each step wrote
    c: list[int]          # tokens written once each step finished
    tau: float
    tokens_per_s: float
    tokens: int


def lane(label: str, events: list[StepEvent], summary: RunSummary, pieces: list[str] | None = None,
         token_text=None) -> Lane:
    """One lane from a run's events; `pieces` = the text of each output token (else `token_text(id)`)."""
    if not events:
        raise ValueError(f"run {label!r} has no steps to replay")
    done, t, p, c, k = 0.0, [], [], [], 0
    for e in events:
        done += e.wall_ms
        n = len(e.tokens)
        text = pieces[k: k + n] if pieces is not None else [token_text(tok) if token_text else f"⟨{tok}⟩"
                                                             for tok in e.tokens]
        k += n
        t.append(round(done, 2))
        p.append("".join(text))
        c.append(k)
    return Lane(label, LANE_COLORS.get(label, "#555555"), t, p, c, summary.tau, summary.tokens_per_s,
                summary.new_tokens)


def race_html(lanes: list[Lane], caption: str) -> str:
    """Static markup for the race; the browser side (`RACE_JS`) animates it."""
    if not lanes:
        return "<div class='race-empty'>Nothing to race yet.</div>"
    data = json.dumps({"lanes": [asdict(x) for x in lanes]}, separators=(",", ":"))
    rows = "".join(
        f"<div class='race-lane' style='--c:{x.color}'><div class='race-name'>{html.escape(x.label)}</div>"
        f"<div class='race-track'><div class='race-bar'></div><div class='race-text'></div></div>"
        f"<div class='race-stats'></div></div>" for x in lanes)
    return (f"<div class='race' data-race=\"{html.escape(data, quote=True)}\">"
            "<div class='race-head'><span class='race-clock'>0.00 s</span>"
            "<span class='race-speeds'>replay at <button class='race-go' data-speed='1'>1×</button>"
            "<button class='race-go' data-speed='2'>2×</button><button class='race-go' data-speed='4'>4×</button>"
            "</span></div>" + rows + f"<div class='race-caption'>{caption}</div></div>")


RACE_CSS = """
.race { font-size: 0.95em; }
.race-head { display: flex; justify-content: space-between; align-items: center; margin-bottom: 4px; }
.race-clock { font-family: ui-monospace, monospace; font-size: 1.5em; font-weight: 600; }
.race-go { margin-left: 4px; padding: 1px 8px; border: 1px solid #999; border-radius: 4px; background: none;
  cursor: pointer; }
.race-lane { display: grid; grid-template-columns: 7em 1fr 12em; gap: 8px; align-items: center; margin: 4px 0; }
.race-name { font-weight: 600; color: var(--c); }
.race-track { position: relative; border: 1px solid #ccc; border-radius: 4px; overflow: hidden; padding: 3px 6px; }
.race-bar { position: absolute; left: 0; top: 0; bottom: 0; width: 0; background: var(--c); opacity: 0.16; }
/* exactly two whole lines: the text is bottom-aligned, so what scrolls off the top goes a whole line at a time
   (a box that is not a whole number of lines cuts the first line in half) */
.race-text { position: relative; font-size: 0.85em; line-height: 1.3em; height: 2.6em; white-space: pre-wrap;
  overflow: hidden; display: flex; flex-direction: column; justify-content: flex-end; }
.race-stats { font-size: 0.85em; font-family: ui-monospace, monospace; }
.race-lane.done .race-stats { font-weight: 600; }
.race-caption { font-size: 0.75em; opacity: 0.8; margin-top: 4px; }
"""

RACE_JS = """
const start = (speed) => {
  const root = element.querySelector('.race');
  if (!root || !root.dataset.race) return;
  const data = JSON.parse(root.dataset.race);
  if (element._raf) cancelAnimationFrame(element._raf);
  const rows = [...root.querySelectorAll('.race-lane')];
  const end = Math.max(...data.lanes.map(l => l.t[l.t.length - 1]));
  const clock = root.querySelector('.race-clock');
  rows.forEach(r => { r._k = -1; r.classList.remove('done'); });
  const t0 = performance.now();
  const frame = (now) => {
    const t = Math.min((now - t0) * (speed || 1), end);
    clock.textContent = (t / 1000).toFixed(2) + ' s';
    data.lanes.forEach((l, i) => {
      let k = 0;
      while (k < l.t.length && l.t[k] <= t) k++;
      const row = rows[i];
      if (row._k === k) return;
      row._k = k;
      const text = l.p.slice(0, k).join('');
      row.querySelector('.race-text').textContent = text.slice(-400);
      const written = k > 0 ? l.c[k - 1] : 0;
      row.querySelector('.race-bar').style.width = (100 * written / Math.max(1, l.tokens)) + '%';
      const stats = row.querySelector('.race-stats');
      if (k === l.t.length) {
        row.classList.add('done');
        stats.textContent = `done ${(l.t[k - 1] / 1000).toFixed(2)} s · τ ${l.tau.toFixed(2)} · ` +
                            `${l.tokens_per_s.toFixed(1)} tok/s`;
      } else {
        stats.textContent = `${written} tokens`;
      }
    });
    if (t < end) element._raf = requestAnimationFrame(frame);
  };
  element._raf = requestAnimationFrame(frame);
};
element.addEventListener('click', (ev) => {
  const b = ev.target.closest('.race-go');
  if (b) start(parseFloat(b.dataset.speed));
});
watch('value', () => start(1));
start(1);
"""


def race_component(elem_id: str, visible: bool = True, value: str = "") -> gr.HTML:
    """A gr.HTML that animates whatever `race_html` markup it is given (on load and on every update)."""
    return gr.HTML(value, elem_id=elem_id, visible=visible, css_template=RACE_CSS, js_on_load=RACE_JS,
                   padding=False)
