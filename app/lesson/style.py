"""The Lesson tab's CSS and the few lines of browser JavaScript it needs (no logic lives here).

Lesson-first mode (`body.lesson-first`): in presenter mode or when the page was opened through a
chapter link, the app's Live header (anything with the class `live-header`) collapses and the
lesson takes the page; "Live controls" brings the header back with one click.
"""

LIVE_HEADER = "live-header"   # the class app/ui.py puts on the Live header (title, prompt, method, knobs)

CSS = """
#lesson-root { width: 100%; }
#lesson-style, #lesson-fit { display: none !important; }
#lesson-root .lesson-text { font-size: 1.05rem; line-height: 1.5; }
#lesson-root .lesson-text h2 { margin-top: 0.1em; margin-bottom: 0.3em; }
#lesson-root .lesson-text p { margin: 0.35em 0; }
#lesson-root .provenance { margin-top: 0.6em; padding: 4px 8px; border-left: 4px solid #9b7fc7;
  background: rgba(155,127,199,0.08); font-size: 0.78em; line-height: 1.35; border-radius: 4px; }
#lesson-root .lesson-tokens { font-size: 0.95rem; line-height: 1.9; }
#lesson-root .tokens-head { font-size: 0.85em; opacity: 0.85; margin-bottom: 4px; }
#lesson-root .tokens-body { max-height: 12em; overflow-y: auto; }
#lesson-root .tok { background: color-mix(in srgb, var(--c) 22%, transparent); border-bottom: 3px solid var(--c);
  border-radius: 3px; padding: 1px 1px; white-space: pre-wrap; }
#lesson-root .tok.now { outline: 2.5px solid #111; outline-offset: 1px;
  background: color-mix(in srgb, var(--c) 45%, transparent); }
#lesson-root .tok.later { opacity: 0.25; }
#lesson-root .key { margin-left: 10px; border-bottom: 3px solid var(--c); padding: 0 3px; }
#lesson-root .predict { padding: 6px 10px; border-left: 4px solid #e8743b; background: rgba(232,116,59,0.08);
  border-radius: 4px; }
#lesson-quiz { padding: 6px 8px !important; }
#lesson-quiz .wrap { gap: 4px !important; }
#lesson-reveal { font-size: 1rem; }
#lesson-bar { align-items: end; gap: 8px; }
#lesson-bar button, #lesson-controls button { white-space: nowrap; }
#lesson-controls { align-items: center; gap: 6px; }
#lesson-live-toggle { display: none; }
#lesson-root.presenter .lesson-text { font-size: 1.5rem; }
#lesson-root.presenter .lesson-tokens { font-size: 1.35rem; }
#lesson-root.presenter button { font-size: 1.2rem; }
#lesson-root.presenter label, #lesson-root.presenter span { font-size: 1.1rem; }
body:has(#lesson-root.presenter) .gradio-container,
body:has(#lesson-root.presenter) main { max-width: 100% !important; }

/* lesson first: the Live header collapses, the lesson fills one screen */
body.lesson-first:not(.show-live) .LIVE { display: none !important; }
body.lesson-first #lesson-live-toggle { display: inline-flex; }
body.lesson-first .gradio-container, body.lesson-first main { max-width: 100% !important;
  padding-top: 4px !important; padding-bottom: 0 !important; }
body.lesson-first footer { display: none !important; }
body.lesson-first #lesson-root .lesson-text { font-size: clamp(14px, 2.05vh, 26px); }
body.lesson-first #lesson-root .lesson-tokens { font-size: clamp(13px, 1.8vh, 22px); }
body.lesson-first #lesson-root.presenter .lesson-text { font-size: clamp(15px, 2.3vh, 30px); }
body.lesson-first #lesson-root .tokens-body { max-height: 5.5em; }
body.lesson-first #lesson-root.presenter label, body.lesson-first #lesson-root.presenter span,
body.lesson-first #lesson-root.presenter button { font-size: clamp(13px, 1.75vh, 22px); }
body.lesson-first #lesson-reveal { font-size: clamp(13px, 1.8vh, 22px); }
body.lesson-first #lesson-root .provenance { font-size: 0.68em; margin-top: 0.3em; }
#lesson-root .reveal { padding: 6px 10px; border-left: 4px solid #2e9d5b; background: rgba(46,157,91,0.08);
  border-radius: 4px; }
#lesson-bar .wrap, #lesson-bar input { font-size: 1rem; }
""".replace(".LIVE", "." + LIVE_HEADER)

# js preprocessors: they hand the server the height the lesson may fill (0 = not lesson-first)
FIT = "(document.body.classList.contains('lesson-first') ? window.innerHeight : 0)"

DEEP_LINK_JS = """(prompt, fit) => {
  const q = new URLSearchParams(window.location.search);
  const presenter = ['1', 'true', 'yes', 'on'].includes((q.get('presenter') || '').toLowerCase());
  const chapter = parseInt(q.get('chapter') || '', 10);
  if (presenter || chapter >= 1) document.body.classList.add('lesson-first');
  return [prompt, FIT];
}""".replace("FIT", FIT)

PRESENTER_JS = """(on) => {
  const root = document.querySelector('#lesson-root');
  if (root) root.classList.toggle('presenter', !!on);
  if (on) document.body.classList.add('lesson-first');
  return on;
}"""

# presenter on puts the lesson first, so the chart fits the window from this click on
PRESENTER_FIT_JS = "(n, p, s, on, f, pend) => [n, p, s, on, on ? window.innerHeight : FIT, pend]".replace("FIT", FIT)

LIVE_TOGGLE_JS = """() => { document.body.classList.toggle('show-live'); }"""


def with_fit(n_inputs: int) -> str:
    """A js preprocessor for an event whose last input is the `fit` number: refresh it from the page."""
    return f"(...a) => {{ a[{n_inputs - 1}] = {FIT}; return a; }}"
