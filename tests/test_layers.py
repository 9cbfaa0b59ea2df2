"""Imports point one way: runtime <- tools <- app (nanospec/dev/layers.py, which reads the code with `ast`).

The repository itself must have no import cycle between components or modules, no upward import
(type-only imports included), no module over 400 lines, and a code map in docs/design.md that names
every component in its layer's block. The checker is also run as a plain command from outside the
repository, on the repository and on a small made-up one whose violations it must find."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nanospec.dev import layers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "nanospec" / "dev" / "layers.py"


def _found(kind: str) -> list[str]:
    return [v for v in layers.violations(ROOT) if v.startswith(f"{kind}:")]


def test_every_module_has_a_layer():
    assert not _found("layer")


def test_no_import_cycle():
    assert not _found("cycle")


def test_no_upward_import():
    assert not _found("upward")


def test_no_module_over_400_lines():
    assert not _found("size")


def test_design_code_map_names_each_component_in_its_layer():
    assert not _found("docs")


def _tiny_repo(tmp: Path, design: str, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    (tmp / "docs").mkdir(exist_ok=True)
    (tmp / "docs" / "design.md").write_text(f"## 1. Shape of the code\n```\n{design}\n```\n## 2. Next\n")
    return tmp


CLEAN = {
    "nanospec/__init__.py": "",
    "nanospec/config.py": "X = 1\n",
    "nanospec/decoding/__init__.py": "",
    "nanospec/decoding/engine.py": "from nanospec.config import X\n",
    "nanospec/bench/__init__.py": "",
    "nanospec/bench/compare.py": "from nanospec.decoding import engine\n",
    "app/__init__.py": "",
    "app/ui.py": "import nanospec.bench.compare\n",
}
MAP = "[runtime]\n config.py decoding/\n[tools]\n bench/\n[app]\n ui.py\n"


def _run(root: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_the_command_passes_a_clean_tree_from_outside(tmp_path):
    root = _tiny_repo(tmp_path / "repo", MAP, CLEAN)
    done = _run(root, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_the_command_finds_each_kind_of_violation(tmp_path):
    files = {
        **CLEAN,
        # a type-only upward import: runtime -> tools
        "nanospec/config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nanospec.bench.compare import Y\n",
        # tools -> app, inside a function
        "nanospec/bench/compare.py": "from nanospec.decoding import engine\n\ndef f():\n    from app import ui\n",
        "nanospec/decoding/big.py": "x = 1\n" * 401,
        "nanospec/stray.py": "",
    }
    root = _tiny_repo(tmp_path / "repo", MAP.replace(" bench/\n", "\n"), files)
    done = _run(root, tmp_path)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "upward: nanospec/config.py:3: runtime imports tools" in out
    assert "upward: nanospec/bench/compare.py:4: tools imports app" in out
    assert "cycle: between components app.ui <-> nanospec.bench <-> nanospec.config <-> nanospec.decoding" in out
    assert "cycle: between modules" in out
    assert "size: nanospec/decoding/big.py has 401 lines" in out
    assert "layer: nanospec/stray.py has none" in out
    assert "does not name bench/ (nanospec.bench) in its [tools] block" in out


def test_the_command_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    done = _run(tmp_path, tmp_path)
    assert done.returncode == 2 and "not the repository's root" in done.stderr
