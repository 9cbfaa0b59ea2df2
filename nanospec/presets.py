"""Pair presets (`assets/presets.json`): a target, its EAGLE head, a frequency table, and per device
the dtype and draft tree to use, with a one-line description.

    from nanospec.presets import get_preset
    preset = get_preset("llama-3.2-1b")
    engine, info = preset.load(device="cuda")
    run = engine.stream(prompt, **preset.run_defaults("cuda"))   # the preset's tree on that device

A device's `tree` is a set of overrides of that device's run defaults (`options.run_defaults`), each
name a tree option of the options table and each value checked against it; options it leaves out
(the copy branch, the draft budget, ...) keep the device's default.

An entry's optional `retrieval` names the store of the retrieved branch (default: the pair's
`assets/retrieval/<pair>.npz` where one is shipped). Relative paths in the file are relative to the
project root; `"target": "default"` is the offline SmolLM2-135M-Instruct. Presets never enable
`trust_remote_code`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from nanospec.config import TreeConfig
from nanospec.loaders.default_model import ProgressFn
from nanospec.options import check_overrides, options_of, run_defaults
from nanospec.paths import ASSETS

PRESETS_PATH = ASSETS / "presets.json"
ROOT = ASSETS.parent
DEVICE_TYPES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class DeviceSettings:
    """A preset on one device type: its dtype and the run options it sets there (its `tree`)."""

    device: str
    dtype: str
    overrides: dict

    def run_defaults(self) -> dict:
        """What a run of this preset on this device gets when the caller sets nothing."""
        return {**run_defaults(self.device), **self.overrides}

    @property
    def tree(self) -> TreeConfig:
        options = self.run_defaults()
        return TreeConfig(**{name: options[name] for name in options_of("tree")})


@dataclass(frozen=True)
class Preset:
    name: str
    label: str
    description: str
    target: str
    head: str | None
    freq_table: str | None
    devices: dict[str, DeviceSettings]
    retrieval: str | None = None  # the store for the retrieved branch (None: the pair's default, if any)

    @property
    def offline(self) -> bool:
        """Runs without the hub: the offline default target and local files only."""
        return self.target == "default" and not _is_remote(self.head)

    def settings(self, device_type: str) -> DeviceSettings:
        if device_type not in self.devices:
            raise ValueError(f"preset {self.name!r} runs on {', '.join(self.devices)} only, not on {device_type}")
        return self.devices[device_type]

    def run_defaults(self, device) -> dict:
        """The flat run options this preset gives a run on `device` when the caller sets nothing: the
        device's run defaults with the preset's overrides for that device type."""
        return self.settings(torch.device(device).type).run_defaults()

    def load(self, device: str | None = None, progress: ProgressFn | None = None, pack_linears: bool = True):
        """`load_pair` with this preset's files and the dtype for `device` (default: CUDA if available)."""
        from nanospec.loaders.loading import resolve_device
        from nanospec.pair import load_pair

        resolved = resolve_device(device)
        settings = self.settings(resolved.type)
        return load_pair(None if self.target == "default" else self.target, _local(self.head), device=str(resolved),
                         dtype=settings.dtype, freq_table=_local(self.freq_table), progress=progress,
                         trust_remote_code=False, pack_linears=pack_linears,
                         retrieval=_local(self.retrieval) if self.retrieval is not None else None)


def load_presets(path: str | Path | None = None) -> tuple[dict[str, Preset], str]:
    """(presets by name, the default preset's name) from the presets file."""
    path = Path(path) if path is not None else PRESETS_PATH
    raw = json.loads(path.read_text(encoding="utf-8"))
    presets = {}
    for entry in raw.get("presets", []):
        preset = _parse(entry, path)
        if preset.name in presets:
            raise ValueError(f"{path}: preset {preset.name!r} appears twice")
        presets[preset.name] = preset
    default = raw.get("default")
    if default not in presets:
        raise ValueError(f"{path}: default preset {default!r} is not one of {sorted(presets)}")
    return presets, default


def get_preset(name: str | None = None, path: str | Path | None = None) -> Preset:
    """The named preset (None: the file's default); ValueError naming the choices when unknown."""
    presets, default = load_presets(path)
    name = default if name is None else name
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(presets)}")
    return presets[name]


def _parse(entry: dict, path: Path) -> Preset:
    missing = {"name", "label", "description", "target", "devices"} - set(entry)
    if missing:
        raise ValueError(f"{path}: preset {entry.get('name', '?')!r} lacks {sorted(missing)}")
    devices = {}
    for device, settings in entry["devices"].items():
        where = f"{path}: preset {entry['name']!r}, device {device!r}"
        if device not in DEVICE_TYPES:
            raise ValueError(f"{where}: not one of {DEVICE_TYPES}")
        if "dtype" not in settings or set(settings) - {"dtype", "tree"}:
            raise ValueError(f"{where}: takes a 'dtype' and optionally a 'tree'; got {sorted(settings)}")
        tree = settings.get("tree", {})
        if not isinstance(tree, dict):
            raise ValueError(f"{where}: 'tree' must map tree options to values; got {tree!r}")
        try:
            check_overrides(tree, "tree")
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        devices[device] = DeviceSettings(device, settings["dtype"], dict(tree))
    return Preset(entry["name"], entry["label"], entry["description"], entry["target"], entry.get("head"),
                  entry.get("freq_table"), devices, entry.get("retrieval"))


def _project_path(name: str) -> Path:
    """`assets/...` names the assets folder wherever it is (a checkout or the installed package)."""
    parts = Path(name).parts
    return ASSETS.joinpath(*parts[1:]) if parts[:1] == ("assets",) else ROOT / name


def _is_remote(name: str | None) -> bool:
    return name is not None and not _project_path(name).exists()


def _local(name: str | None) -> str | None:
    """A project-relative path made absolute; anything else (a hub id) unchanged."""
    if name is None:
        return None
    return str(_project_path(name)) if _project_path(name).exists() else name
