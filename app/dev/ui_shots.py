"""Screenshots of the views a newcomer, a phone and a projector see, for a person to look at.

    python -m app.dev.ui_shots [--out /tmp/ui_shots] [--max-new-tokens 12] [--no-run]

Launches the app as `python app.py` does (the pair picker, on the offline default pair) and writes: the
first screen at 1280×720 and on a phone (390×844), Live after a short run (1280×720 and 390×844), Compare
after a short comparison, lesson chapters 1, 6 and 12 at 1280×720, and presenter mode (?presenter=1) at
1920×1080. Nothing is timed or checked here: the
browser tests (tests/test_app_first_screen.py, tests/test_lesson_browser.py) do the checking.
Needs Debian's `chromium` and `pip install playwright` (no `playwright install`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from app.dev.screenshot import CHROMIUM_ARGS


def _example(page, text: str) -> None:
    box = page.locator("#prompt textarea")
    for _ in range(10):  # a click before the page's handlers attach is lost
        page.get_by_text(text, exact=False).first.click()
        page.wait_for_timeout(300)
        if box.input_value().strip():
            return


def _tokens(page, n: int) -> None:
    page.get_by_text("Tree, sampling and vocabulary settings").first.click()
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(n))
    box.press("Enter")


class Shots:
    """Screenshots into one folder, each after the page has settled."""

    def __init__(self, out: Path):
        self.out, self.paths = out, []

    def __call__(self, page, name: str, full: bool = False) -> None:
        page.wait_for_timeout(800)
        path = self.out / f"{name}.png"
        page.screenshot(path=str(path), full_page=full)
        self.paths.append(path)


def _page(browser, url: str, width: int, height: int, query: str = ""):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(600_000)
    page.goto(url + query, wait_until="load")
    return page


def first_screens(browser, url: str, shot: Shots) -> None:
    """The first screen at 1280x720 and on a phone (390x844, also the whole page)."""
    for name, size in (("first-1280x720", (1280, 720)), ("phone-390x844", (390, 844))):
        page = _page(browser, url, *size)
        page.locator("#run-btn").wait_for(state="visible")
        shot(page, name)
        if name.startswith("phone"):
            shot(page, name + "-full", full=True)
        page.close()


def live_and_compare(browser, url: str, shot: Shots, run: bool, max_new_tokens: int) -> None:
    """Live after a short run (1280x720: the first screen and the whole page; then on a phone) and Compare
    after a short comparison; without `run`, the Compare tab as it opens."""
    page = _page(browser, url, 1280, 720)
    page.locator("#run-btn").wait_for(state="visible")
    if not run:
        page.locator("button[role=tab]", has_text="Compare").click()
        shot(page, "compare", full=True)
        page.close()
        return
    _example(page, "qa:")
    _tokens(page, max_new_tokens)
    page.locator("#run-btn").click()
    page.locator("#json-btn:not([disabled])").first.wait_for()
    page.locator("#kpis").scroll_into_view_if_needed()
    shot(page, "live-after-run-1280x720")
    shot(page, "live-after-run", full=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("#kpis").scroll_into_view_if_needed()
    shot(page, "live-after-run-390x844")
    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("button[role=tab]", has_text="Compare").click()
    page.locator("#compare-btn").click()
    page.locator("#compare-verdict h3", has_text="nanospec").wait_for()  # the verdict names the last method
    shot(page, "compare-after-run", full=True)
    page.close()


def lesson_views(browser, url: str, shot: Shots) -> None:
    """Lesson chapters 1, 6 and 12 at 1280x720 (a predict question answered), then presenter mode."""
    for chapter in (1, 6, 12):
        page = _page(browser, url, 1280, 720, f"?chapter={chapter}")
        page.locator("#lesson-text h2", has_text=f"Chapter {chapter} ·").wait_for(timeout=30_000)
        options = page.locator("#lesson-quiz input[type=radio]")
        page.wait_for_timeout(500)
        if options.count() and options.first.is_visible():
            options.first.click()
            page.locator("#lesson-reveal .reveal").wait_for(timeout=15_000)
        shot(page, f"lesson-chapter-{chapter}-1280x720")
        page.close()
    page = _page(browser, url, 1920, 1080, "?presenter=1")
    page.locator("#lesson-text h2", has_text="Chapter 1 ·").wait_for(timeout=30_000)
    shot(page, "presenter-1920x1080-chapter-1")
    page.goto(url + "?presenter=1&chapter=12", wait_until="load")
    page.locator("#lesson-text h2", has_text="Chapter 12 ·").wait_for(timeout=30_000)
    page.wait_for_timeout(3000)
    shot(page, "presenter-1920x1080-chapter-12")
    page.close()


def take(out: Path, max_new_tokens: int, run: bool) -> list[Path]:
    """Launch the app as `python app.py` builds it (the pair picker over the presets) and take every view."""
    from playwright.sync_api import sync_playwright

    from app.pairs import preset_provider
    from app.ui import build_app

    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    demo = build_app(provider=preset_provider())
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    shot = Shots(out)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            first_screens(browser, url, shot)
            live_and_compare(browser, url, shot, run, max_new_tokens)
            lesson_views(browser, url, shot)
            browser.close()
    finally:
        demo.close()
    return shot.paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.dev.ui_shots", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/ui_shots")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--no-run", action="store_true", help="no model: first screens, Compare and the lesson only")
    a = ap.parse_args(argv)
    for path in take(Path(a.out), a.max_new_tokens, not a.no_run):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
