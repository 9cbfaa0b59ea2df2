"""Hugging Face ZeroGPU rules that the app's start-up must keep (app/zerogpu.py, docs/space.md "ZeroGPU pins").

1. Start-up order, for real: a fresh interpreter with a recording stand-in `spaces` package first on
   PYTHONPATH and an import hook that wraps `torch.cuda`'s device-only entry points the moment
   `torch.cuda` is imported, then exactly what `python app.py` does (run app.py, call its `main()`;
   only `Blocks.launch` is replaced so no server starts). It checks that `spaces` is imported (gradio
   does it: `gradio/blocks.py` and `gradio/block_function.py` run `import spaces` at import time)
   before anything could touch CUDA, that nothing touches CUDA in the main process at all, and that
   the ZeroGPU path really ran (pairs preloaded in the main thread, decoding wrapped in `spaces.GPU`).
2. A static (AST) check over `nanospec/` and `app/`: device-only `torch.cuda` calls appear only
   inside functions on the decoding path (allow-list below, one reason each), never at import time
   and never in `app/`; start-up code may only make the queries ZeroGPU's `spaces` answers in the
   main process without a GPU (STARTUP_TOLERATED); and no `torch.compile` (ZeroGPU does not support it).
3. The Space's pins: README front matter `python_version` and requirements.txt's torch range for the
   Space's Python are ones ZeroGPU supports, while requirements.txt stays installable here
   (torch 2.13.0 CPU on Python 3.11, as .ci/run installs it).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent


def _zerogpu_constant(name: str):
    """A constant from app/zerogpu.py, read without importing the app (that would import gradio here)."""
    for node in ast.parse((ROOT / "app" / "zerogpu.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"app/zerogpu.py defines no {name}")


SUPPORTED_PYTHON = _zerogpu_constant("SUPPORTED_PYTHON")  # ZeroGPU's Pythons
SUPPORTED_TORCH = _zerogpu_constant("SUPPORTED_TORCH")    # ZeroGPU's torch range

# torch.cuda entry points that need a real device: never in ZeroGPU's main process, only inside the
# decorated function (the stream/event family counts as device work too).
DEVICE_ONLY = frozenset({
    "_lazy_init", "init", "current_device", "is_bf16_supported", "get_device_properties", "get_device_name",
    "get_device_capability", "mem_get_info", "Stream", "Event", "stream", "current_stream", "default_stream",
    "synchronize",
})
WRAPPED_AT_RUNTIME = ("_lazy_init", "current_device", "is_bf16_supported", "get_device_properties",
                      "get_device_name", "get_device_capability", "mem_get_info", "synchronize", "current_stream",
                      "Stream", "Event")


# ================================================================================================
# 1. start-up order in a fresh interpreter
# ================================================================================================

PROBE = r'''
"""Records, in order: imports of spaces/gradio, every device-only torch.cuda call, app milestones."""
import importlib.abc
import json
import sys
import threading
import traceback

events = []
_WATCH = ("spaces", "gradio", "torch", "torch.cuda")
_NAMES = %(names)r


def importer():
    """The module whose code triggered the import running now (first frame outside importlib/probe)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        filename = frame.f_code.co_filename
        if not (filename.startswith("<frozen") or name in ("_zerogpu_probe", "spaces") or name.startswith("importlib")):
            return name
        frame = frame.f_back
    return None


def event(kind, **info):
    stack = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-2]
             if "/site-packages/" not in f.filename and "<frozen" not in f.filename][-8:]
    events.append({"kind": kind, "thread": threading.current_thread().name, "stack": stack, **info})


def _recording(name, fn):
    def wrapper(*args, **kwargs):
        event("cuda:" + name)
        return fn(*args, **kwargs)
    wrapper.__wrapped__ = fn
    return wrapper


def _recording_class(name, cls):
    def __new__(klass, *args, **kwargs):
        event("cuda:" + name)
        return cls.__new__(klass, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__new__": __new__, "__module__": cls.__module__})


def _wrap_cuda(cuda):
    for name in _NAMES:
        original = getattr(cuda, name)
        setattr(cuda, name, _recording_class(name, original) if isinstance(original, type) else _recording(name, original))
    c = sys.modules["torch._C"]
    if hasattr(c, "_cuda_init"):  # CUDA builds: what _lazy_init calls (ZeroGPU's spaces makes it raise)
        c._cuda_init = _recording("_C._cuda_init", c._cuda_init)
    event("torch.cuda wrapped")


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _WATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module
        by = importer()

        def exec_module(module):
            event("import " + fullname, importer=by)
            run(module)
            if fullname == "torch.cuda":
                _wrap_cuda(module)
        spec.loader.exec_module = exec_module
        return spec


def install():
    assert not any(m in sys.modules for m in _WATCH), "probe must be installed before these imports"
    sys.meta_path.insert(0, _Watch())
''' % {"names": WRAPPED_AT_RUNTIME}

STAND_IN_SPACES = r'''
"""Stand-in `spaces` (ZeroGPU): records its import, each GPU decoration and gradio's auto-wrap."""
import _zerogpu_probe as probe

probe.event("spaces module body", importer=probe.importer())


def GPU(fn=None, *, duration=60, **_):  # noqa: N802 (the real package's name)
    def decorate(func):
        probe.event("spaces.GPU", function=getattr(func, "__name__", repr(func)), callable_duration=callable(duration))
        return func
    return decorate(fn) if fn is not None else decorate


def gradio_auto_wrap(fn):
    probe.event("spaces.gradio_auto_wrap")
    return fn
'''

DRIVER = r'''
import json, os, runpy, sys, threading, traceback
import _zerogpu_probe as probe

probe.install()
result = {"error": None, "launches": [], "cuda_initialized": None}
try:
    # what `python app.py` does: its module body (imports), then main()
    namespace = runpy.run_path(os.path.join(os.environ["NANOSPEC_ROOT"], "app.py"), run_name="nanospec_app_probe")
    probe.event("app.py imported")
    zerogpu = namespace["zerogpu"]
    preload = zerogpu.preload

    def recorded_preload(provider, names):
        probe.event("preload", names=list(names), main_thread=threading.current_thread() is threading.main_thread())
        preload(provider, names)
        probe.event("preloaded")
    zerogpu.preload = recorded_preload
    from nanospec.loaders.default_model import default_model_dir, is_complete  # already imported by app.py

    result["real_pair"] = os.environ.get("PROBE_TINY") != "1" and is_complete(default_model_dir())
    if not result["real_pair"]:  # the offline default is not cached: do not build it here
        import app.pairs
        from app.dev.devtools import tiny_loader
        app.pairs._preset_loader = lambda preset, device: tiny_loader()
    gradio = sys.modules["gradio"]
    gradio.Blocks.launch = lambda self, **kwargs: result["launches"].append(sorted(kwargs))  # no server
    namespace["main"]([])
    probe.event("main returned")
    torch = sys.modules["torch"]
    result["cuda_initialized"] = torch.cuda.is_initialized()
    result["zerogpu_active"] = zerogpu.active()
except BaseException:  # noqa: BLE001 (reported to the test)
    result["error"] = traceback.format_exc()
finally:
    result["events"] = probe.events
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump(result, f)
'''


def run_app_startup(tmp: Path, driver: str = DRIVER, extra_env: dict | None = None) -> dict:
    """Run app.py's start-up in a fresh interpreter with the stand-in `spaces`; the probe's record."""
    stub = tmp / "stub"
    (stub / "spaces").mkdir(parents=True, exist_ok=True)
    (stub / "_zerogpu_probe.py").write_text(PROBE)
    (stub / "spaces" / "__init__.py").write_text(STAND_IN_SPACES)
    (tmp / "driver.py").write_text(driver)
    out = tmp / "probe.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("NANOSPEC_PRESET", "NANOSPEC_SPACE_PRESETS", "PYTHONSTARTUP", "SYSTEM")}
    env.update(PYTHONPATH=os.pathsep.join([str(stub), str(ROOT)]), NANOSPEC_ROOT=str(ROOT), PROBE_OUT=str(out),
               SYSTEM="spaces", SPACE_ID="nanospec/zerogpu-probe", SPACES_ZERO_GPU="true",  # as on a ZeroGPU Space
               GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, str(tmp / "driver.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert out.exists(), f"the probe wrote nothing (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def startup(tmp_path_factory) -> dict:
    return run_app_startup(tmp_path_factory.mktemp("zerogpu"))


def _kinds(record: dict) -> list[str]:
    return [e["kind"] for e in record["events"]]


def _first(record: dict, kind: str) -> int:
    kinds = _kinds(record)
    assert kind in kinds, f"no {kind!r} event; events: {kinds}"
    return kinds.index(kind)


def _cuda_events(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["kind"].startswith("cuda:")]


def _describe(events: list[dict]) -> str:
    return "\n".join(f"- {e['kind']} on {e['thread']}:\n    " + "\n    ".join(e["stack"]) for e in events)


def test_startup_never_touches_cuda_in_the_main_process(startup):
    """Import of app.py, preloading the served pair and building the Blocks: no device-only call at all."""
    assert "torch.cuda wrapped" in _kinds(startup), "the probe never saw torch.cuda being imported"
    calls = _cuda_events(startup)
    assert not calls, f"device-only torch.cuda calls during start-up (ZeroGPU's main process):\n{_describe(calls)}"
    assert startup["error"] is None, startup["error"]
    assert startup["cuda_initialized"] is False


def test_spaces_is_imported_by_gradio_before_cuda_could_be_touched(startup):
    """The order is observed, not assumed: who imported `spaces`, and when, relative to torch and the app."""
    assert startup["error"] is None, startup["error"]
    spaces_at = _first(startup, "import spaces")
    importer = startup["events"][spaces_at]["importer"]
    assert importer and importer.split(".")[0] in ("gradio", "app", "nanospec_app_probe"), importer
    cuda = _cuda_events(startup)
    assert not cuda or spaces_at < startup["events"].index(cuda[0]), _describe(cuda)
    # before app.py's own imports finished, so before any pair loads or any callback exists
    assert spaces_at < _first(startup, "app.py imported") < _first(startup, "preload")
    # and it was the stand-in that gradio now uses: every event function went through its auto-wrap
    assert _first(startup, "spaces.gradio_auto_wrap") > spaces_at


def test_startup_takes_the_zerogpu_path(startup):
    """Pairs load in the main thread before the UI exists; decoding is wrapped in spaces.GPU; no server."""
    assert startup["error"] is None, startup["error"]
    assert startup["zerogpu_active"] is True
    preload = startup["events"][_first(startup, "preload")]
    assert preload["names"] == ["smollm2-135m"] and preload["main_thread"] is True
    decorations = [e for e in startup["events"] if e["kind"] == "spaces.GPU"]
    assert [e["function"] for e in decorations] == ["_decode_steps"], decorations
    assert decorations[0]["callable_duration"] is True  # duration follows the run's size
    assert _first(startup, "preloaded") < startup["events"].index(decorations[0]) < _first(startup, "main returned")
    assert len(startup["launches"]) == 1 and "server_name" in startup["launches"][0]


SNEAKY_DRIVER = r'''
import json, os, sys
import _zerogpu_probe as probe

probe.install()
import spaces  # first, as gradio does
import torch

for name, call in [("current_device", lambda: torch.cuda.current_device()),
                   ("is_bf16_supported", lambda: torch.cuda.is_bf16_supported()),
                   ("get_device_name", lambda: torch.cuda.get_device_name(0)),
                   ("Stream", lambda: torch.cuda.Stream()),
                   ("Event", lambda: torch.cuda.Event()),
                   ("synchronize", lambda: torch.cuda.synchronize())]:
    probe.event("try " + name)
    try:
        call()
    except Exception:  # this CPU-only torch raises; the probe must have seen the call anyway
        pass
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"error": None, "events": probe.events}, f)
'''


def test_the_probe_is_not_blind(tmp_path):
    """Each device-only call shows up as an event, with the code that made it, even though it raises on
    this CPU-only torch (what a stray call at start-up would look like to the tests above)."""
    record = run_app_startup(tmp_path, SNEAKY_DRIVER)
    kinds = _kinds(record)
    assert kinds.index("import spaces") < kinds.index("torch.cuda wrapped")
    for name in ("current_device", "is_bf16_supported", "get_device_name", "Stream", "Event", "synchronize"):
        after = kinds[kinds.index("try " + name) + 1]
        assert after == "cuda:" + name, (name, kinds)
        call = record["events"][kinds.index("try " + name) + 1]
        assert any("driver.py" in line for line in call["stack"]), call
    assert "cuda:_lazy_init" in kinds


# ================================================================================================
# 2. static check: where device-only torch.cuda calls may appear
# ================================================================================================

# (file, function) -> why a device-only call there is fine. Functions on the decoding path run inside
# `spaces.GPU` on ZeroGPU (the engine's generate(), from app/callbacks/__init__.py's decorated `_decode_steps`).
DECODING_PATH = {
    ("nanospec/timing.py", "PhaseTimer.phase"):
        "CUDA events around each phase of a decode step; PhaseTimer runs inside SpecEngine.generate()",
    ("nanospec/timing.py", "sync"):
        "synchronises before reading a step's clock; called from the engine's decode loop only",
    ("nanospec/vocab.py", "ActiveVocab.__init__"):
        "side CUDA stream for ring gathers; ActiveVocab is built lazily by SpecEngine._vocab() on a "
        "method's first generate(), i.e. inside the decorated function, never at load time",
    ("nanospec/vocab.py", "ActiveVocab._gather"):
        "copies new rows on the side stream while drafting: per decode step",
    ("nanospec/vocab.py", "ActiveVocab.wait_ready"):
        "makes the compute stream wait for that copy before the LM head: per decode step",
    ("nanospec/decoding/cost_curve.py", "curve_key"):
        "names the GPU a cost curve was measured on; called by SpecEngine.cost_curve() from stream(), "
        "which the app calls inside the decorated decode function, never at load time",
    ("nanospec/lesson/record.py", "machine_label"):
        "offline recorder CLI (`nanospec record-lesson`); the app imports only its constants",
    ("nanospec/lesson/record.py", "time_lm_head"):
        "offline recorder CLI's LM-head timing sweep; never run by the app",
    ("nanospec/bench/gpu_bench.py", "main"):
        "GPU benchmark CLI (`nanospec gpu-bench`) on a dedicated GPU; never run by the app",
    ("nanospec/bench/gpu_bench.py", "count_per_step"):
        "GPU benchmark CLI: counts CUDA event waits per step by patching torch.cuda.Event; never run by the app",
    ("nanospec/serving/vllm_plugin.py", "_sync"):
        "vLLM plugin's benchmark timers, inside vLLM's worker processes (`nanospec.bench.vllm_vocab`); never run by the app",
}
# Start-up code that makes a device query which ZeroGPU's `spaces` answers in the main process without
# touching the GPU (spaces/zero/torch/patching.py: current_device -> 0, get_device_properties/name/
# capability -> a fixed fake device, synchronize -> no-op, _cuda_init -> raises). Tolerated, not wanted:
# the answers there describe the fake device, not the GPU the decorated function will get.
STARTUP_TOLERATED = {
    ("nanospec/loaders/loading.py", "resolve_device"):
        "zerogpu.preload -> Preset.load -> resolve_device('cuda') asks current_device() for the index",
    ("nanospec/loaders/loading.py", "resolve_dtype"):
        "is_bf16_supported() only for dtype=None on CUDA (presets always give a dtype)",
    ("nanospec/loaders/loading.py", "check_dtype_supported"):
        "load_pair/load_target check bf16 on CUDA with is_bf16_supported() before reading weights",
}
STUBBED_IN_MAIN_PROCESS = {  # what spaces' patching answers in ZeroGPU's main process
    "current_device", "get_device_properties", "get_device_name", "get_device_capability", "synchronize",
    "is_bf16_supported",  # torch's own is_bf16_supported: is_available(), current_device(), get_device_properties()
}
ALLOWED_MODULES = ("nanospec/decoding/engine.py", "nanospec/timing.py", "nanospec/vocab.py", "nanospec/bench/",
                   "nanospec/lesson/record.py", "nanospec/decoding/cost_curve.py", "nanospec/serving/vllm_plugin.py")


class _DeviceCalls(ast.NodeVisitor):
    """Every reference to a device-only torch.cuda name, with its enclosing function (or import time)."""

    def __init__(self, tree: ast.AST):
        self.torch, self.cuda, self.direct = set(), set(), {}
        for node in ast.walk(tree):  # aliases, wherever they are imported
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "torch" or (a.name.startswith("torch.") and a.asname is None):
                        self.torch.add(a.asname or "torch")
                    elif a.name == "torch.cuda":
                        self.cuda.add(a.asname)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if node.module == "torch" and a.name == "cuda":
                        self.cuda.add(a.asname or "cuda")
                    elif (node.module == "torch.cuda" or node.module.startswith("torch.cuda.")) and a.name in DEVICE_ONLY:
                        self.direct[a.asname or a.name] = a.name
        self.scope: list[tuple[str, str]] = []
        self._skip: set[int] = set()
        self.found: list[tuple[int, str, str, bool]] = []  # (line, name, qualname, at import time)
        self.visit(tree)

    def _record(self, node: ast.AST, name: str) -> None:
        qualname = ".".join(n for _, n in self.scope) or "<module>"
        at_import = not any(kind == "def" for kind, _ in self.scope)
        self.found.append((node.lineno, name, qualname, at_import))

    def _is_device_only(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.direct
        if not isinstance(node, ast.Attribute) or node.attr not in DEVICE_ONLY:
            return False
        v = node.value
        return ((isinstance(v, ast.Attribute) and v.attr == "cuda" and isinstance(v.value, ast.Name)
                 and v.value.id in self.torch) or (isinstance(v, ast.Name) and v.id in self.cuda))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_device_only(node.value):  # torch.cuda.Event.synchronize: the class's attribute, no device
            self._skip.add(id(node.value))
        if self._is_device_only(node) and id(node) not in self._skip:
            self._record(node, node.attr)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.direct and id(node) not in self._skip:
            self._record(node, self.direct[node.id])

    def _function(self, node) -> None:
        for d in getattr(node, "decorator_list", []):  # evaluated where the def is
            self.visit(d)
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)
        self.scope.append(("def", getattr(node, "name", "<lambda>")))
        for stmt in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(stmt)  # annotations are never visited: type hints are not calls
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for n in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(n)
        self.scope.append(("class", node.name))
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)


def device_calls(source: str) -> list[tuple[int, str, str, bool]]:
    return _DeviceCalls(ast.parse(source)).found


def _project_device_calls() -> dict[tuple[str, str], list[tuple[int, str, bool]]]:
    found: dict[tuple[str, str], list[tuple[int, str, bool]]] = {}
    for folder in ("nanospec", "app"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, name, qualname, at_import in device_calls(path.read_text(encoding="utf-8")):
                found.setdefault((rel, qualname), []).append((line, name, at_import))
    return found


def test_the_static_check_finds_every_form():
    """The scanner itself: import-time uses (module level, class body, default argument, decorator),
    aliases, and calls inside functions are all found; annotations are not calls."""
    source = textwrap.dedent("""
        from __future__ import annotations
        import torch
        import torch as T
        from torch import cuda as C
        from torch.cuda import synchronize as sync_all
        DEVICE = torch.cuda.current_device()
        class Holder:
            props = T.cuda.get_device_properties(0)
            def method(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event:
                self.ev: torch.cuda.Event = C.Event()
                return [C.Stream() for _ in range(2)]
        def f(flag=torch.cuda.is_bf16_supported()):
            def inner():
                sync_all()
            return lambda: torch.cuda.get_device_name()
        @decorate(torch.cuda.synchronize)
        def g():
            return torch.cuda.Event.synchronize, C.Stream.query  # the classes' attributes: no device
    """)
    assert sorted(device_calls(source)) == [
        (7, "current_device", "<module>", True),
        (9, "get_device_properties", "Holder", True),
        (11, "Event", "Holder.method", False),
        (12, "Stream", "Holder.method", False),
        (13, "is_bf16_supported", "<module>", True),
        (15, "synchronize", "f.inner", False),
        (16, "get_device_name", "f.<lambda>", False),
        (17, "synchronize", "<module>", True),
    ]


def test_device_only_calls_only_on_the_decoding_path():
    found = _project_device_calls()
    at_import = {k: v for k, v in found.items() if any(a for _, _, a in v)}
    assert not at_import, f"device-only torch.cuda calls at import time (module level / class body): {at_import}"
    in_app = {k: v for k, v in found.items() if k[0].startswith("app/")}
    assert not in_app, f"app/ is start-up, UI and request-thread code; move device work into the engine: {in_app}"
    unexplained = {k: v for k, v in found.items() if k not in DECODING_PATH and k not in STARTUP_TOLERATED}
    assert not unexplained, ("device-only torch.cuda calls outside the decoding path (add them to the allow-list "
                             f"only with a reason they run inside spaces.GPU): {unexplained}")
    stale = [k for k in (*DECODING_PATH, *STARTUP_TOLERATED) if k not in found]
    assert not stale, f"allow-list entries with no device-only call any more (drop them): {stale}"


def test_allow_list_is_reasoned_and_narrow():
    for (path, _), reason in {**DECODING_PATH, **STARTUP_TOLERATED}.items():
        assert len(reason) > 30, (path, reason)
    assert all(path.startswith(ALLOWED_MODULES) for path, _ in DECODING_PATH), DECODING_PATH.keys()
    found = _project_device_calls()
    for key in STARTUP_TOLERATED:
        names = {name for _, name, _ in found.get(key, [])}
        assert names <= STUBBED_IN_MAIN_PROCESS, (
            f"{key} runs at start-up on ZeroGPU and uses {sorted(names - STUBBED_IN_MAIN_PROCESS)}, which the "
            "main process cannot answer without a GPU")


# a command that measures torch.compile against eager; nothing in the engine or the app imports it (checked below)
COMPILE_BENCH = "nanospec/bench/compiled_forward.py"


def test_no_torch_compile():
    """ZeroGPU does not support torch.compile; none in the engine or the app (the compile bench apart, which
    neither imports)."""
    hits = []
    for folder in ("nanospec", "app"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) == COMPILE_BENCH:
                continue
            text = path.read_text(encoding="utf-8")
            if "compiled_forward" in text and path.parent.name != "bench":
                hits.append(f"{path.relative_to(ROOT)} mentions the compile bench")
            for node in ast.walk(ast.parse(text)):
                if (isinstance(node, ast.Attribute) and node.attr in ("compile", "_dynamo")
                        and isinstance(node.value, ast.Name) and node.value.id == "torch"):
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not hits, hits


# ================================================================================================
# 3. the Space's pins
# ================================================================================================

ZEROGPU_TORCH_RELEASES = ("2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0")
UNSUPPORTED_TORCH = ("2.7.1", "2.12.0", "2.13.0", "3.0.0")
CPU_MACHINE = {"python": "3.11", "torch": "2.13.0"}  # .ci/run: pip install torch==2.13.0 && -r requirements.txt


def front_matter() -> dict:
    import yaml

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must start with the Space's YAML front matter"
    return yaml.safe_load(text[4:text.index("\n---\n", 4)])


def torch_requirements(python: str) -> list[Requirement]:
    """requirements.txt's torch lines whose marker holds on Linux x86-64 CPython `python`."""
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    reqs = []
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        spec = line.split(" #")[0].strip()
        if spec and not spec.startswith("#"):
            req = Requirement(spec)
            if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate(env)):
                reqs.append(req)
    return reqs


def _combined(reqs: list[Requirement]) -> SpecifierSet:
    spec = SpecifierSet()
    for req in reqs:
        spec &= req.specifier
    return spec


def test_space_python_version_is_one_zerogpu_supports():
    python = front_matter().get("python_version")
    assert isinstance(python, str), (f"README front matter python_version must be a quoted string, got {python!r} "
                                     "(unquoted 3.10 is the float 3.1)")
    assert python in SUPPORTED_PYTHON, f"python_version {python!r}: ZeroGPU supports {SUPPORTED_PYTHON}"


def test_space_installs_a_torch_zerogpu_supports():
    python = front_matter()["python_version"]
    reqs = torch_requirements(python)
    assert reqs, f"requirements.txt has no torch requirement for Python {python}"
    spec = _combined(reqs)
    allowed = SpecifierSet(SUPPORTED_TORCH)
    assert any(spec.contains(v) for v in ZEROGPU_TORCH_RELEASES), f"torch {spec} admits no ZeroGPU release"
    too_wide = [v for v in (*UNSUPPORTED_TORCH, *ZEROGPU_TORCH_RELEASES) if spec.contains(v) and not allowed.contains(v)]
    assert not too_wide, f"on the Space (Python {python}) requirements.txt allows torch {too_wide}: ZeroGPU needs {allowed}"


def test_requirements_still_install_on_the_cpu_machine():
    """The Space pin must not touch this machine: Python 3.11 with torch 2.13.0 satisfies every torch line."""
    reqs = torch_requirements(CPU_MACHINE["python"])
    assert reqs, "requirements.txt must still require torch on Python 3.11"
    assert _combined(reqs).contains(CPU_MACHINE["torch"]), [str(r) for r in reqs]
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    installed = importlib.metadata.version("torch").split("+")[0]
    assert _combined(torch_requirements(here)).contains(installed), (here, installed)


def test_torch_pin_helpers_catch_a_wrong_range(tmp_path, monkeypatch):
    """The pin checks are not vacuous: an unpinned Space fails, the proposed marker lines pass."""
    proposed = ('torch>=2.8,<2.12; python_version == "3.12"   # ZeroGPU Space\n'
                'torch>=2.4; python_version != "3.12"\n')
    for text, space_ok in (("torch>=2.4\n", False), (proposed, True)):
        fake = tmp_path / "root"
        fake.mkdir(exist_ok=True)
        (fake / "requirements.txt").write_text(text)
        monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
        spec = _combined(torch_requirements("3.12"))
        assert (not any(spec.contains(v) for v in UNSUPPORTED_TORCH)) is space_ok, (text, spec)
        assert _combined(torch_requirements("3.11")).contains("2.13.0")
