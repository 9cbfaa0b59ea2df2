"""Presets, the pair picker's switching, Space mode, and the ZeroGPU rules (with tests/stand_in/spaces.py)."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

import pytest

from app.dev.devtools import tiny_loader
from app.pairs import CUSTOM, PairProvider, preset_provider
from nanospec.presets import get_preset, load_presets

STAND_IN = Path(__file__).parent / "stand_in"


# ---- presets ----------------------------------------------------------------------------------


def test_presets_file_names_real_pairs_with_tables():
    presets, default = load_presets()
    assert default == "smollm2-135m" and presets[default].offline
    expected = {"llama-3.2-1b": ("meta-llama/Llama-3.2-1B-Instruct", "yuhuili/EAGLE-LLaMA3.2-Instruct-1B"),
                "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"),
                "qwen2-7b": ("Qwen/Qwen2-7B-Instruct", "yuhuili/EAGLE-Qwen2-7B-Instruct")}
    for name, (target, head) in expected.items():
        assert (presets[name].target, presets[name].head) == (target, head)
        assert not presets[name].offline and presets[name].devices["cuda"].dtype == "bfloat16"
    root = Path(__file__).resolve().parent.parent
    for preset in presets.values():
        assert preset.description and (root / preset.freq_table).is_file()
        for settings in preset.devices.values():
            settings.tree.validate()


def test_unknown_preset_and_wrong_device():
    with pytest.raises(ValueError, match="unknown preset 'nope'; choose one of: smollm2-135m"):
        get_preset("nope")
    with pytest.raises(ValueError, match="runs on cuda only, not on cpu"):
        get_preset("llama-3.1-8b").settings("cpu")
    with pytest.raises(ValueError, match="runs on cuda only"):
        preset_provider("cpu", startup="qwen2-7b")


def test_preset_load_passes_its_files_and_never_trusts_remote_code(monkeypatch):
    seen = {}
    monkeypatch.setattr("nanospec.pair.load_pair", lambda *a, **kw: seen.update(args=a, **kw) or ("engine", "info"))
    assert get_preset("llama-3.2-1b").load(device="cpu") == ("engine", "info")
    assert seen["args"] == ("meta-llama/Llama-3.2-1B-Instruct", "yuhuili/EAGLE-LLaMA3.2-Instruct-1B")
    assert seen["dtype"] == "float32" and seen["trust_remote_code"] is False
    assert seen["freq_table"].endswith("llama3_token_freq.safetensors")


# ---- switching --------------------------------------------------------------------------------


def _provider(**loaders):
    return PairProvider(loaders, next(iter(loaders)), device_hint="cpu")


def failing_loader(progress=None):
    raise ValueError("draft head hidden size 32 does not match the target's 64")


def test_switch_loads_frees_and_keeps_the_old_pair_on_failure():
    provider = _provider(a=tiny_loader(hidden=64), b=tiny_loader(hidden=32), broken=failing_loader)
    first = provider.get()
    messages = []
    provider.switch("b", lambda m, f: messages.append(m))
    engine, info = provider.get()
    assert info.hidden_size == 32 and provider.current == "b" and messages
    assert engine is not first[0]
    with pytest.raises(ValueError, match="hidden size 32"):
        provider.switch("broken")
    assert provider.current == "b" and provider.get()[0] is engine  # the previous pair serves on
    with pytest.raises(ValueError, match="unknown pair 'meta-llama/Llama-3.1-8B'"):
        provider.switch("meta-llama/Llama-3.1-8B")
    provider.switch("a")
    assert provider.get()[1].hidden_size == 64


def test_load_button_reports_failure_and_keeps_the_pair(monkeypatch):
    from app import pairs

    warnings = []
    monkeypatch.setattr(pairs.gr, "Warning", lambda message, **kw: warnings.append(message))
    provider = _provider(a=tiny_loader(hidden=64), broken=failing_loader)
    provider.get()
    line, about, value = pairs.load_chosen_pair(provider, "broken")
    assert value == "a" and provider.current == "a" and "hidden 64" in line
    assert "Could not load 'broken'" in warnings[0] and "hidden size 32" in warnings[0]
    line, _, value = pairs.load_chosen_pair(provider, "a")
    assert value == "a" and len(warnings) == 1


def test_switch_frees_the_previous_pair():
    import gc
    import weakref

    provider = _provider(a=tiny_loader(hidden=64), b=tiny_loader(hidden=32))
    old = weakref.ref(provider.get()[0].model)
    provider.switch("b")
    gc.collect()
    assert old() is None


def test_switched_pair_runs_through_the_app(monkeypatch):
    from app.callbacks import Explorer

    provider = _provider(a=tiny_loader(hidden=64), b=tiny_loader(hidden=32))
    explorer = Explorer(provider)
    provider.switch("b")
    outs = list(explorer.run_live("the draft tree", method="nanospec", max_new_tokens=8, depth=3, top_k=4,
                                  total_tokens=12))
    assert "hidden 32" in outs[-1][-1]


# ---- Space mode -------------------------------------------------------------------------------


def test_space_mode_only_presets_reach_a_loader(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/nanospec")
    with pytest.raises(ValueError, match="only presets can be loaded"):
        preset_provider("cpu", custom=tiny_loader())
    loaded = []
    provider = preset_provider("cpu", loader_for=lambda p: (lambda progress=None: loaded.append(p.name)))
    assert CUSTOM not in provider.loaders and set(provider.loaders) == {"smollm2-135m", "llama-3.2-1b"}
    for typed in ("meta-llama/Llama-3.1-8B-Instruct", "/etc", "../assets/heads", "", None):
        with pytest.raises(ValueError, match="unknown pair"):
            provider.switch(typed)
    assert loaded == []


def test_space_mode_page_has_no_free_text_pair_field(monkeypatch):
    import gradio as gr

    from app.ui import build_app

    monkeypatch.setenv("SPACE_ID", "someone/nanospec")
    provider = preset_provider("cpu", loader_for=lambda p: tiny_loader())
    demo = build_app(provider=provider)
    picker = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "pair-picker")
    assert isinstance(picker, gr.Dropdown) and picker.allow_custom_value is False
    assert {value for _, value in picker.choices} == set(provider.loaders)
    with pytest.raises(gr.Error):
        picker.preprocess("meta-llama/Llama-3.1-8B-Instruct")  # Gradio refuses a value that is not a choice


@pytest.mark.parametrize("device, tree", [("cpu", (3, 4, 12)), ("cuda", (6, 10, 60))])
def test_tree_sliders_start_at_the_devices_default_tree(device, tree):
    """On a GPU the page starts at the GPU default tree (what the engine would pick), on a CPU at the CPU one."""
    from app.models import EngineProvider
    from app.ui import build_app

    demo = build_app(provider=EngineProvider(tiny_loader(), device_hint=device))
    values = {b.label: b.value for b in demo.blocks.values() if getattr(b, "label", None) in
              ("tree depth", "top-k per level", "total tree tokens")}
    assert (values["tree depth"], values["top-k per level"], values["total tree tokens"]) == tree


# ---- ZeroGPU rules, with the stand-in `spaces` ----------------------------------------------------


@pytest.fixture()
def spaces(monkeypatch):
    monkeypatch.syspath_prepend(str(STAND_IN))
    sys.modules.pop("spaces", None)
    module = importlib.import_module("spaces")
    module.reset()
    yield module
    module.reset()
    sys.modules.pop("spaces", None)


def test_zerogpu_decodes_only_inside_gpu_functions(spaces):
    from app import zerogpu
    from app.callbacks import Explorer

    assert zerogpu.active()
    provider = _provider(a=tiny_loader())
    engine, _ = provider.get()
    spaces.guard_model(engine.model.model)  # the decoder stack: every target forward runs it
    spaces.guard_model(engine.head)
    with pytest.raises(spaces.ZeroGPURuleBroken):  # the stand-in catches a forward outside a GPU call
        engine.generate([5, 6, 7], method="ar", max_new_tokens=2)
    spaces.violations.clear()
    explorer = Explorer(provider)
    threads_before = {t.name for t in threading.enumerate()}
    outs = list(explorer.run_live("the draft tree", method="nanospec", max_new_tokens=24, depth=3, top_k=4,
                                  total_tokens=12))
    assert outs and spaces.violations == []
    assert [c["function"] for c in spaces.calls] == ["_decode_steps"]
    assert spaces.calls[0]["duration"] == zerogpu.decode_duration(24, 12)
    assert spaces.calls[0]["thread"] == threading.current_thread().name  # the request's own thread
    assert {t.name for t in threading.enumerate()} - threads_before == set()  # no decode thread started


def test_zerogpu_duration_grows_with_tokens_and_tree():
    from app.zerogpu import MAX_DURATION_S, MIN_DURATION_S, decode_duration

    assert MIN_DURATION_S <= decode_duration(8, 12) < decode_duration(256, 12) < decode_duration(256, 60)
    assert decode_duration(10_000, 128) == MAX_DURATION_S


def test_zerogpu_yields_must_be_plain_cpu_data(spaces):
    import torch

    @spaces.GPU(duration=10)
    def leaky():
        yield {"logits": torch.zeros(2)}

    with pytest.raises(spaces.ZeroGPURuleBroken, match="torch object"):
        list(leaky())


def test_zerogpu_preload_in_main_thread_only(spaces):
    from app import zerogpu

    spaces.guard_cuda_moves()

    def loader_for(preset):
        def load(progress=None):
            engine, info = tiny_loader()(progress)
            engine.model.to("cuda")  # what load_pair(device="cuda") does; the stand-in records it
            return engine, info
        return load

    provider = preset_provider("cpu", loader_for=loader_for)
    errors = []
    worker = threading.Thread(target=lambda: _catch(errors, zerogpu.preload, provider, ["smollm2-135m"]))
    worker.start()
    worker.join()
    assert isinstance(errors[0], RuntimeError) and spaces.cuda_moves == []
    zerogpu.preload(provider, ["smollm2-135m"])
    assert spaces.cuda_moves == ["MainThread"] and list(provider.loaders) == ["smollm2-135m"]
    assert provider.loaded is not None
    moved = []
    worker = threading.Thread(target=lambda: _catch(moved, provider.loaded[0].model.to, "cuda"))
    worker.start()
    worker.join()
    assert isinstance(moved[0], spaces.ZeroGPURuleBroken)  # a CUDA move off the main thread fails


def _catch(into: list, fn, *args):
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 — handed to the test
        into.append(exc)
