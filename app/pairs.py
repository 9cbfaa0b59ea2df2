"""The pair picker: one model pair at a time, chosen among presets (`assets/presets.json`).

`PairProvider` is the app's `EngineProvider` with named loaders: `switch(name)` loads the new pair
while the old one keeps serving, then drops the old one and frees its memory; when the new pair
fails the old one stays. Loads run on the decode thread (see `Explorer._engine`), with progress.

Space mode (`SPACE_ID` set, i.e. a public Hugging Face Space): only presets can be loaded; the page
has no field for model ids or paths, and a name that is not a preset never reaches a loader.
"""

from __future__ import annotations

import gc
import logging
import os
import queue

import gradio as gr
import torch

from nanospec.presets import Preset, load_presets

from app import zerogpu
from app.decoding import decode_thread
from app.models import EngineProvider, Loader, ProgressFn

logger = logging.getLogger("nanospec.app")
CUSTOM = "custom"  # the pair given on the command line with --model/--head (never in Space mode)


def space_mode() -> bool:
    """A Hugging Face Space sets SPACE_ID for its app."""
    return bool(os.environ.get("SPACE_ID"))


class PairProvider(EngineProvider):
    """Named loaders, one loaded pair at a time."""

    def __init__(self, loaders: dict[str, Loader], current: str, labels: dict[str, str] | None = None,
                 descriptions: dict[str, str] | None = None, device_hint: str | None = None):
        if current not in loaders:
            raise ValueError(f"unknown pair {current!r}; choose one of: {', '.join(loaders)}")
        super().__init__(loaders[current], device_hint=device_hint)
        self.loaders = dict(loaders)
        self.current = current
        self.labels = labels or {name: name for name in loaders}
        self.descriptions = descriptions or {}

    def switch(self, name: str, progress: ProgressFn | None = None) -> None:
        """Load `name` (the current pair serves meanwhile), then free the previous pair.

        ValueError for an unknown name; a failed load re-raises and leaves the current pair in place."""
        if not isinstance(name, str) or name not in self.loaders:
            raise ValueError(f"unknown pair {name!r}; choose one of: {', '.join(self.loaders)}")
        with self._lock:
            if name == self.current and self._pair is not None:
                return
            new_pair = self.loaders[name](progress)
            self._pair, self._loader, self.current = new_pair, self.loaders[name], name
        free_memory()

    def choices(self) -> list[tuple[str, str]]:
        return [(self.labels[name], name) for name in self.loaders]

    def description(self, name: str | None = None) -> str:
        return self.descriptions.get(name or self.current, "")


def free_memory() -> None:
    """Return the dropped pair's memory (host, and the CUDA cache where CUDA is in use here)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def preset_provider(device: str | None = None, startup: str | None = None, custom: Loader | None = None,
                    loader_for=None) -> PairProvider:
    """Presets usable on this device (plus the command line's own pair as `custom`, outside Space mode).

    `loader_for(preset) -> Loader` builds each loader (default: `Preset.load` on `device`)."""
    presets, default = load_presets()
    device_type = torch.device(device).type if device else ("cuda" if torch.cuda.is_available() else "cpu")
    usable = {name: p for name, p in presets.items() if device_type in p.devices}
    if startup is not None and startup != CUSTOM and startup not in presets:
        raise ValueError(f"unknown preset {startup!r}; choose one of: {', '.join(presets)}")
    if startup in presets and startup not in usable:
        raise ValueError(f"preset {startup!r} runs on {', '.join(presets[startup].devices)} only, not on {device_type}")
    make = loader_for or (lambda preset: _preset_loader(preset, device))
    loaders: dict[str, Loader] = {name: make(p) for name, p in usable.items()}
    labels = {name: p.label for name, p in usable.items()}
    descriptions = {name: p.description for name, p in usable.items()}
    if custom is not None:
        if space_mode():
            raise ValueError("Space mode (SPACE_ID is set): only presets can be loaded; drop --model/--head "
                             "and choose a preset with --preset or NANOSPEC_PRESET")
        loaders[CUSTOM], labels[CUSTOM] = custom, "Command-line pair (--model/--head)"
        descriptions[CUSTOM] = "The pair given on the command line."
    current = startup or (CUSTOM if custom is not None else default)
    return PairProvider(loaders, current, labels, descriptions, device_hint=device_type)


def _preset_loader(preset: Preset, device: str | None) -> Loader:
    def load(progress: ProgressFn | None = None):
        return preset.load(device=device, progress=progress)
    return load


def switch_on_decode_thread(provider: PairProvider, name: str, progress) -> None:
    """`provider.switch(name)` on the decode thread, its progress shown through Gradio's `progress`."""
    messages: queue.Queue = queue.Queue()

    def show() -> None:
        while not messages.empty():
            message, fraction = messages.get_nowait()
            progress(fraction, desc=message)

    decode_thread().call(lambda: provider.switch(name, lambda m, f: messages.put((m, f))), show)


def load_chosen_pair(provider: PairProvider, name: str, progress=None) -> tuple:
    """The Load button: (pair line, description, picker value). On failure a warning in the page says
    why, the picker goes back to the pair still serving, and nothing else changes."""
    previous = provider.current
    try:
        if zerogpu.active():  # only preloaded pairs: a switch is a swap, and no other thread is used
            provider.switch(name)
        else:
            switch_on_decode_thread(provider, name, progress or (lambda *a, **k: None))
    except Exception as exc:  # noqa: BLE001 — every load failure is shown; the previous pair serves on
        logger.warning("loading pair %r failed: %s", name, exc)
        gr.Warning(f"Could not load {name!r}: {exc}. Still using {provider.labels[previous]}.", duration=None)
        return provider.describe(), provider.description(previous), previous
    return provider.describe(), provider.description(name), name


def build_pair_picker(provider: PairProvider, pair_md: gr.Markdown, queue_id: str) -> None:
    """A dropdown of the provider's pairs and a Load button, inside the current layout."""
    def load(name, progress=gr.Progress()):
        return load_chosen_pair(provider, name, progress)

    with gr.Row(equal_height=True):
        picker = gr.Dropdown(provider.choices(), value=provider.current, label="Model pair", scale=3,
                             elem_id="pair-picker", allow_custom_value=False, interactive=True)
        load_btn = gr.Button("Load pair", scale=1, elem_id="pair-load")
    about = gr.Markdown(provider.description(), elem_id="pair-about")
    picker.change(provider.description, [picker], [about], queue=False, api_visibility="undocumented")
    load_btn.click(load, [picker], [pair_md, about, picker], api_name="load_pair", concurrency_id=queue_id,
                   concurrency_limit=1, show_progress_on=[pair_md])
