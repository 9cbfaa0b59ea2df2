"""The README stays true to the repository: its commands are CI's, its layout is the tree, its links resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_quick_start_commands_are_what_ci_runs():
    commands = [line for line in _section("Quick start").splitlines() if line.startswith("pip install")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands:
        for part in command.split(" && "):
            if part.startswith("pip install"):
                assert part.replace("pip install", "python3 -m pip install -q") in ci, f"{part!r} is not what .ci/run does"
    test_command = commands[1].split(" && ")[-1]
    assert re.search(rf"^{re.escape(test_command)}$", ci, flags=re.M), f".ci/run must run {test_command!r}"


def _engine_modules() -> list[str]:
    names = [p.name for p in (ROOT / "nanospec").glob("*.py") if p.stem != "__init__"]
    return names + [f"{p.parent.name}/" for p in (ROOT / "nanospec").glob("*/__init__.py")]


def test_layout_section_names_every_engine_module():
    layout = _section("Layout")
    missing = [n for n in _engine_modules() if not re.search(rf"(?<![\w/]){re.escape(n)}", layout)]
    assert not missing, f"README's Layout section does not mention {missing}"
    for folder in ("nanospec/", "app/", "assets/", "docs/", "tests/", "app.py"):
        assert folder in layout and (ROOT / folder.rstrip("/")).exists()


def test_design_code_map_names_every_engine_module():
    text = (ROOT / "docs" / "design.md").read_text()
    code_map = text[text.index("## 1. Shape of the code"):text.index("## 2.")]
    missing = [n for n in _engine_modules() if not re.search(rf"(?<![\w/]){re.escape(n)}", code_map)]
    assert not missing, f"docs/design.md's code map does not mention {missing}"


def test_relative_links_resolve():
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not re.match(r"[a-z]+:", target):
                assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
