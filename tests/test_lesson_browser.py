"""Headless Chromium walk through the Lesson tab: every chapter via "Next chapter", one screenshot each;
every chapter at 1280×720 and 1920×1080 in lesson-first mode (title, chart and step buttons on one
screen); the race.

Screenshots go to artifacts/lesson/ (gitignored). Needs Python `playwright` and a Chromium binary at
/usr/bin/chromium (or $NANOSPEC_CHROMIUM); skipped otherwise. Never runs `playwright install`.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "lesson"
CHROMIUM = os.environ.get("NANOSPEC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lesson_url():
    pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (set NANOSPEC_CHROMIUM)")
    from app.lesson import build_lesson_demo, lesson_data

    try:
        lesson_data()
    except FileNotFoundError as exc:
        pytest.skip(f"no recorded lesson traces: {exc}")
    demo = build_lesson_demo()
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


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


@pytest.mark.parametrize("width, height", [(1280, 720), (1920, 1080)])
def test_every_chapter_fits_one_screen_behind_a_chapter_link(lesson_url, browser, width, height):
    from app.lesson import CHAPTERS

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(lesson_url + "?chapter=1")
    page.wait_for_function("document.body.classList.contains('lesson-first')", timeout=15_000)
    for c in CHAPTERS:
        _chapter_heading(page, c.number)
        _answer_if_asked(page)
        _settle(page)
        assert page.evaluate("window.scrollY") == 0
        _inside(page, "#lesson-text h2", height)
        _inside(page, "#lesson-plot .js-plotly-plot", height)
        for button in ("#lesson-step-prev", "#lesson-step-next", "#lesson-play"):
            _inside(page, button, height)
        if c.race is not None:
            _inside(page, "#lesson-race .race", height)
        page.screenshot(path=str(SHOTS / f"fit-{width}x{height}-chapter-{c.number}.png"))
        if c.number < len(CHAPTERS):
            page.locator("#lesson-next-chapter").click()
    page.close()


def test_race_replays_the_recorded_runs(lesson_url, browser):
    from app.lesson import CHAPTERS

    race = next(c for c in CHAPTERS if c.race is not None)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(lesson_url + f"?chapter={race.number}")
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


def test_walk_all_chapters_with_next(lesson_url, browser):
    from app.lesson import CHAPTERS

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    t0 = time.perf_counter()
    page.goto(lesson_url)
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


def test_step_controls_move_the_highlight(lesson_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(lesson_url)
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


def test_deep_link_and_presenter_mode(lesson_url, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(lesson_url + "?chapter=5&presenter=1")
    _chapter_heading(page, 5)
    page.wait_for_function("document.querySelector('#lesson-root').classList.contains('presenter')",
                           timeout=10_000)
    _settle(page)
    page.screenshot(path=str(SHOTS / "chapter-5-presenter.png"), full_page=True)
    size = page.eval_on_selector("#lesson-text", "el => parseFloat(getComputedStyle(el).fontSize)")
    page.locator("#lesson-presenter input").uncheck()
    page.wait_for_function("!document.querySelector('#lesson-root').classList.contains('presenter')",
                           timeout=10_000)
    smaller = page.eval_on_selector("#lesson-text", "el => parseFloat(getComputedStyle(el).fontSize)")
    assert size > smaller
    page.close()
