"""Load a target model + tokenizer: the offline default, a local folder or a hub id.

Device and dtype handling lives here (scripts do I/O, model code does none). The default
target (SmolLM2-135M-Instruct) comes from :mod:`nanospec.loaders.default_model`; its hub id is treated
as the default whenever the hub cannot serve it (offline, unreachable, not cached).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from nanospec.loaders.default_model import (DEFAULT_HUB_ID, DEFAULT_MODEL_NAME, ProgressFn, ensure_default_model,
                            is_default_alias)

logger = logging.getLogger(__name__)

DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}
DEVICE_TYPES = ("cpu", "cuda", "mps")
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MATMUL_PROBES: dict[tuple[torch.dtype, str], bool] = {}  # (dtype, device type) -> a 2x2 matmul runs
HUB_CHECK_TIMEOUT_S = 3.0
# "name" or "owner/name"; letters, digits, '-', '_', '.'; no '--' or '..' (hub naming rules)
_HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?$")


@dataclass
class LoadedTarget:
    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    name: str  # what to show: the model name, folder or hub id
    source: str  # "default" (offline cache), "local" (a folder) or "hub"


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None -> CUDA if available, else CPU. 'cuda' becomes 'cuda:<current>' so devices compare equal."""
    if device is None:
        return resolve_device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be a string like 'cpu', 'cuda' or 'cuda:0', got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device {device!r} is not valid; use one of {DEVICE_TYPES} "
                         "(optionally with an index, e.g. 'cuda:0')") from err
    if resolved.type not in DEVICE_TYPES:
        raise ValueError(f"device {device!r} is not supported; use one of {DEVICE_TYPES}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for CUDA, but CUDA is not available here; use 'cpu'")
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return torch.device("cuda", index)
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} asked for MPS, but MPS is not available here; use 'cpu'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device | None = None) -> torch.dtype:
    """None/'auto' -> bf16 on CUDA (fp16 where bf16 is unsupported), fp32 elsewhere."""
    if dtype is None or (isinstance(dtype, str) and dtype.strip().lower() == "auto"):
        device = resolve_device(device)
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES.values():
            raise ValueError(f"dtype {dtype} is not supported; use one of {sorted(DTYPE_NAMES)}")
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
    raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPE_NAMES)}, 'auto' or None")


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _matmul_runs(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a 2x2 matmul in `dtype` runs on a `device_type` device (probed once per pair, then cached).

    Older CPU builds raise e.g. ``"addmm_impl_cpu_" not implemented for 'Half'``: such a dtype would
    load, then fail at the first forward."""
    key = (dtype, device_type)
    if key not in _MATMUL_PROBES:
        try:
            a = torch.ones(2, 2, dtype=dtype, device=device_type)
            torch.mm(a, a)
            _MATMUL_PROBES[key] = True
        except (RuntimeError, NotImplementedError, TypeError):
            _MATMUL_PROBES[key] = False
    return _MATMUL_PROBES[key]


def check_dtype_supported(dtype: str | torch.dtype, device: str | torch.device) -> None:
    """ValueError, naming the dtype, the device and the dtypes allowed there, when `device` cannot
    run `dtype`; called before any weights are read (`load_pair`, `load_target`).

    - only float32, bfloat16 and float16 are supported at all;
    - bfloat16 on a CUDA device needs ``torch.cuda.is_bf16_supported()``;
    - bfloat16 / float16 on a CPU (or MPS) device need a 2x2 matmul in that dtype to run there.
    CUDA is queried only for a CUDA device: a CPU check never touches ``torch.cuda``.
    """
    try:
        torch_device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not valid; use one of {DEVICE_TYPES} "
                         "(optionally with an index, e.g. 'cuda:0')") from err
    where = str(torch_device)
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key not in DTYPE_NAMES:
            raise ValueError(f"dtype {dtype!r} is not supported on device {where}; use one of "
                             f"{', '.join(_dtype_name(d) for d in SUPPORTED_DTYPES)}")
        dtype = DTYPE_NAMES[key]
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {_dtype_name(dtype)} is not supported on device {where}; use one of "
                         f"{', '.join(_dtype_name(d) for d in SUPPORTED_DTYPES)}")
    if dtype == torch.float32:
        return
    if torch_device.type == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError(f"dtype bfloat16 is not supported on device {where} (this GPU has no bfloat16 "
                             "support); use float16 or float32")
        return
    if not _matmul_runs(dtype, torch_device.type):
        allowed = [d for d in SUPPORTED_DTYPES if d == torch.float32 or _matmul_runs(d, torch_device.type)]
        raise ValueError(f"dtype {_dtype_name(dtype)} is not supported on device {where} (this PyTorch build "
                         f"cannot run a {_dtype_name(dtype)} matmul there); use "
                         f"{' or '.join(_dtype_name(d) for d in allowed)}")


def load_target(model: str | None = None, *, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None, trust_remote_code: bool = False,
                progress: ProgressFn | None = None) -> LoadedTarget:
    """Load a causal LM and its tokenizer, in eval mode with gradients off.

    ``model``: None or an alias ('default', 'smollm2-135m-instruct') for the offline default,
    a local folder, or a hub id (needs network access to the hub).
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    check_dtype_supported(torch_dtype, torch_device)  # before the default model is converted or weights read
    folder, name, source = _resolve_model(model, progress)
    hf_model, tokenizer = _load_pretrained(folder, torch_dtype, trust_remote_code)
    hf_model.to(torch_device)
    hf_model.eval()
    hf_model.requires_grad_(False)
    return LoadedTarget(hf_model, tokenizer, torch_device, torch_dtype, name, source)


def _resolve_model(model: str | None, progress: ProgressFn | None) -> tuple[str, str, str]:
    """Return (what to pass to from_pretrained, display name, source tag)."""
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string (folder, hub id or 'default') or None, got {type(model).__name__}")
    if model is not None and not model.strip():
        raise ValueError("model must not be empty; pass None or 'default' for the offline default")
    if model is None or (is_default_alias(model) and model.strip().lower() != DEFAULT_HUB_ID.lower()):
        return str(ensure_default_model(progress)), DEFAULT_MODEL_NAME, "default"
    model = model.strip()
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path), model, "local"
    if path.exists():
        raise ValueError(f"model {model!r} is a file; pass the folder that holds config.json")
    if not _HUB_ID.match(model):
        raise ValueError(f"model {model!r} is neither an existing folder nor a hub id like "
                         "'owner/name'; use None or 'default' for the offline default")
    if is_default_alias(model) and not _hub_can_serve(model):
        logger.warning("The hub cannot serve %s here; using the offline default conversion.", model)
        return str(ensure_default_model(progress)), DEFAULT_MODEL_NAME, "default"
    return model, model, "hub"


def _hub_can_serve(repo_id: str) -> bool:
    """Cached locally, or the hub answers within a few seconds (and offline mode is off)."""
    try:
        from huggingface_hub import HfApi, try_to_load_from_cache
    except ImportError:
        return False
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return True
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    try:
        HfApi().model_info(repo_id, timeout=HUB_CHECK_TIMEOUT_S)
    except Exception:  # any network or HTTP failure means "not reachable"
        return False
    return True


def _load_pretrained(name_or_path: str, dtype: torch.dtype, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation="sdpa", **kwargs)
    except ValueError as err:
        if "sdpa" not in str(err).lower():
            raise
        # Tree verification needs a 4-D mask; eager attention takes one too, only slower.
        logger.warning("%s does not support sdpa attention (%s); using eager attention.", name_or_path, err)
        hf_model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation="eager", **kwargs)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError):
        tokenizer = _fallback_tokenizer(name_or_path, hf_model)
    return hf_model, tokenizer


def _fallback_tokenizer(name_or_path: str, hf_model):
    """A folder without tokenizer files (e.g. from `random-pair`): borrow the default model's
    tokenizer when its ids fit the model's vocabulary, so text prompts still work."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    if len(tok) > hf_model.config.vocab_size:
        raise ValueError(f"{name_or_path} has no tokenizer files and its vocabulary ({hf_model.config.vocab_size}) "
                         f"is smaller than the default tokenizer's ({len(tok)}); add a tokenizer to the folder")
    logger.warning("%s has no tokenizer; using the default model's tokenizer for text prompts.", name_or_path)
    return tok
