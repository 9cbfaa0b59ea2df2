"""The Lesson tab's CSS and the few lines of browser JavaScript it needs (no logic lives here).

Lesson-first mode (`body.lesson-first`): in presenter mode or when the page was opened through a
chapter link, the app's Live header (anything with the class `live-header`) collapses and the
lesson takes the page; "Live controls" brings the header back with one click. Presenter mode
(`body.lesson-presenter`, set by `?presenter=1` before the first chapter is drawn and by the checkbox)
sizes the type for a room: every size is one CSS variable on `#lesson-root`, set per mode.
"""

LIVE_HEADER = "live-header"   # the class app/ui.py puts on the Live header (title, prompt, method, knobs)

CSS = """
/* sizes: one set of variables per mode (desk, lesson first, presenter); the rules below only use them.
   Ids beat Gradio's own `.prose` / block-info rules, which otherwise win over a class. */
#lesson-root { width: 100%; --lesson-text: 1.05rem; --lesson-h: 1.6rem; --lesson-small: 0.82rem;
  --lesson-ui: 1rem; --lesson-tokens: 0.95rem; }
body.lesson-first #lesson-root { --lesson-text: clamp(14px, 2.05vh, 26px); --lesson-h: clamp(18px, 2.9vh, 36px);
  --lesson-small: clamp(11px, 1.45vh, 18px); --lesson-ui: clamp(13px, 1.75vh, 22px);
  --lesson-tokens: clamp(13px, 1.8vh, 22px); }
body.lesson-presenter #lesson-root { --lesson-text: clamp(16px, 2.3vh, 32px); --lesson-h: clamp(22px, 3.5vh, 48px);
  --lesson-small: clamp(13px, 1.75vh, 24px); --lesson-ui: clamp(14px, 1.8vh, 24px);
  --lesson-tokens: clamp(14px, 2vh, 26px); }
/* presenter mode: nothing a room reads is under ~18 px at 1080 px (tabs, slider bounds, the race lanes) */
body.lesson-presenter .tab-wrapper button, body.lesson-presenter [role=tablist] button {
  font-size: clamp(14px, 1.8vh, 24px) !important; }
body.lesson-presenter #lesson-root .min_value, body.lesson-presenter #lesson-root .max_value,
body.lesson-presenter #lesson-root .race, body.lesson-presenter #lesson-root .race-text,
body.lesson-presenter #lesson-root .race-stats, body.lesson-presenter #lesson-root .race-go,
body.lesson-presenter #lesson-root .tokens-head, body.lesson-presenter #lesson-root .race-caption {
  font-size: var(--lesson-ui); }
body.lesson-presenter #lesson-root .race-clock { font-size: calc(1.4 * var(--lesson-ui)); }
body.lesson-presenter #lesson-root .race-lane { grid-template-columns: 6.5em 1fr 15em; }
#lesson-style, #lesson-fit { display: none !important; }
#lesson-root #lesson-text, #lesson-root #lesson-text .prose, #lesson-root #lesson-text p,
#lesson-root #lesson-text li { font-size: var(--lesson-text); line-height: 1.45; }
#lesson-root #lesson-text h2 { font-size: var(--lesson-h); line-height: 1.15; margin-top: 0.1em; margin-bottom: 0.3em; }
#lesson-root #lesson-text p { margin: 0.35em 0; }
#lesson-root #lesson-text code, #lesson-root #lesson-text pre { font-size: 0.85em; }
#lesson-root #lesson-text .provenance { margin-top: 0.6em; padding: 4px 8px; border-left: 4px solid #9b7fc7;
  background: rgba(155,127,199,0.08); font-size: var(--lesson-small); line-height: 1.35; border-radius: 4px; }
#lesson-root #lesson-text .provenance code { font-size: 1em; }
body.lesson-presenter #lesson-root #lesson-text code { font-size: 1em; }
#lesson-root .lesson-tokens { font-size: var(--lesson-tokens); line-height: 1.9; }
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
/* the question is read out to the class: body-size, body-colour type, not a grey caption */
#lesson-root #lesson-quiz { padding: 6px 8px !important; }
#lesson-root #lesson-quiz .wrap { gap: 4px !important; }
#lesson-root #lesson-quiz [data-testid=block-info] { font-size: var(--lesson-text); line-height: 1.4;
  color: var(--body-text-color); font-weight: 600; }
#lesson-root #lesson-quiz label, #lesson-root #lesson-quiz label span { font-size: var(--lesson-text); }
#lesson-root #lesson-reveal, #lesson-root #lesson-reveal .prose, #lesson-root #lesson-reveal p {
  font-size: var(--lesson-text); }
#lesson-root button, #lesson-root #lesson-bar input, #lesson-root #lesson-presenter span,
#lesson-root #lesson-step [data-testid=block-info], #lesson-root #lesson-step input,
#lesson-root #lesson-speed input, #lesson-root #lesson-speed [data-testid=block-info] { font-size: var(--lesson-ui); }
/* the step slider's label wraps instead of being cut ("… prefill … 26)"); its number box holds 3 digits, so the
   label keeps the rest of the line */
#lesson-root #lesson-step [data-testid=block-info] { white-space: normal; overflow: visible; text-overflow: clip; }
#lesson-root #lesson-step input[type=number] { width: 3.6em; min-width: 0; flex: none; }
#lesson-bar { align-items: end; gap: 8px; }
#lesson-bar button, #lesson-controls button { white-space: nowrap; min-width: fit-content !important; }
#lesson-controls { align-items: center; gap: 6px; }
#lesson-live-toggle { display: none; }
body.lesson-presenter .gradio-container, body.lesson-presenter main { max-width: 100% !important; }

/* lesson first: the Live header collapses, the lesson fills one screen */
body.lesson-first:not(.show-live) .LIVE { display: none !important; }
body.lesson-first #lesson-live-toggle { display: inline-flex; }
body.lesson-first .gradio-container, body.lesson-first main { max-width: 100% !important;
  padding-top: 4px !important; padding-bottom: 0 !important; }
body.lesson-first footer { display: none !important; }
body.lesson-first #lesson-root .tokens-body { max-height: 3.8em; }
body.lesson-first #lesson-root #lesson-text .provenance { margin-top: 0.3em; }
#lesson-root .reveal { padding: 6px 10px; border-left: 4px solid #2e9d5b; background: rgba(46,157,91,0.08);
  border-radius: 4px; }
""".replace(".LIVE", "." + LIVE_HEADER)

# js preprocessors: they hand the server the height the lesson may fill (0 = not lesson-first)
FIT = "(document.body.classList.contains('lesson-first') ? window.innerHeight : 0)"

DEEP_LINK_JS = """(prompt, fit) => {
  const q = new URLSearchParams(window.location.search);
  const presenter = ['1', 'true', 'yes', 'on'].includes((q.get('presenter') || '').toLowerCase());
  const chapter = parseInt(q.get('chapter') || '', 10);
  if (presenter || chapter >= 1) document.body.classList.add('lesson-first');
  if (presenter) document.body.classList.add('lesson-presenter');  // applied before the first paint of the chapter
  return [prompt, FIT];
}""".replace("FIT", FIT)

PRESENTER_JS = """(on) => {
  const root = document.querySelector('#lesson-root');
  if (root) root.classList.toggle('presenter', !!on);
  document.body.classList.toggle('lesson-presenter', !!on);
  if (on) document.body.classList.add('lesson-first');
  return on;
}"""

# presenter on puts the lesson first, so the chart fits the window from this click on
PRESENTER_FIT_JS = "(n, p, s, on, f, pend) => [n, p, s, on, on ? window.innerHeight : FIT, pend]".replace("FIT", FIT)

LIVE_TOGGLE_JS = """() => { document.body.classList.toggle('show-live'); }"""


def with_fit(n_inputs: int) -> str:
    """A js preprocessor for an event whose last input is the `fit` number: refresh it from the page."""
    return f"(...a) => {{ a[{n_inputs - 1}] = {FIT}; return a; }}"
