"""The app uses only the engine's public API: names `nanospec` exports, or documented submodules."""

import ast
from pathlib import Path

import nanospec

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "app").rglob("*.py")) + [ROOT / "app.py"]


def _nanospec_imports():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("nanospec"):
                yield path.relative_to(ROOT), node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("nanospec"):
                        yield path.relative_to(ROOT), alias.name, []


def test_app_imports_only_public_nanospec_names():
    seen = list(_nanospec_imports())
    assert seen, "the app should import the engine somewhere"
    for where, module, names in seen:
        assert not any(n.startswith("_") for n in names), f"{where} imports a private name from {module}: {names}"
        if module == "nanospec":
            private = {n for n in names if n not in nanospec.__all__ and f"`nanospec.{n}`" not in nanospec.__doc__}
            assert not private, f"{where}: {private} neither exported nor a documented submodule"
        else:
            assert f"`{module}`" in nanospec.__doc__, f"{where} imports {module}, which is not a documented submodule"
