"""`loading.check_dtype_supported`: a dtype the device cannot run fails with a clear ValueError
before any weights are read or downloaded (old GPUs without bf16, CPU builds without fp16 matmul)."""

from __future__ import annotations

import pytest
import torch

from nanospec import hub

from nanospec.heads import head

from nanospec.loaders import loading

ALLOWED = "float32, bfloat16, float16"
HALF_ERROR = "\"addmm_impl_cpu_\" not implemented for 'Half'"  # what such CPU builds raised


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    """Each test starts with no cached probe results (and leaves the real cache untouched)."""
    monkeypatch.setattr(loading, "_MATMUL_PROBES", {})


@pytest.fixture
def old_gpu(monkeypatch):
    """A CUDA device without bf16 (e.g. a T4 / V100), simulated on any machine."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(loading, "resolve_device", lambda device=None: torch.device("cuda", 0))


@pytest.fixture
def cpu_without_fp16(monkeypatch):
    """A CPU build whose fp16 matmul raises, as older PyTorch CPU builds did; counts the probes."""
    real_mm, calls = torch.mm, []

    def mm(a, b, *args, **kwargs):
        calls.append(a.dtype)
        if a.dtype == torch.float16:
            raise RuntimeError(HALF_ERROR)
        return real_mm(a, b, *args, **kwargs)

    monkeypatch.setattr(torch, "mm", mm)
    return calls


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Every way a target or head gets its weights (download, default-model conversion, from_pretrained,
    a head's state) fails the test if called."""
    def forbidden(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} was called before the dtype check")
        return fail

    monkeypatch.setattr(hub, "fetch_folder", forbidden("hub.fetch_folder"))
    monkeypatch.setattr(loading, "ensure_default_model", forbidden("ensure_default_model"))
    monkeypatch.setattr(loading, "_load_pretrained", forbidden("_load_pretrained"))
    monkeypatch.setattr(head, "read_state", forbidden("head.read_state"))
    import nanospec.heads.head3 as head3
    monkeypatch.setattr(head3, "read_state", forbidden("head3.read_state"))


def _cuda_forbidden(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("torch.cuda was queried for a CPU device")

    for name in ("is_available", "is_bf16_supported", "current_device", "device_count", "get_device_properties",
                 "get_device_capability", "init"):
        monkeypatch.setattr(torch.cuda, name, fail)
    monkeypatch.setattr(torch._C, "_cuda_init", fail, raising=False)


# ---- the check itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, "float32", "bf16", "fp16",
                                   "torch.float16"])
def test_supported_dtypes_pass_on_this_cpu(dtype, monkeypatch):
    _cuda_forbidden(monkeypatch)
    assert loading.check_dtype_supported(dtype, "cpu") is None
    assert loading.check_dtype_supported(dtype, torch.device("cpu")) is None


@pytest.mark.parametrize("dtype,name", [(torch.float64, "float64"), (torch.int8, "int8"),
                                        (torch.float8_e4m3fn, "float8_e4m3fn"), ("float64", "float64"),
                                        ("fp8", "fp8")])
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_unsupported_dtype_names_dtype_device_and_allowed(dtype, name, device, monkeypatch):
    if device == "cpu":
        _cuda_forbidden(monkeypatch)
    with pytest.raises(ValueError) as err:
        loading.check_dtype_supported(dtype, device)
    message = str(err.value)
    assert name in message and f"device {device}" in message and ALLOWED in message, message


def test_bad_device_is_a_value_error():
    with pytest.raises(ValueError, match="device 'gpu' is not valid"):
        loading.check_dtype_supported(torch.float16, "gpu")


def test_bf16_on_a_gpu_without_bf16(old_gpu):
    with pytest.raises(ValueError) as err:
        loading.check_dtype_supported(torch.bfloat16, "cuda:0")
    message = str(err.value)
    assert "bfloat16" in message and "cuda:0" in message and "float16 or float32" in message, message
    loading.check_dtype_supported(torch.float16, "cuda:0")
    loading.check_dtype_supported(torch.float32, "cuda:0")


def test_bf16_on_a_gpu_with_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    loading.check_dtype_supported("bfloat16", "cuda:1")


def test_fp16_on_a_cpu_without_fp16_matmul(cpu_without_fp16, monkeypatch):
    _cuda_forbidden(monkeypatch)
    for _ in range(3):
        with pytest.raises(ValueError) as err:
            loading.check_dtype_supported(torch.float16, "cpu")
        message = str(err.value)
        assert "float16" in message and "device cpu" in message and "use float32 or bfloat16" in message, message
    loading.check_dtype_supported(torch.bfloat16, "cpu")
    loading.check_dtype_supported(torch.float32, "cpu")  # fp32 needs no probe
    # one probe per (dtype, device type), however often the check runs
    assert sorted(map(str, cpu_without_fp16)) == ["torch.bfloat16", "torch.float16"]
    assert loading._MATMUL_PROBES == {(torch.float16, "cpu"): False, (torch.bfloat16, "cpu"): True}


def test_cpu_without_any_low_precision_matmul(monkeypatch):
    monkeypatch.setattr(torch, "mm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("not implemented")))
    with pytest.raises(ValueError, match=r"dtype bfloat16 is not supported on device cpu .*; use float32$"):
        loading.check_dtype_supported(torch.bfloat16, "cpu")


def test_the_real_probe_runs_here():
    """On this machine's PyTorch the probe itself succeeds for both low-precision dtypes."""
    assert loading._matmul_runs(torch.bfloat16, "cpu") and loading._matmul_runs(torch.float16, "cpu")
    assert set(loading._MATMUL_PROBES) == {(torch.bfloat16, "cpu"), (torch.float16, "cpu")}


# ---- the loading paths check first ---------------------------------------------------------------


def test_load_target_old_gpu_fails_before_weights(old_gpu, no_weight_reads):
    with pytest.raises(ValueError, match=r"dtype bfloat16 is not supported on device cuda:0"):
        loading.load_target(None, device="cuda", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"dtype bfloat16 is not supported on device cuda:0"):
        loading.load_target("some-org/some-model", device="cuda", dtype=torch.bfloat16)


def test_load_target_auto_on_old_gpu_picks_fp16(old_gpu, no_weight_reads):
    """'auto' never asks for what the device lacks: it goes on (to the weights, here forbidden)."""
    with pytest.raises(AssertionError, match="ensure_default_model was called"):
        loading.load_target(None, device="cuda", dtype="auto")


def test_load_target_cpu_without_fp16_fails_before_weights(cpu_without_fp16, no_weight_reads, monkeypatch):
    _cuda_forbidden(monkeypatch)
    with pytest.raises(ValueError, match=r"dtype float16 is not supported on device cpu"):
        loading.load_target(None, device="cpu", dtype="float16")


def test_load_pair_old_gpu_fails_before_download_or_weights(old_gpu, no_weight_reads):
    from nanospec.pair import load_pair

    for model, head_id in ((None, None), ("some-org/some-model", "some-org/some-head")):
        with pytest.raises(ValueError) as err:
            load_pair(model, head_id, device="cuda", dtype="bf16")
        assert "dtype bfloat16 is not supported on device cuda:0" in str(err.value)


def test_load_pair_cpu_without_fp16_fails_before_download_or_weights(cpu_without_fp16, no_weight_reads,
                                                                      monkeypatch):
    from nanospec.pair import load_pair

    _cuda_forbidden(monkeypatch)
    with pytest.raises(ValueError, match=r"dtype float16 is not supported on device cpu"):
        load_pair("some-org/some-model", "some-org/some-head", device="cpu", dtype="fp16")


def test_cli_reports_the_dtype_error(cpu_without_fp16, no_weight_reads, monkeypatch, capsys):
    from nanospec.__main__ import main

    _cuda_forbidden(monkeypatch)
    assert main(["generate", "--device", "cpu", "--dtype", "float16", "hello"]) == 2
    err = capsys.readouterr().err
    assert "dtype float16 is not supported on device cpu" in err and "float32" in err, err
