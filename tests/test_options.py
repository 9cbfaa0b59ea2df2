"""The run-options table (`nanospec/options.py`): the one place an option is declared. The config
dataclasses' defaults and ranges, the command line's flags, the app's controls and API parameters, the
engine's defaults per device and the presets' overrides all come from it or are checked against it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import nanospec.__main__ as cli
from app.dev.devtools import tiny_loader
from nanospec.decoding.cost_curve import CostCurve
from nanospec.config import TREE_OPTIONS, GenerationConfig, SamplingConfig, TreeConfig, VocabConfig, default_tree
from nanospec.options import OPTIONS, Option, check_option, options_of, run_defaults
from nanospec.presets import load_presets

DEVICES = ("cpu", "cuda")
CONFIGS = {"run": GenerationConfig, "tree": TreeConfig, "sampling": SamplingConfig, "vocab": VocabConfig}
SUB_CONFIGS = {"tree", "sampling", "vocab"}


def _parse(argv: list[str]):
    return cli.build_parser().parse_args(argv)


def _help(capsys, monkeypatch, command: str) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        _parse([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # help text is matched whole, however argparse wraps it


def _made_up_curve() -> CostCurve:
    sizes = [1, 8, 32, 128]
    return CostCurve(sizes, [10.0 + 3.0 * n for n in sizes], {"device": "test:made-up"})


# ---- a new option touches one place --------------------------------------------------------------


@pytest.fixture
def warmth(monkeypatch) -> Option:
    """A throwaway option added to the table (a tree option: the CLI's decoding flags take it)."""
    opt = Option("draft_warmth", "tree", int, "a throwaway knob for this test", 5, cuda=7, lo=2, hi=9, ui=(3, 8))
    monkeypatch.setitem(OPTIONS, opt.name, opt)
    return opt


def test_an_option_added_to_the_table_appears_in_the_cli_with_default_help_and_bounds(warmth, monkeypatch, capsys):
    monkeypatch.setitem(OPTIONS, "draft_chill", Option("draft_chill", "sampling", float, "another throwaway knob",
                                                       0.25, lo=0, lo_open=True, hi=0.5))
    for command in ("generate", "compare", "sweep"):
        text = _help(capsys, monkeypatch, command)
        assert ("--draft-warmth N a throwaway knob for this test; an integer in [2, 9] "
                "(default: 5 on a CPU, 7 on a GPU)") in text
        assert "--draft-chill X another throwaway knob; a number in (0, 0.5] (default: 0.25)" in text

    a = _parse(["generate", "a prompt"])
    assert a.draft_warmth is None and a.draft_chill == 0.25  # a per-device default waits for the device
    cli._fill_defaults(a, "cpu")
    assert a.draft_warmth == 5 and cli._decode_options(a)["draft_warmth"] == 5
    a = _parse(["generate", "a prompt"])
    cli._fill_defaults(a, torch.device("cuda", 1))
    assert a.draft_warmth == 7
    a = _parse(["generate", "a prompt", "--draft-warmth", "9", "--draft-chill", "0.5"])
    cli._fill_defaults(a, "cuda")
    assert (a.draft_warmth, a.draft_chill) == (9, 0.5)  # set on the command line: kept on any device

    for flag, value, message in (("--draft-warmth", "10", "draft_warmth must be an integer in [2, 9]; got 10"),
                                 ("--draft-warmth", "1", "draft_warmth must be an integer in [2, 9]; got 1"),
                                 ("--draft-warmth", "2.5", "draft_warmth must be an integer in [2, 9]; got '2.5'"),
                                 ("--draft-chill", "0", "draft_chill must be a number in (0, 0.5]; got 0.0"),
                                 ("--draft-chill", "nan", "draft_chill must be a number in (0, 0.5]; got nan")):
        with pytest.raises(SystemExit) as exit_:
            _parse(["generate", "a prompt", flag, value])
        assert exit_.value.code == 2
        assert f"error: argument {flag}: {message}" in capsys.readouterr().err


def test_an_option_the_app_offers_gets_a_control_an_api_parameter_and_reaches_the_callbacks(warmth, monkeypatch):
    """Added to the table and to the app's KNOBS: a slider over its `ui` range at the device's default, a
    parameter of /run and /compare, and its value in the dict each callback gets (the page is built, not
    served)."""
    import asyncio

    import app.callbacks
    import app.inputs
    from app.ui import Slider, build_app

    monkeypatch.setattr(app.inputs, "KNOBS", (*app.inputs.KNOBS, warmth.name))
    seen = []

    def spy(knobs: dict) -> dict:  # the callbacks' input check: record what came and what it gives, stop the run
        seen.append((dict(knobs), app.inputs.generation_options(knobs)))
        raise ValueError("seen")

    monkeypatch.setattr(app.callbacks, "generation_options", spy)
    for device, default in (("cpu", 5), ("cuda", 7)):
        demo = build_app(tiny_loader(), device_hint=device)
        control = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "draft-warmth")
        assert isinstance(control, Slider) and (control.minimum, control.maximum, control.step) == (3, 8, 1)
        assert (control.label, control.value) == ("draft warmth", default)

    api = demo.get_api_info()["named_endpoints"]
    # Compare's vLLM rows come last (optional, after the knobs): older positional calls still fit
    for endpoint, lead, tail in (("/run", "method", []), ("/compare", "methods", ["peers"])):
        params = api[endpoint]["parameters"]
        assert [p["parameter_name"] for p in params] == ["prompt_text", lead, *app.inputs.KNOBS[1:], *tail]
        assert params[len(params) - 1 - len(tail)]["parameter_default"] == 7
    assert api["/compare"]["parameters"][-1]["parameter_default"] == []
    for name, lead, tail in (("run", ["a prompt", "ar"], []), ("compare", ["a prompt", ["full"]], [[]])):
        fn = next(f for f in demo.fns.values() if f.api_name == name)
        knob_inputs = fn.inputs[2:len(fn.inputs) - 1 - len(tail)]
        page = [*lead, *(b.value for b in knob_inputs), 6.0, *tail]  # as the page sends them: a slider sends a float
        with pytest.raises(Exception, match="invalid input: seen"):
            asyncio.run(demo.process_api(fn, page, request=None))
        knobs, options = seen[-1]
        assert set(knobs) == set(app.inputs.KNOBS) and knobs["draft_warmth"] == 6.0 and options["draft_warmth"] == 6
    with pytest.raises(ValueError, match=r"draft_warmth must be in \[3, 8\] in this app; got 9"):
        app.inputs.generation_options({"draft_warmth": 9})


@pytest.mark.parametrize("declaration,message", [
    (dict(type=int, default=0, lo=1), "x must be an integer >= 1; got 0"),
    (dict(type=int, default=1, cuda=70, hi=64), "x must be an integer <= 64; got 70"),
    (dict(type=bool, default=False, cli="value"), "a bool takes cli 'flag' or 'switch'"),
    (dict(type=bool, default=False, cuda=True, cli="flag"), "a 'flag' turns on an option that is off on every device"),
    (dict(type=int, default=0, config="model"), "config must be one of"),
])
def test_the_table_refuses_a_declaration_that_contradicts_itself(declaration, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Option("x", **{"config": "tree", "help": "a test option", **declaration})


def test_every_existing_decoding_flag_keeps_its_name_and_kind(capsys):
    a = _parse(["compare", "--max-new-tokens", "4", "--depth", "2", "--top-k", "2", "--total-tokens", "4",
                "--temperature", "0.5", "--top-p", "0.9", "--seed", "7", "--capacity", "64", "--static-size", "100",
                "--core-size", "0", "--ctx-topk", "2", "--copy-branch", "0,4,10", "--copy-ngram", "3",
                "--budget", "both", "--fixed-shape"])
    assert (a.max_new_tokens, a.depth, a.top_k, a.total_tokens, a.temperature, a.top_p, a.seed) == (4, 2, 2, 4, 0.5,
                                                                                                    0.9, 7)
    assert (a.capacity, a.static_size, a.core_size, a.ctx_topk, a.copy_ngram) == (64, 100, 0, 2, 3)
    assert a.copy_branch == [0, 4, 10] and a.budget == "both" and a.fixed_shape is True
    assert _parse(["generate", "x", "--seed", "none"]).seed is None  # the table's None: a fresh seed per run
    for argv in (["generate", "x", "--budget", "maybe"], ["compare", "--copy-branch", "3,65"]):
        with pytest.raises(SystemExit):
            _parse(argv)
    assert "copy_branch must be an integer in [0, 64]; got 65" in capsys.readouterr().err
    assert cli.main(["generate", "x", "--copy-branch", "3,4"]) == 2
    assert "generate takes one --copy-branch value" in capsys.readouterr().err
    assert cli.main(["generate", "x", "--copy-branch", "3,4", "--retrieval-nodes", "0,8"]) == 2
    assert "generate takes one --copy-branch value and one --retrieval-nodes value" in capsys.readouterr().err
    assert _parse(["compare", "--retrieval-nodes", "0,8"]).retrieval_nodes == [0, 8]
    assert cli.main(["generate", "x", "--budget", "both"]) == 2


# ---- one answer to "what does a run here get when the caller sets nothing" --------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_run_defaults_are_what_default_tree_the_cli_and_a_bare_config_give(device):
    defaults = run_defaults(device)
    assert set(defaults) == set(OPTIONS)
    assert default_tree(device) == TreeConfig(**{n: defaults[n] for n in options_of("tree")})
    cfg = GenerationConfig.build(**defaults)
    cfg.validate()
    a = _parse(["generate", "a prompt"])
    cli._fill_defaults(a, device)
    cli_options = cli._decode_options(a)
    assert cli_options == {n: v for n, v in defaults.items() if OPTIONS[n].cli != "none"}
    assert GenerationConfig.build(a.method, **cli_options) == cfg
    if device == "cpu":  # the dataclasses' own defaults are a CPU's
        assert GenerationConfig() == cfg


def test_the_device_defaults_differ_where_the_design_says():
    cpu, gpu = run_defaults("cpu"), run_defaults("cuda:0")
    assert {n for n in OPTIONS if cpu[n] != gpu[n]} == {"depth", "top_k", "total_tokens", "copy_branch", "budget"}
    assert (gpu["depth"], gpu["top_k"], gpu["total_tokens"], gpu["copy_branch"], gpu["budget"]) == (6, 10, 60, 0, False)
    assert run_defaults("mps") == cpu == run_defaults(torch.device("cpu"))


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_and_the_cli_run_what_run_defaults_say(device, monkeypatch):
    engine, info = tiny_loader(vocab=512, hidden=32, layers=1)(None)
    engine.use_cost_curve(_made_up_curve())  # the CPU's default budget needs one; never measured here
    monkeypatch.setattr(engine, "device", torch.device(device))  # stream() only validates: nothing runs on it
    expected = GenerationConfig.build(**run_defaults(device))
    assert engine.stream([1, 2, 3]).config == expected
    assert engine.stream([1, 2, 3], max_new_tokens=5).config == dataclasses.replace(expected, max_new_tokens=5)
    given = GenerationConfig.build("full", depth=2)
    assert engine.stream([1, 2, 3], given).config is given  # a config is used exactly as given

    seen = []

    def stream(prompt, config=None, **options):
        seen.append(config)
        raise _Seen  # the config is all this test needs; nothing decodes

    monkeypatch.setattr(cli, "_load", lambda a: (engine, info))
    monkeypatch.setattr(engine, "stream", stream)
    with pytest.raises(_Seen):
        cli.main(["generate", "a b c"])
    assert seen == [expected]


class _Seen(Exception):
    pass


def test_keyword_tree_options_keep_their_meaning():
    """A keyword run that sets a tree option gets the dataclasses' defaults for the rest (not the
    device's tree): what `SpecEngine.stream` has always done."""
    assert TREE_OPTIONS == {"depth", "top_k", "total_tokens", "copy_branch", "copy_ngram"}
    assert TREE_OPTIONS <= set(options_of("tree"))


# ---- the dataclasses and the table agree ---------------------------------------------------------------


def test_every_config_field_is_a_table_option_with_its_default():
    fields = {}
    for config, cls in CONFIGS.items():
        for f in dataclasses.fields(cls):
            if f.name not in SUB_CONFIGS:
                fields[f.name] = (config, f.default)
    assert fields == {n: (o.config, o.default) for n, o in OPTIONS.items()}


def _candidates(opt: Option) -> tuple[list, list]:
    """(allowed, refused) values at and just past the option's bounds, plus wrong types."""
    if opt.type is bool:
        return [True, False], [1, 0, "on", None]
    if opt.choices is not None:
        return list(opt.choices), ["bogus", None, 3]
    step = 1 if opt.type is int else 1e-9
    ok, bad = [], [str(opt.default), True]
    if opt.lo is not None:
        (bad if opt.lo_open else ok).append(opt.lo)
        bad.append(opt.lo - step)
        ok.append(opt.lo + step)
    if opt.hi is not None:
        ok.append(opt.hi)
        bad.append(opt.hi + step)
    if opt.type is int:
        bad.append(float(opt.default) + 0.5)
    else:
        bad += [float("nan"), float("inf")]
    (ok if opt.nullable else bad).append(None)
    return ok, bad


def _owner_with(name: str, value) -> GenerationConfig:
    opt = OPTIONS[name]
    if opt.config == "run":
        return dataclasses.replace(GenerationConfig(), **{name: value})
    return dataclasses.replace(GenerationConfig(), **{opt.config: CONFIGS[opt.config](**{name: value})})


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_dataclasses_validate_exactly_the_tables_bounds(name):
    opt = OPTIONS[name]
    ok, bad = _candidates(opt)
    for value in ok:
        check_option(name, value)
        _owner_with(name, value).validate()
    for value in bad:
        with pytest.raises(ValueError, match=f"^{name} must be {re.escape(opt.allowed())}; got "):
            check_option(name, value)
        with pytest.raises(ValueError, match=f"^{name} must be "):
            _owner_with(name, value).validate()
    with pytest.raises(ValueError, match="unknown generation option 'bogus'"):
        GenerationConfig.build(bogus=1)


def test_ui_ranges_lie_inside_the_bounds_and_hold_every_devices_default():
    for opt in OPTIONS.values():
        if opt.ui is None:
            continue
        lo, hi = opt.ui
        check_option(opt.name, lo)
        check_option(opt.name, hi)
        for device in DEVICES:
            value = opt.default_for(device)
            assert lo <= value <= hi, opt.name
            steps = (value - lo) / (opt.ui_step or 1)  # a slider over `ui` can show the default
            assert abs(steps - round(steps)) < 1e-9, (opt.name, device)


# ---- presets: a device's tree is a set of overrides, checked against the table ---------------------------


def _presets_file(tmp_path, cuda_tree) -> str:
    entry = {"name": "p", "label": "P", "description": "test", "target": "default", "head": None, "freq_table": None,
             "devices": {"cpu": {"dtype": "float32"}, "cuda": {"dtype": "bfloat16", "tree": cuda_tree}}}
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"default": "p", "presets": [entry]}))
    return str(path)


def test_a_presets_tree_overrides_the_devices_run_defaults(tmp_path):
    preset = load_presets(_presets_file(tmp_path, {"depth": 5, "copy_branch": 4}))[0]["p"]
    cuda = preset.run_defaults("cuda:0")
    assert cuda == {**run_defaults("cuda"), "depth": 5, "copy_branch": 4}  # the rest: the GPU's defaults
    assert preset.devices["cuda"].tree == TreeConfig(**{n: cuda[n] for n in options_of("tree")})
    assert preset.run_defaults("cpu") == run_defaults("cpu")  # no tree there: the device's defaults
    with pytest.raises(ValueError, match="runs on cpu, cuda only, not on mps"):
        preset.run_defaults("mps")


@pytest.mark.parametrize("tree,message", [
    ({"dept": 5}, "device 'cuda': unknown tree option 'dept'; known: depth, top_k"),
    ({"temperature": 0.5}, "unknown tree option 'temperature'"),
    ({"depth": 0}, "device 'cuda': depth must be an integer in \\[1, 32\\]; got 0"),
    ({"budget": "on"}, "budget must be True or False; got 'on'"),
    ([6, 10, 60], "'tree' must map tree options to values"),
])
def test_a_presets_bad_tree_is_refused_naming_the_option(tmp_path, tree, message):
    with pytest.raises(ValueError, match=message):
        load_presets(_presets_file(tmp_path, tree))


def test_shipped_presets_give_valid_runs_and_their_trees_match_the_devices():
    presets, _ = load_presets()
    for preset in presets.values():
        for device, settings in preset.devices.items():
            options = preset.run_defaults(device)
            GenerationConfig.build(**options).validate()
            for name in ("depth", "top_k", "total_tokens"):  # the file restates each device's tree
                assert options[name] == run_defaults(device)[name], (preset.name, device, name)
