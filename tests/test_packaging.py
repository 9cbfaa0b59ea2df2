"""Packaging: the engine installs and imports without the app's dependencies, and finds its assets."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from nanospec import paths

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

IMPORT_EVERYTHING = """
import importlib, pkgutil, sys
import nanospec
for mod in pkgutil.walk_packages(nanospec.__path__, "nanospec."):
    importlib.import_module(mod.name)
print(sorted({m.split(".")[0] for m in sys.modules} & {"gradio", "plotly", "app"}))
"""


def test_importing_the_engine_never_imports_the_ui():
    out = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def _requirement_names(lines: list[str]) -> dict[str, str]:
    reqs = {}
    for line in lines:
        spec = line.split("#")[0].split(";")[0].strip()  # environment markers aside (the Space's torch pin)
        if spec:
            reqs[re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower()] = spec.replace(" ", "")
    return reqs


def test_requirements_txt_is_the_engine_plus_the_app():
    project = PYPROJECT["project"]
    declared = _requirement_names(project["dependencies"] + project["optional-dependencies"]["app"])
    listed = _requirement_names((ROOT / "requirements.txt").read_text().splitlines())
    assert listed == declared, "requirements.txt must list pyproject's dependencies plus the [app] extra"
    assert not {"gradio", "plotly"} & set(_requirement_names(project["dependencies"])), "the engine needs no UI"


def test_every_engine_package_is_packaged():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "nanospec").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
    assert PYPROJECT["project"]["scripts"]["nanospec"] == "nanospec.__main__:main"


def test_every_asset_is_package_data():
    """The wheel ships assets/ as nanospec/_assets through star globs, one per folder depth."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["nanospec._assets"]
    assert all(set(g.split("/")) == {"*"} for g in globs)
    depths = {len(p.relative_to(ROOT / "assets").parts) for p in (ROOT / "assets").rglob("*") if p.is_file()}
    missing = depths - {len(g.split("/")) for g in globs}
    assert not missing, f"assets/ has files {sorted(missing)} folders deep: add a glob for them in pyproject.toml"


def test_assets_folder_resolution(tmp_path):
    assert paths.find_assets({"NANOSPEC_ASSETS": str(tmp_path)}) == tmp_path.resolve()
    found = paths.find_assets({})
    for shipped in ("heads/smollm2-135m-eagle/model.safetensors", "freq", "prompts/prompts.jsonl", "presets.json"):
        assert (found / shipped).exists(), f"{shipped} missing under {found}"
