"""Screenshots of the views a newcomer, a phone and a projector see, for a person to look at.

    python -m app.dev.ui_shots [--out /tmp/ui_shots] [--max-new-tokens 12] [--no-run]

Launches the app on the offline default pair and writes: the first screen at 1280×720 and on a phone
(390×844), Live after a short run, Compare after a short comparison, lesson chapters 1, 6 and 12 at
1280×720, and presenter mode (?presenter=1) at 1920×1080. Nothing is timed or checked here: the
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


def take(out: Path, max_new_tokens: int, run: bool) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from app.models import pair_loader
    from app.ui import build_app

    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    demo = build_app(pair_loader())
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    shots = []

    def shot(page, name: str, full: bool = False) -> None:
        page.wait_for_timeout(800)
        path = out / f"{name}.png"
        page.screenshot(path=str(path), full_page=full)
        shots.append(path)

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            for name, size in (("first-1280x720", (1280, 720)), ("phone-390x844", (390, 844))):
                page = browser.new_page(viewport={"width": size[0], "height": size[1]})
                page.goto(url, wait_until="load")
                page.locator("#run-btn").wait_for(state="visible")
                shot(page, name)
                if name.startswith("phone"):
                    shot(page, name + "-full", full=True)
                page.close()
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.set_default_timeout(600_000)
            page.goto(url, wait_until="load")
            page.locator("#run-btn").wait_for(state="visible")
            if run:
                _example(page, "qa:")
                _tokens(page, max_new_tokens)
                page.locator("#run-btn").click()
                page.locator("#json-btn:not([disabled])").first.wait_for()
                shot(page, "live-after-run", full=True)
                page.locator("button[role=tab]", has_text="Compare").click()
                page.locator("#compare-btn").click()
                page.locator("#compare-table").get_by_text("nanospec").first.wait_for()
                shot(page, "compare-after-run", full=True)
            else:
                page.locator("button[role=tab]", has_text="Compare").click()
                shot(page, "compare", full=True)
            page.close()
            for chapter in (1, 6, 12):
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(url + f"?chapter={chapter}", wait_until="load")
                page.locator("#lesson-text h2", has_text=f"Chapter {chapter} ·").wait_for(timeout=30_000)
                options = page.locator("#lesson-quiz input[type=radio]")
                page.wait_for_timeout(500)
                if options.count() and options.first.is_visible():
                    options.first.click()
                    page.locator("#lesson-reveal .reveal").wait_for(timeout=15_000)
                shot(page, f"lesson-chapter-{chapter}-1280x720")
                page.close()
            page = browser.new_page(viewport={"width": 1920, "height": 1080})
            page.goto(url + "?presenter=1", wait_until="load")
            page.locator("#lesson-text h2", has_text="Chapter 1 ·").wait_for(timeout=30_000)
            shot(page, "presenter-1920x1080-chapter-1")
            page.goto(url + "?presenter=1&chapter=12", wait_until="load")
            page.locator("#lesson-text h2", has_text="Chapter 12 ·").wait_for(timeout=30_000)
            page.wait_for_timeout(3000)
            shot(page, "presenter-1920x1080-chapter-12")
            page.close()
            browser.close()
    finally:
        demo.close()
    return shots


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
