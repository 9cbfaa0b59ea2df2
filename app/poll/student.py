"""The student's side: what a phone sees (`student_state`) and the page that shows it (plain HTML, no Gradio).

The page is one small HTML document (inline CSS and script, no model, no lesson data: everything comes
from the poll's SQLite rows). Its script keeps a random device token in localStorage, polls
`/poll/<code>/state` every 1.5 s and posts a tap to `/poll/<code>/answer`.
"""

from __future__ import annotations

import html
import json

from app.poll.store import PollStore

POLL_MS = 1500


def student_state(store: PollStore, code: str, device: str | None) -> dict:
    """What a student may see: the question on screen, its choices and their own answer; the class's counts
    and the truth only once revealed. Never other devices' answers or the teacher's key."""
    poll = store.poll(code)
    base = {"code": poll.code, "title": poll.title, "version": poll.version}
    if poll.expired():
        return {**base, "status": "expired"}
    if poll.ended:
        return {**base, "status": "ended"}
    if poll.current < 0:
        return {**base, "status": "waiting"}
    qs = store.questions(poll.code)[poll.current]
    q = qs.question
    state = {**base, "status": qs.state, "question": {"id": qs.idx, "number": qs.idx + 1, "of": poll.size,
                                                       "text": q.text, "options": list(q.options)},
             "mine": store.mine(poll.code, device, qs.idx) if device else None, "answered": qs.total}
    if qs.state == "revealed":
        state.update(counts=list(qs.counts), answer=q.answer, why=q.why)
    return state


CSS = """
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;font:18px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2937;background:#f8fafc;
     overflow-x:hidden}
main{max-width:640px;margin:0 auto;padding:16px}
header{display:flex;justify-content:space-between;align-items:baseline;gap:8px;color:#475569;font-size:15px}
header b{color:#1f2937;letter-spacing:.08em}
h1{font-size:21px;line-height:1.35;margin:12px 0 16px;overflow-wrap:anywhere}
.note{color:#475569;margin:10px 0}
.big{font-size:20px;text-align:center;margin-top:30vh}
.opts{display:flex;flex-direction:column;gap:10px}
button.opt{display:block;width:100%;min-height:56px;padding:12px 14px;font:inherit;text-align:left;
     border:2px solid #cbd5e1;border-radius:12px;background:#fff;color:inherit;position:relative;overflow:hidden;
     overflow-wrap:anywhere;cursor:pointer}
button.opt.mine{border-color:#2563eb;background:#eff6ff;font-weight:600}
button.opt:disabled{cursor:default;color:inherit}
button.opt .bar{position:absolute;left:0;top:0;bottom:0;background:#e2e8f0;z-index:0}
button.opt.right .bar{background:#bbf7d0}
button.opt.right{border-color:#16a34a}
button.opt span{position:relative;z-index:1}
button.opt .n{float:right;margin-left:8px;font-weight:600}
.why{margin-top:14px;padding:12px;border-left:4px solid #16a34a;background:#f0fdf4;border-radius:6px}
.err{color:#b91c1c;min-height:1.4em}
form{display:flex;flex-direction:column;gap:12px;margin-top:20vh}
input{font:inherit;font-size:28px;text-align:center;letter-spacing:.15em;text-transform:uppercase;padding:10px;
     min-height:56px;border:2px solid #cbd5e1;border-radius:12px;width:100%}
form button{min-height:56px;font:inherit;border:0;border-radius:12px;background:#2563eb;color:#fff}
"""

SCRIPT = """
const CODE = %(code)s, POLL_MS = %(poll_ms)d, HERE = location.pathname.replace(/\\/+$/, "");
let S = %(state)s, busy = false, lastErr = "";
const key = "nanospec-poll-device";
let device = localStorage.getItem(key);
if (!device || !/^[A-Za-z0-9_-]{16,64}$/.test(device)) {
  const b = new Uint8Array(18); crypto.getRandomValues(b);
  device = btoa(String.fromCharCode(...b)).replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
  localStorage.setItem(key, device);
}
const $ = (t, cls, text) => { const e = document.createElement(t); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; };
function render() {
  const root = document.getElementById("poll"); root.replaceChildren();
  const st = S.status;
  if (st === "ended" || st === "expired") {
    root.append($("p", "big", st === "ended" ? "The poll has ended. Thank you!" : "This poll has expired."));
    return;
  }
  if (st === "waiting" || !S.question) {
    root.append($("p", "big", "You are in. Waiting for the teacher's first question…")); return;
  }
  const q = S.question;
  root.append($("p", "note", "Question " + q.number + " of " + q.of));
  root.append($("h1", "", q.text));
  const opts = $("div", "opts"), total = (S.counts || []).reduce((a, b) => a + b, 0);
  q.options.forEach((text, i) => {
    const b = $("button", "opt"); b.type = "button"; b.dataset.choice = i;
    if (S.mine === i) b.classList.add("mine");
    if (st === "revealed") {
      if (i === S.answer) b.classList.add("right");
      const bar = $("i", "bar"); bar.style.width = (total ? 100 * S.counts[i] / total : 0) + "%%"; b.append(bar);
      b.append($("span", "n", String(S.counts[i])));
    }
    b.append($("span", "", (st === "revealed" && i === S.answer ? "✓ " : "") + text +
                             (S.mine === i ? "  (you)" : "")));
    b.disabled = st !== "open" || busy;
    b.addEventListener("click", () => answer(i));
    opts.append(b);
  });
  root.append(opts);
  const note = st === "open" ? (S.mine == null ? "Tap your answer. You can change it until the reveal."
                                               : "Your answer is in. You can change it until the reveal.")
             : st === "closed" ? "Answers are closed. Wait for the reveal." : "";
  if (st === "revealed") {
    const right = S.counts[S.answer];
    root.append($("p", "note", right + " of " + total + " answered “" + q.options[S.answer] + "”, the right answer."));
    if (S.why) root.append($("div", "why", S.why));
  } else root.append($("p", "note", note));
  root.append($("p", "err", lastErr));
}
async function answer(i) {
  if (busy || S.status !== "open") return;
  busy = true; lastErr = ""; S.mine = i; render();
  try {
    const r = await fetch(HERE + "/answer", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({question: S.question.id, choice: i, device})});
    const body = await r.json();
    if (!r.ok) { lastErr = body.error || ("refused (" + r.status + ")"); }
    if (body.state) S = body.state;
  } catch (e) { lastErr = "No connection: your answer was not sent. Tap again."; }
  busy = false; render();
}
async function refresh() {
  try {
    const r = await fetch(HERE + "/state?device=" + encodeURIComponent(device), {cache: "no-store"});
    if (r.ok) {   // redraw only on a change that shows (a redraw under a finger can swallow its tap)
      const s = await r.json(), seen = JSON.stringify({...s, answered: 0});
      if (!busy && seen !== JSON.stringify({...S, answered: 0})) { S = s; render(); } else S.answered = s.answered;
    }
  } catch (e) {}
  if (S.status !== "ended" && S.status !== "expired") setTimeout(refresh, POLL_MS);
}
render(); refresh();
"""


def _page(title: str, body: str, script: str = "") -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body><main>{body}</main>"
            f"{f'<script>{script}</script>' if script else ''}</body></html>")


def student_page(state: dict) -> str:
    """The poll page for one code, drawn from `state` (`student_state` without a device) at once, then live."""
    code = state["code"]
    data = json.dumps(state).replace("</", "<\\/")
    script = SCRIPT % {"code": json.dumps(code), "poll_ms": POLL_MS, "state": data}
    body = (f"<header><span>Class poll · NanoSpec lesson</span><span>code <b>{html.escape(code)}</b></span></header>"
            "<div id='poll' aria-live='polite'></div>")
    return _page(f"Class poll {code}", body, script)


def join_page(error: str = "") -> str:
    """`/poll`: type the class code."""
    err = f"<p class='err'>{html.escape(error)}</p>" if error else "<p class='err'></p>"
    return _page("Join the class poll", "<form method='get'><label for='code'>Class code</label>"
                 "<input id='code' name='code' autocomplete='off' autocapitalize='characters' maxlength='12' "
                 f"required><button type='submit'>Join</button>{err}</form>")


def message_page(title: str, text: str, home: str = "/poll") -> str:
    """A clear page for an unknown or expired code (`home`: the page to type a code on)."""
    return _page(title, f"<div class='big'><h1>{html.escape(title)}</h1><p class='note'>{html.escape(text)}</p>"
                        f"<p><a href='{html.escape(home)}'>Type another code</a></p></div>")
