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
