"""What the browser tests share: where Chromium is, how it is launched, and the skip when it is not there.

`from tests.browser import browser` gives a test module the `browser` fixture (one headless Chromium per
module); `require_browser()` skips a fixture's module without Python playwright or Chromium. Chromium is
/usr/bin/chromium or $NANOSPEC_CHROMIUM; `playwright install` is never run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("NANOSPEC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def require_browser() -> None:
    pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (set NANOSPEC_CHROMIUM, or apt-get install -y chromium)")


@pytest.fixture(scope="module")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()
