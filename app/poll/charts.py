"""The class's answers as HTML for the projector (pure functions of the store's rows, tested without a browser)."""

from __future__ import annotations

import html

from app.poll.store import QuestionState

STATE_WORDS = {"waiting": "not asked yet", "open": "answers open", "closed": "answers closed",
               "revealed": "revealed"}

CSS = """
#poll-panel{gap:8px}
.poll-overlay{position:fixed !important;inset:0;z-index:1000;background:var(--background-fill-primary,#fff);
  padding:3vh 4vw !important;overflow:auto;justify-content:center}
.poll-join{display:flex;gap:5vw;align-items:center;justify-content:center;flex-wrap:wrap}
.poll-join .qr svg{width:min(60vh,40vw);height:auto;display:block;background:#fff}
.poll-join .say{font-size:clamp(22px,2.6vw,48px);line-height:1.3}
.poll-join .url{font-family:ui-monospace,monospace;font-weight:700;font-size:clamp(24px,3vw,60px);word-break:break-all}
.poll-join .code{font-family:ui-monospace,monospace;font-weight:800;font-size:clamp(64px,9vw,180px);
  letter-spacing:.12em;line-height:1.1}
.poll-join .warn{color:#b45309;font-size:clamp(16px,1.2vw,24px);max-width:40vw}
.poll-live{border:1px solid var(--border-color-primary,#e5e7eb);border-radius:10px;padding:10px 14px;
  font-size:calc(.8 * var(--lesson-text, 17px));line-height:1.3}
#poll-controls button{white-space:nowrap}
.poll-head{display:flex;justify-content:space-between;align-items:baseline;gap:12px}
.poll-join-line{margin-top:6px;font-size:.8em;color:var(--body-text-color-subdued,#64748b)}
.poll-note{margin:6px 0 0;color:#b45309}
.poll-head .code{font-family:ui-monospace,monospace;font-weight:700;letter-spacing:.08em}
.poll-count{font-weight:700;font-size:1.25em;white-space:nowrap}
.poll-bars{display:grid;grid-template-columns:minmax(0,1fr) minmax(80px,40%) 5.5em;gap:2px 10px;align-items:center;
  margin-top:8px}
.poll-bars .lab{overflow-wrap:anywhere}
.poll-bars .track{background:var(--background-fill-secondary,#f1f5f9);border-radius:4px;height:1.3em}
.poll-bars .fill{background:#64748b;height:100%;border-radius:4px;min-width:2px}
.poll-bars .right .fill,.poll-bars .fill.right{background:#16a34a}
.poll-bars .num{text-align:right;font-variant-numeric:tabular-nums}
.poll-bars .lab.right{font-weight:700;color:#15803d}
.poll-truth{margin:6px 0;padding:8px 10px;border-left:4px solid #16a34a;background:rgba(22,163,74,.08)}
.poll-summary{font-size:calc(.85 * var(--lesson-text, 17px))}
.poll-summary h4{margin:14px 0 2px}
"""


def bars_html(qs: QuestionState, reveal: bool) -> str:
    """One row per choice: label, bar (share of the answers), count; the right choice marked once revealed."""
    total = qs.total
    rows = []
    for i, (option, n) in enumerate(zip(qs.question.options, qs.counts)):
        right = reveal and i == qs.question.answer
        share = n / total if total else 0.0
        mark = " right" if right else ""
        rows.append(f"<div class='lab{mark}'>{'✓ ' if right else ''}{html.escape(option)}</div>"
                    f"<div class='track'><div class='fill{mark}' style='width:{100 * share:.1f}%'></div></div>"
                    f"<div class='num' data-choice='{i}'>{n}{f' · {share:.0%}' if total else ''}</div>")
    return f"<div class='poll-bars'>{''.join(rows)}</div>"


def truth_sentence(qs: QuestionState) -> str:
    """'14 of 23 answered “4”, the right answer.'"""
    q = qs.question
    right = qs.counts[q.answer]
    return f"{right} of {qs.total} answered “{q.options[q.answer]}”, the right answer."


def live_html(qs: QuestionState | None, position: str, code: str, url: str, note: str = "") -> str:
    """The projector's strip under the question: how many answered, the truth once revealed (first, so a
    projector shows it without scrolling), the bars, and where latecomers join."""
    join = f"<div class='poll-join-line'>Join: <b>{html.escape(url)}</b></div>"
    note_html = f"<p class='poll-note'>{html.escape(note)}</p>" if note else ""
    if qs is None:
        return (f"<div class='poll-live' id='poll-live'><div class='poll-head'><span>Class poll <span class='code'>"
                f"{html.escape(code)}</span></span><span class='poll-count'>waiting</span></div>"
                f"{note_html or '<p>Open a chapter with a question: it goes to the students’ phones.</p>'}{join}</div>")
    reveal = qs.state == "revealed"
    count = f"{qs.total} answer{'s' if qs.total != 1 else ''}"
    body = [f"<div class='poll-live' id='poll-live' data-state='{qs.state}' data-total='{qs.total}'>"
            f"<div class='poll-head'><span>Class poll <span class='code'>{html.escape(code)}</span> · "
            f"{html.escape(position)} · <i>{STATE_WORDS[qs.state]}</i></span><span class='poll-count'>{count}</span></div>"]
    if reveal:
        body.append(f"<div class='poll-truth'><b>{html.escape(truth_sentence(qs))}</b> {html.escape(qs.question.why)}</div>")
    body += [bars_html(qs, reveal), note_html, join]
    return "".join(body) + "</div>"


def join_html(url: str, code: str, qr_svg: str, warning: str = "") -> str:
    """The join screen: the URL to type, the code, the QR code, big enough for the back row."""
    warn = f"<p class='warn'>{html.escape(warning)}</p>" if warning else ""
    return (f"<div class='poll-join' id='poll-join-card'><div class='qr'>{qr_svg}</div><div>"
            f"<div class='say'>On your phone, open</div><div class='url'>{html.escape(url)}</div>"
            f"<div class='say'>or scan the code. Class code:</div><div class='code'>{html.escape(code)}</div>"
            f"{warn}</div></div>")


def summary_html(questions: list[QuestionState], titles: dict[str, str] | None = None) -> str:
    """At the end: every question that was asked, its distribution and how many were right."""
    titles = titles or {}
    parts = ["<div class='poll-summary' id='poll-summary-card'><h3>Class poll summary</h3>"]
    asked = [qs for qs in questions if qs.state != "waiting"]
    for qs in asked:
        label = titles.get(qs.question.key, f"Question {qs.idx + 1}")
        parts.append(f"<h4>{html.escape(label)} · {qs.total} answer{'s' if qs.total != 1 else ''}</h4>"
                     f"<div>{html.escape(qs.question.text)}</div>{bars_html(qs, True)}"
                     f"<div>{html.escape(truth_sentence(qs)) if qs.total else 'Nobody answered.'}</div>")
    if not asked:
        parts.append("<p>No question was asked.</p>")
    return "".join(parts) + "</div>"
