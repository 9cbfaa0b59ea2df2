"""The package and the app import without cycles, and no module reaches another's private names.

Static (ast, nothing imported): every `import` / `from ... import`, at module level or inside a
function, is an edge of the module graph of `nanospec/` and `app/`. A cycle there, or a name `_x`
imported from another module of the project, fails the test with the modules involved."""

from __future__ import annotations

from pathlib import Path

from nanospec.dev.layers import cycles, imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nanospec", "app")
# no exceptions: an import cycle or a private name imported across modules fails
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    private = []
    for name, path in known.items():
        for target, imported, line in imports(name, path, known):
            if target != name and not target.startswith(name + "."):
                edges[name].add(target)
            if imported and imported.startswith("_") and not imported.startswith("__") and target != name \
                    and (name, target, imported) not in KNOWN_PRIVATE:
                private.append(f"{path.relative_to(ROOT)}:{line} imports {imported} from {target}")
    return edges, private


def test_no_import_cycles():
    found = [sorted(c) for c in cycles(graph()[0]) if frozenset(c) not in KNOWN_CYCLES]
    assert not found, f"import cycles: {found}"


def test_no_private_names_across_modules():
    assert not graph()[1], "private names imported across modules:\n" + "\n".join(graph()[1])


def test_the_checker_sees_cycles_and_private_imports(tmp_path):
    """A cycle through three modules is found, a chain is not; relative imports, submodule imports and
    private names are read as such."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    source = pkg / "user.py"
    source.write_text("from . import helpers\nfrom .helpers import _hidden, shown\n\ndef f():\n    import pkg.other\n")
    known = {"pkg.helpers": source, "pkg.other": source, "pkg.user": source}
    assert imports("pkg.user", source, known) == [("pkg.helpers", None, 1), ("pkg.helpers", "_hidden", 2),
                                                  ("pkg.helpers", "shown", 2), ("pkg.other", None, 5)]
