"""Headless Chromium walk through the Lesson tab: every chapter via "Next chapter", one screenshot each;
the whole app opened by a chapter link at 1280×720 (presenter mode off and on) and by a presenter link
at 1920×1080: every chapter's heading, chart, step buttons and "Try it live" on the first screen, no
two chart labels overlapping or cut; presenter type measured (page text and the chart's SVG text); the race.

Screenshots go to artifacts/lesson/ (gitignored). Needs Python `playwright` and a Chromium binary at
/usr/bin/chromium (or $NANOSPEC_CHROMIUM); skipped otherwise. Never runs `playwright install`.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.browser import browser, require_browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "lesson"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _never_load(*args, **kwargs):
    raise AssertionError("the lesson must never load a model")


@pytest.fixture(scope="module")
def serve():
    """`serve("lesson")`: the URL of the Lesson tab alone; `serve("app")`: of the whole app (Live tab, Compare,
    Lesson with "Try it live") on a loader that refuses to load. Each is launched once, on a free local
    port, and closed after the module. Skipped without playwright, Chromium or the recorded traces."""
    require_browser()
    from app.lesson import build_lesson_demo, lesson_data
    from app.ui import build_app

    try:
        lesson_data()
    except FileNotFoundError as exc:
        pytest.skip(f"no recorded lesson traces: {exc}")
    builders = {"lesson": build_lesson_demo, "app": lambda: build_app(_never_load)}
    demos, urls = [], {}

    def url(kind: str) -> str:
        if kind not in urls:
            demo = builders[kind]()
            port = _free_port()
            demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
            demos.append(demo)
            urls[kind] = f"http://127.0.0.1:{port}/"
        return urls[kind]

    try:
        yield url
    finally:
        for demo in demos:
            demo.close()


def _chapter_heading(page, n: int, timeout: float = 15_000) -> None:
    page.locator("#lesson-text h2", has_text=f"Chapter {n} ·").wait_for(timeout=timeout)


def _settle(page) -> None:
    page.locator("#lesson-plot .js-plotly-plot").first.wait_for(timeout=15_000)
    page.wait_for_timeout(700)  # let Plotly finish drawing before the screenshot


def _answer_if_asked(page) -> None:
    """Chapters 2-8 ask first: click the first option and wait for the verdict and the chart."""
    page.wait_for_timeout(300)
    options = page.locator("#lesson-quiz input[type=radio]")
    if options.count() and options.first.is_visible():
        options.first.click()  # the answer hides the question at once: wait for the verdict, not the tick
        page.locator("#lesson-reveal .reveal").wait_for(timeout=15_000)
        page.locator("#lesson-text .provenance").wait_for(timeout=15_000)


def _inside(page, selector: str, height: int) -> tuple[float, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not shown"
    top, bottom = box["y"], box["y"] + box["height"]
    assert 0 <= top and bottom <= height + 1, f"{selector} spans {top:.0f}-{bottom:.0f} px, the screen is {height}"
    return top, bottom


def test_race_replays_the_recorded_runs(serve, browser):
    from app.lesson import CHAPTERS

    race = next(c for c in CHAPTERS if c.race is not None)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(serve("lesson") + f"?chapter={race.number}")
    _chapter_heading(page, race.number)
    lanes = page.locator("#lesson-race .race-lane")
    lanes.first.wait_for(timeout=15_000)
    assert lanes.count() == 3
    page.wait_for_function("document.querySelector('#lesson-race .race-clock').textContent !== '0.00 s'",
                           timeout=10_000)
    page.locator("#lesson-race .race-go[data-speed='4']").click()
    page.wait_for_function("document.querySelectorAll('#lesson-race .race-lane.done').length == 3", timeout=90_000)
    assert all("tok/s" in lanes.nth(i).inner_text() for i in range(3))
    page.screenshot(path=str(SHOTS / "race.png"))
    page.close()


def test_walk_all_chapters_with_next(serve, browser):
    from app.lesson import CHAPTERS

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    t0 = time.perf_counter()
    page.goto(serve("lesson"))
    _chapter_heading(page, 1)
    _settle(page)
    first_paint = time.perf_counter() - t0
    print(f"page open -> chapter 1 drawn: {first_paint:.2f} s")
    # generous: CI machines are shared; the lesson itself needs no model (see tests/test_lesson.py)
    assert first_paint < 20, f"the lesson took {first_paint:.1f} s to show chapter 1"
    for c in CHAPTERS:
        _chapter_heading(page, c.number)
        _answer_if_asked(page)
        _settle(page)
        assert "Real recorded trace" in page.locator("#lesson-text").inner_text()
        page.screenshot(path=str(SHOTS / f"chapter-{c.number}.png"), full_page=True)
        if c.number < len(CHAPTERS):
            page.locator("#lesson-next-chapter").click()
    page.close()


def test_step_controls_move_the_highlight(serve, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(serve("lesson"))
    _chapter_heading(page, 1)
    slider = page.locator("#lesson-step input[type=number]")
    before = int(slider.input_value())
    page.locator("#lesson-step-next").click()
    page.wait_for_function(f"document.querySelector('#lesson-step input[type=number]').value == '{before + 1}'",
                           timeout=10_000)
    page.locator("#lesson-text", has_text=f"Step {before + 1}:").wait_for(timeout=10_000)
    page.locator("#lesson-play").click()
    page.wait_for_function(f"Number(document.querySelector('#lesson-step input[type=number]').value) >= {before + 3}",
                           timeout=15_000)
    page.locator("#lesson-play").click()  # pause
    page.close()


# -- lesson first and presenter mode, measured --------------------------------------------------------
PRESENTER_TEXT_PX, PRESENTER_HEADING_PX, PRESENTER_CHART_PX = 24, 36, 18   # at 1920×1080

CHART_TEXT_JS = """() => {
  const frame = document.querySelector('#lesson-plot .main-svg').getBoundingClientRect();
  const kind = t => t.classList.contains('gtitle') ? 'title'
    : t.classList.contains('annotation-text') ? 'note or subplot title'
    : t.classList.contains('legendtext') ? 'legend entry'
    : t.classList.contains('bartext') ? 'bar label'
    : t.closest('g[class$="tick"]') ? 'tick label'
    : t.closest('g[class^="g-"][class$="title"]') ? 'axis title' : 'label';
  const out = [];
  for (const t of document.querySelectorAll('#lesson-plot svg text')) {
    const text = (t.textContent || '').trim();
    const r = t.getBoundingClientRect();
    if (!text || r.width === 0 || t.closest('.hoverlayer')) continue;
    out.push({kind: kind(t), text, size: parseFloat(getComputedStyle(t).fontSize),
              box: [r.left, r.top, r.right, r.bottom], frame: [frame.left, frame.top, frame.right, frame.bottom]});
  }
  return out;
}"""


def _px(page, selector: str) -> float:
    return page.eval_on_selector(selector, "el => parseFloat(getComputedStyle(el).fontSize)")


def _chart_texts(page) -> list[dict]:
    texts = page.evaluate(CHART_TEXT_JS)
    assert texts, "the chart drew no text"
    return texts


def _labels_apart(texts: list[dict], where: str) -> None:
    """No chart label cut by the chart's edge; no two titles, axis titles, tick labels or legend entries
    overlapping (bar labels may sit on a grid line, not on another label)."""
    for t in texts:
        l, top, r, bottom = t["box"]
        fl, ft, fr, fb = t["frame"]
        assert l >= fl - 1 and r <= fr + 1 and top >= ft - 1 and bottom <= fb + 1, \
            f"{where}: the {t['kind']} {t['text']!r} is cut by the chart's edge"
    apart = [t for t in texts if t["kind"] != "label"]   # node labels (trees, chains) sit in their markers
    for i, a in enumerate(apart):
        for b in apart[i + 1:]:
            ax0, ay0, ax1, ay1 = a["box"]
            bx0, by0, bx1, by1 = b["box"]
            overlap_x, overlap_y = min(ax1, bx1) - max(ax0, bx0), min(ay1, by1) - max(ay0, by0)
            assert overlap_x <= 2 or overlap_y <= 2, \
                f"{where}: the {a['kind']} {a['text']!r} and the {b['kind']} {b['text']!r} overlap"


def _walk(page, height: int, name: str, check=None) -> None:
    """Every chapter from the one open now, by "Next chapter": heading, chart, step buttons, the race and
    the button the text names on the first screen; chart labels apart; `check(page, chapter)` on top."""
    from app.lesson import CHAPTERS

    for c in CHAPTERS:
        _chapter_heading(page, c.number)
        _answer_if_asked(page)
        _settle(page)
        assert page.evaluate("window.scrollY") == 0
        _inside(page, "#lesson-text h2", height)
        _inside(page, "#lesson-plot .js-plotly-plot", height)
        for button in ("#lesson-step-prev", "#lesson-step-next", "#lesson-play"):
            _inside(page, button, height)
        if "Try it live" in c.idea:
            _inside(page, "#lesson-try", height)
        if c.race is not None:
            _inside(page, "#lesson-race .race", height)
        _labels_apart(_chart_texts(page), f"{name}, chapter {c.number}")
        if check is not None:
            check(page, c)
        page.screenshot(path=str(SHOTS / f"{name}-chapter-{c.number}.png"))
        if c.number < len(CHAPTERS):
            page.locator("#lesson-next-chapter").click()


@pytest.mark.parametrize("presenter", [False, True], ids=["desk", "presenter"])
def test_every_chapter_fits_the_first_screen_at_720p(serve, browser, presenter):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(serve("app") + "?chapter=1" + ("&presenter=1" if presenter else ""))
    page.wait_for_function("document.body.classList.contains('lesson-first')", timeout=15_000)
    assert page.evaluate("document.body.classList.contains('lesson-presenter')") is presenter
    _walk(page, 720, f"fit-1280x720-{'presenter' if presenter else 'desk'}")
    page.close()


def _presenter_sizes(page, c) -> None:
    where = f"presenter 1920x1080, chapter {c.number}"
    assert _px(page, "#lesson-text h2") >= PRESENTER_HEADING_PX, where
    for selector in ("#lesson-text p", "#lesson-text .prose"):
        assert _px(page, selector) >= PRESENTER_TEXT_PX, f"{where}: {selector}"
    assert _px(page, "#lesson-text .provenance") >= PRESENTER_CHART_PX, f"{where}: the recorded-trace note"
    small = [t for t in _chart_texts(page) if t["size"] < PRESENTER_CHART_PX]
    assert not small, f"{where}: chart text under {PRESENTER_CHART_PX} px: {small[:3]}"


def test_presenter_mode_from_its_link(serve, browser):
    """`?presenter=1` opens the app in presenter mode, type already large: no un-tick and re-tick."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    page.goto(serve("app") + "?presenter=1")
    _chapter_heading(page, 1)
    page.wait_for_function("document.body.classList.contains('lesson-presenter')", timeout=10_000)
    assert page.locator("#lesson-presenter input").is_checked()
    # the first question (chapter 2) as the class reads it: large, and the colour of the text
    page.locator("#lesson-next-chapter").click()
    _chapter_heading(page, 2)
    question = "#lesson-quiz [data-testid=block-info]"
    page.locator(question).wait_for(timeout=15_000)
    assert _px(page, question) >= PRESENTER_TEXT_PX
    colors = page.evaluate(f"""() => [getComputedStyle(document.querySelector('{question}')).color,
                                      getComputedStyle(document.querySelector('#lesson-text p')).color]""")
    assert colors[0] == colors[1], f"the question is drawn in {colors[0]}, the text in {colors[1]}"
    page.locator("#lesson-prev-chapter").click()
    _walk(page, 1080, "presenter-1920x1080", _presenter_sizes)
    # presenter off: back to the desk sizes, chart included
    page.locator("#lesson-presenter input").uncheck()
    page.wait_for_function("!document.body.classList.contains('lesson-presenter')", timeout=10_000)
    page.wait_for_timeout(1000)
    assert _px(page, "#lesson-text p") < PRESENTER_TEXT_PX
    assert max(t["size"] for t in _chart_texts(page)) < PRESENTER_CHART_PX
    page.close()
