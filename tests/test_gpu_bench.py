"""`python -m nanospec gpu-bench --device cpu --quick` runs end to end (tiny shapes) and imports no UI package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

UI_PACKAGES = ("gradio", "plotly", "pandas", "gguf")


def test_gpu_bench_cpu_quick(tmp_path):
    code = (f"import sys\nfrom nanospec.__main__ import main\n"
            f"rc = main(['gpu-bench', '--out', {str(tmp_path)!r}, '--quick', '--device', 'cpu', '--skip-tests'])\n"
            f"print('IMPORTED', [m for m in {UI_PACKAGES!r} if m in sys.modules])\nsys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "IMPORTED []" in done.stdout, done.stdout
    report = json.loads((tmp_path / "gpu_bench.json").read_text())
    (shape,) = report["shapes"]
    methods = shape["methods"]
    assert list(methods) == ["ar", "full", "static", "nanospec", "hybrid"]
    for name, row in methods.items():
        if "skipped" in row:
            assert name in ("static", "hybrid") and "frequency table" in row["skipped"]
            continue
        assert row["tokens_per_s"] > 0 and row["verify_ms"] > 0 and row["host_reads_per_step"] == 1
        if name != "ar":
            assert row["draft_ms"] > 0 and row["lm_head_ms"] > 0 and row["identical_to_ar"] == 1.0
    assert methods["nanospec"]["mean_active"] < methods["full"]["mean_active"]
    assert "| nanospec |" in (tmp_path / "gpu_bench.md").read_text()


def test_failed_engine_tests_are_reported_not_fatal(tmp_path, monkeypatch):
    """The engine tests' outcome goes into the report; a failure does not stop the benchmark."""
    import subprocess as sp

    from nanospec.bench import gpu_bench, gpu_report

    fake = sp.CompletedProcess([], 1, stdout="FAILED tests/test_device.py::test_x - boom\n== 1 failed, 3 passed ==\n",
                               stderr="")
    monkeypatch.setattr(gpu_report.subprocess, "run", lambda *a, **k: fake)
    monkeypatch.setattr(gpu_bench, "plan_for", lambda device, quick: gpu_bench.Plan(("tiny",), 1, 4, gpu_bench.torch.float32))
    assert gpu_bench.main(["--out", str(tmp_path), "--quick", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert report["meta"]["engine_tests"].startswith("FAILED: 1 failed, 3 passed")
    assert "test_device.py::test_x" in report["meta"]["engine_tests"]
    assert report["shapes"][0]["methods"]["nanospec"]["tokens_per_s"] > 0


def test_timed_out_engine_tests_are_reported(monkeypatch):
    import subprocess as sp

    from nanospec.bench import gpu_report

    def slow(*args, **kwargs):
        raise sp.TimeoutExpired(args[0], kwargs["timeout"])
    monkeypatch.setattr(gpu_report.subprocess, "run", slow)
    assert gpu_report.engine_tests(gpu_report.torch.device("cpu"), lambda m: None, quick=True).startswith("timed out")


def test_a_shape_that_fails_is_reported(tmp_path, monkeypatch):
    from nanospec.bench import gpu_bench

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(gpu_bench, "bench_shape", boom)
    assert gpu_bench.main(["--out", str(tmp_path), "--quick", "--device", "cpu", "--skip-tests"]) == 0
    assert "Not measured: RuntimeError: CUDA out of memory" in (tmp_path / "gpu_bench.md").read_text()
