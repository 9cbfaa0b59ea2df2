"""The app's developer tools (app/dev/) start the app from the repository, wherever they are called from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_dev_tools_find_the_repository():
    from app.dev import screenshot, served

    for module in (served, screenshot):
        assert module.ROOT == REPO and (module.ROOT / "app.py").is_file(), module.__name__
