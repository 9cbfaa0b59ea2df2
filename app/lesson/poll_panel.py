"""The projector's side of the class poll: a panel in the Lesson tab.

    panel = poll_panel()            # inside the lesson's layout (app/lesson/tab.py)
    wire_poll(panel, lesson)        # after the lesson's own wiring

"Start a class poll" snapshots the lesson's predict questions for the recorded prompt on show (the
questions come from app/lesson/questions.py through the chapters; the store keeps a copy so the
phones need no lesson data) and shows the join screen: the URL, the code and a QR code. The poll
follows the lesson: opening a chapter with a question puts that question on the phones. The teacher's
key lives in this page's server-side session state only (never in a URL or in the page).
"""

from __future__ import annotations

import html
import ipaddress
import os
from dataclasses import dataclass

import gradio as gr

from app.lesson import chapters as lc
from app.lesson.callbacks import lesson_data, open_chapter, question, render
from app.poll.charts import CSS, join_html, live_html, summary_html
from app.poll.store import PollError, PollQuestion, PollStore, default_store

QUIET = dict(show_progress="hidden", concurrency_limit=None, api_visibility="undocumented", queue=False)
REFRESH_S = 1.0


@dataclass
class PollPanel:
    start: gr.Button
    join_box: gr.Column
    join: gr.HTML
    hide_join: gr.Button
    live: gr.HTML
    controls: gr.Row
    reveal: gr.Button
    close: gr.Button
    next: gr.Button
    show_join: gr.Button
    end: gr.Button
    summary: gr.HTML
    timer: gr.Timer
    state: gr.State


# -- the questions, from the lesson ------------------------------------------------------------------
def poll_questions(prompt_id: str) -> list[PollQuestion]:
    """The lesson's predict questions for one recorded prompt, in chapter order (key "chapter-N")."""
    out = []
    for c in lc.CHAPTERS:
        q = question(c.number, prompt_id)
        if q is not None:
            out.append(PollQuestion(f"chapter-{c.number}", q.text, tuple(q.options), q.answer, html.unescape(q.why)))
    return out


def chapter_of(key: str) -> int:
    return int(key.split("-", 1)[1])


def chapter_titles() -> dict[str, str]:
    return {f"chapter-{c.number}": f"Chapter {c.number} · {c.title}" for c in lc.CHAPTERS}


# -- where students go ------------------------------------------------------------------------------
def public_base(request: gr.Request | None, env: dict[str, str] | None = None) -> str:
    """The address students type: `$NANOSPEC_POLL_URL` if set, else the one this page was opened at."""
    env = os.environ if env is None else env
    if env.get("NANOSPEC_POLL_URL"):
        return env["NANOSPEC_POLL_URL"].rstrip("/")
    headers = dict(getattr(request, "headers", None) or {})
    host = headers.get("x-forwarded-host") or headers.get("host") or "127.0.0.1:7860"
    proto = headers.get("x-forwarded-proto") or ("https" if host.endswith(".hf.space") else "http")
    return f"{proto.split(',')[0].strip()}://{host.split(',')[0].strip()}"


def local_only(base: str) -> bool:
    """True when `base` names this machine only (a phone cannot reach it)."""
    host = base.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def qr_svg(url: str) -> str:
    import segno

    return segno.make(url, error="m").svg_inline(scale=10, border=2, dark="#000", light="#fff")


# -- callbacks ---------------------------------------------------------------------------------------
def _view(store: PollStore, st: dict | None, note: str = "") -> str:
    if not st:
        return ""
    poll = store.poll(st["code"])
    url = f"{st['base']}/poll/{poll.code}"
    note = note or st.get("note", "")
    if poll.expired():
        note = "This poll's code has expired (codes last 3 hours): phones can no longer answer. Start a new poll."
    if poll.current < 0:
        return live_html(None, "", poll.code, url, note)
    qs = store.questions(poll.code)[poll.current]
    where = f"Question {qs.idx + 1} of {poll.size} (chapter {chapter_of(qs.question.key)})"
    return live_html(qs, where, poll.code, url, note)


def _current_idx(store: PollStore, st: dict) -> int | None:
    poll = store.poll(st["code"])
    return poll.current if poll.current >= 0 else None


def _follow(store: PollStore, st: dict, chapter, prompt_id) -> str:
    """Put the chapter's question on the phones (if the poll has one for it); the note says why not."""
    keys = st["keys"]
    try:
        key = f"chapter-{int(chapter)}"
    except (TypeError, ValueError):
        return ""
    if key not in keys:
        return ""
    if prompt_id != st["prompt"]:
        return f"The poll asks about prompt {st['prompt']}; switch back to it to poll this chapter."
    store.show(st["code"], st["token"], keys.index(key))
    return ""


class Teacher:
    """The panel's callbacks over one store (the app's by default)."""

    def __init__(self, store: PollStore | None = None):
        self._store = store

    @property
    def store(self) -> PollStore:
        return self._store or default_store()

    def start(self, chapter, prompt_id, request: gr.Request = None):
        prompt_id = prompt_id if prompt_id in lesson_data().prompt_ids else lesson_data().prompt_ids[0]
        questions = poll_questions(prompt_id)
        code, token = self.store.create(f"Prompt {prompt_id}", questions)
        base = public_base(request)
        st = {"code": code, "token": token, "prompt": prompt_id, "base": base, "keys": [q.key for q in questions]}
        st["note"] = _follow(self.store, st, chapter, prompt_id)
        url = f"{base}/poll/{code}"
        warning = (f"{base} is this computer only: phones cannot reach it. Open the app at this computer's network "
                   "address, or set NANOSPEC_POLL_URL." if local_only(base) else "")
        return (st, gr.Button(visible=False), gr.Column(visible=True), join_html(url, code, qr_svg(url), warning),
                _view(self.store, st), gr.Row(visible=True), gr.Timer(active=True), "")

    def refresh(self, st):
        if not st:
            return gr.skip()
        try:
            return _view(self.store, st)
        except PollError as err:
            return f"<p>{html.escape(str(err))}</p>"

    def follow(self, st, chapter, prompt_id):
        if not st or st.get("ended"):
            return gr.skip()
        st["note"] = _follow(self.store, st, chapter, prompt_id)   # kept in the session: shown until the next chapter
        return _view(self.store, st)

    def close(self, st):
        if st and (idx := _current_idx(self.store, st)) is not None:
            self.store.close(st["code"], st["token"], idx)
        return self.refresh(st)

    def reveal(self, st, prompt_id, presenter, fit):
        """The truth beside the class's answers; the lesson shows the chapter's answer view (as after a click)."""
        idx = _current_idx(self.store, st) if st else None
        if idx is None:
            return (gr.skip(),) * 7 + (self.refresh(st),)
        self.store.reveal(st["code"], st["token"], idx)
        number = chapter_of(st["keys"][idx])
        q = question(number, st["prompt"])
        lesson = (q.step, *render(number, st["prompt"], q.step, presenter, fit), gr.Radio(visible=False), "", False)
        return (*lesson, self.refresh(st))

    def next(self, st, prompt_id, presenter, fit):
        """The next question's chapter (the poll follows the chapter change)."""
        idx = _current_idx(self.store, st) if st else None
        nxt = 0 if idx is None else idx + 1
        if not st or nxt >= len(st["keys"]):
            return (gr.skip(),) * 9 + (self.refresh(st) if st else gr.skip(),)
        return (*open_chapter(chapter_of(st["keys"][nxt]), st["prompt"], presenter, fit), gr.skip())

    def end(self, st):
        if not st:
            return (st, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
        self.store.end(st["code"], st["token"])
        summary = summary_html(self.store.questions(st["code"]), chapter_titles())
        return (None, gr.Button(visible=True), gr.Row(visible=False), gr.Timer(active=False), "", summary)


# -- layout and wiring --------------------------------------------------------------------------------
def poll_panel() -> PollPanel:
    """The panel's components; call inside the lesson's layout (under the question)."""
    with gr.Column(elem_id="poll-panel"):
        gr.HTML(f"<style>{CSS}</style>", elem_id="poll-style", js_on_load=None)
        start = gr.Button("Start a class poll", elem_id="poll-start", size="sm")
        with gr.Column(visible=False, elem_id="poll-join", elem_classes=["poll-overlay"]) as join_box:
            join = gr.HTML("", elem_id="poll-join-html", js_on_load=None)
            hide_join = gr.Button("Back to the lesson ▶", variant="primary", elem_id="poll-join-hide")
        # the buttons above the bars: on the first screen of a projector while the question is open
        with gr.Row(visible=False, elem_id="poll-controls") as controls:
            reveal = gr.Button("Reveal", variant="primary", elem_id="poll-reveal", min_width=80)
            close = gr.Button("Close", elem_id="poll-close", min_width=80)
            nxt = gr.Button("Next ▶", elem_id="poll-next", min_width=80)
            show_join = gr.Button("Join code", elem_id="poll-show-join", min_width=80)
            end = gr.Button("End poll", variant="stop", elem_id="poll-end", min_width=80)
        live = gr.HTML("", elem_id="poll-live-html", js_on_load=None)
        summary = gr.HTML("", elem_id="poll-summary", js_on_load=None)
        timer = gr.Timer(REFRESH_S, active=False)
        state = gr.State(None)   # {code, token, prompt, base, keys}: server-side, never sent to the browser
    return PollPanel(start, join_box, join, hide_join, live, controls, reveal, close, nxt, show_join, end, summary,
                     timer, state)


def wire_poll(p: PollPanel, lesson, teacher: Teacher | None = None) -> None:
    """`lesson`: the tab's LessonHandles (chapter, prompt, presenter, fit and the outputs a chapter fills)."""
    t = teacher or Teacher()
    p.start.click(t.start, [lesson.chapter, lesson.prompt],
                  [p.state, p.start, p.join_box, p.join, p.live, p.controls, p.timer, p.summary], **QUIET)
    p.hide_join.click(lambda: gr.Column(visible=False), None, p.join_box, **QUIET)
    p.show_join.click(lambda: gr.Column(visible=True), None, p.join_box, **QUIET)
    p.timer.tick(t.refresh, p.state, p.live, **QUIET)
    lesson.chapter.change(t.follow, [p.state, lesson.chapter, lesson.prompt], p.live, **QUIET)
    p.close.click(t.close, p.state, p.live, **QUIET)
    shown = [lesson.step, lesson.text, lesson.plot, lesson.tokens, lesson.quiz, lesson.reveal, lesson.pending]
    p.reveal.click(t.reveal, [p.state, lesson.prompt, lesson.presenter, lesson.fit], [*shown, p.live], **QUIET)
    p.next.click(t.next, [p.state, lesson.prompt, lesson.presenter, lesson.fit],
                 [*lesson.chapter_outputs(), p.live], **QUIET)
    p.end.click(t.end, p.state, [p.state, p.start, p.controls, p.timer, p.live, p.summary], **QUIET)
