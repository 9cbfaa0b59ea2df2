"""Which way imports point: the runtime below the tools below the app, nothing upward, no cycles.

Every module of `nanospec/` and `app/` belongs to one component (a top-level module or a package,
`COMPONENTS`; the longest matching name wins; in the app each top-level module or package) and every
component to a layer:

    runtime   the engine and what it stands on: decoding, drafters, heads, vocabulary policies,
              loaders, options, events, metrics, data (prompt sets, frequency tables)
    tools     offline jobs on top of the runtime: bench, lesson recording, training, serving
              (vLLM), the CLI, these developer checks
    app       the Gradio explorer

Imports are read with `ast`, nothing is imported or run: every `import` and `from ... import`,
at module level, inside a function or under `if TYPE_CHECKING:` (a type-only import counts too).
A violation is an import cycle between components or between modules, an import from a lower
layer into a higher one, a module over `MAX_LINES` lines, or a component that docs/design.md's
code map does not name in its layer's block (a line `[runtime]`, `[tools]` or `[app]` opens
each block).

    python -m nanospec.dev.layers [REPO_ROOT]      (or: python path/to/layers.py REPO_ROOT)

prints one line per violation, led by its kind (`cycle`, `upward`, `size`, `docs`, `layer`: a module
no component covers), and exits 1 when there is any, 0 otherwise. Standard library only,
so it runs from outside the repository and without the project's dependencies.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGES = ("nanospec", "app")
LAYERS = ("runtime", "tools", "app")
MAX_LINES = 400
# component -> layer; a module belongs to the longest component that is it or contains it
COMPONENTS = {
    "nanospec": "runtime",  # the package's public face (nanospec/__init__.py)
    "nanospec.config": "runtime", "nanospec.options": "runtime", "nanospec.events": "runtime",
    "nanospec.metrics": "runtime", "nanospec.timing": "runtime", "nanospec.transfer": "runtime",
    "nanospec.vocab": "runtime", "nanospec.precision": "runtime", "nanospec.pair": "runtime",
    "nanospec.presets": "runtime", "nanospec.hub": "runtime", "nanospec.paths": "runtime",
    "nanospec.decoding": "runtime", "nanospec.heads": "runtime", "nanospec.loaders": "runtime",
    "nanospec.data": "runtime", "nanospec.retrieval": "runtime",
    "nanospec.retrieval.build": "tools", "nanospec.retrieval.bench": "tools",
    "nanospec.bench": "tools", "nanospec.lesson": "tools", "nanospec.training": "tools",
    "nanospec.serving": "tools", "nanospec.cli": "tools", "nanospec.dev": "tools", "nanospec.__main__": "tools",
    "app": "app",
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """(imported project module, imported name or None, line) for every import in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:  # `from . import metrics`: the submodule itself
                    found.append((sub, None, node.lineno))
                elif target in known:
                    found.append((target, alias.name, node.lineno))
    return found


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _entry(module: str) -> str | None:
    """The longest key of `COMPONENTS` that is `module` or contains it."""
    # a package's root entry ("nanospec": its __init__) covers no submodule; "app" covers the whole app
    keys = [k for k in COMPONENTS if module == k or (k not in PACKAGES[:1] and module.startswith(k + "."))]
    return max(keys, key=len) if keys else None


def component(module: str) -> str | None:
    """The component of a module: its entry in `COMPONENTS`; in the app (one entry for the whole
    layer) its top-level module or package. None when the map has no entry for it."""
    entry = _entry(module)
    if entry == "app" and module != "app":
        return ".".join(module.split(".")[:2])
    return entry


def layer(name: str) -> str:
    return COMPONENTS[_entry(name)]


def doc_name(name: str, root: Path) -> str:
    """How the code map names a component, from inside its top folder: `decoding/` for a package,
    `config.py` for a module, `retrieval/build.py` for a module inside a package."""
    path = root.joinpath(*name.split("."))
    inner = "/".join(name.split(".")[1:])
    return f"{inner}/" if path.is_dir() else f"{inner}.py"


def layer_blocks(design: str) -> dict[str, str]:
    """docs/design.md's code map (section 1) cut at its `[runtime]`, `[tools]` and `[app]` lines."""
    start = design.find("## 1.")
    end = design.find("\n## 2.", start)
    code_map = design[start:end] if start >= 0 else ""
    parts = re.split(r"^\s*\[(runtime|tools|app)\].*$", code_map, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def violations(root: Path) -> list[str]:
    """Every violation of the rules in the module docstring, one line each (empty: none)."""
    root = Path(root).resolve()
    known = modules(root)
    found, mod_edges, comp_edges = [], {m: set() for m in known}, {}
    for name, path in known.items():
        here = component(name)
        if here is None:
            found.append(f"layer: {path.relative_to(root)} has none (add its component to COMPONENTS)")
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"size: {path.relative_to(root)} has {lines} lines (at most {MAX_LINES})")
        for target, _, line in imports(name, path, known):
            if target == name or target.startswith(name + "."):
                continue
            mod_edges[name].add(target)
            there = component(target)
            if there is None or there == here:
                continue
            comp_edges.setdefault(here, set()).add(there)
            if LAYERS.index(layer(there)) > LAYERS.index(layer(here)):
                found.append(f"upward: {path.relative_to(root)}:{line}: {layer(here)} imports {layer(there)} "
                             f"({name} -> {target})")
    found += [f"cycle: between components {' <-> '.join(sorted(c))}" for c in cycles(comp_edges)]
    found += [f"cycle: between modules {' <-> '.join(sorted(c))}" for c in cycles(mod_edges)]
    return found + code_map_gaps(root, known)


def code_map_gaps(root: Path, known: dict[str, Path]) -> list[str]:
    """Components with modules that docs/design.md's code map does not name in their layer's block."""
    design = root / "docs" / "design.md"
    blocks = layer_blocks(design.read_text(encoding="utf-8")) if design.exists() else {}
    if set(blocks) != set(LAYERS):
        return [f"docs: design.md's code map needs one [runtime], [tools] and [app] line (found {sorted(blocks)})"]
    gaps = []
    for name in sorted({component(m) for m in known} - {None} - set(PACKAGES)):
        label = doc_name(name, root)
        if not re.search(rf"(?<![\w/]){re.escape(label)}", blocks[layer(name)]):
            gaps.append(f"docs: design.md's code map does not name {label} ({name}) in its [{layer(name)}] block")
    return gaps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 2
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[2]
    if not all((root / pkg).is_dir() for pkg in PACKAGES):
        print(f"error: {root} is not the repository's root (it has no {' or '.join(PACKAGES)} folder)", file=sys.stderr)
        return 2
    found = violations(root)
    for line in found:
        print(line)
    print(f"{len(found)} violation(s) in {len(modules(root.resolve()))} modules", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
