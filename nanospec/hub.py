"""Folders from the Hugging Face hub: one replaceable download function, clear errors, progress.

`fetch_folder(name)` returns a local folder for a folder path or a hub id. Every hub download in
the project goes through `DOWNLOAD` (default `download_snapshot`: `huggingface_hub.snapshot_download`
into the hub cache), so tests and offline setups replace that one function and exercise the rest of
the path unchanged. Errors become `ValueError`s that say what could not be fetched and how to get it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ProgressFn = Callable[[str, "float | None"], None]
DownloadFn = Callable[[str, "ProgressFn | None"], Path]

# "owner/name": letters, digits, '-', '_', '.'; no '--' or '..' (the hub's naming rules)
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken"]


def is_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name))


def download_snapshot(repo_id: str, progress: ProgressFn | None = None) -> Path:
    """`huggingface_hub.snapshot_download` (config, tokenizer and weight files only) with a progress
    callback fed from huggingface_hub's own tqdm bars."""
    from huggingface_hub import snapshot_download

    kwargs = {"allow_patterns": WEIGHT_PATTERNS}
    if progress is not None:
        kwargs["tqdm_class"] = _progress_tqdm(repo_id, progress)
    return Path(snapshot_download(repo_id, **kwargs))


DOWNLOAD: DownloadFn = download_snapshot


def fetch_folder(name: str, what: str, progress: ProgressFn | None = None,
                 download: DownloadFn | None = None) -> Path:
    """A local folder for `name` (an existing folder, or a hub id fetched through `DOWNLOAD`).

    `what` names the thing in messages ("target", "draft head")."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} must be a folder or a hub id like 'owner/name', got {name!r}")
    name = name.strip()
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{what} {name!r} is a file; pass the folder that holds config.json")
    if not is_hub_id(name):
        raise ValueError(f"{what} {name!r} is neither an existing folder nor a hub id like 'owner/name'")
    if progress is not None:
        progress(f"Fetching {what} {name} from the Hugging Face hub…", None)
    try:
        return (download or DOWNLOAD)(name, progress)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 — every hub failure becomes one clear message
        raise ValueError(describe_hub_error(name, what, err)) from err


def describe_hub_error(repo_id: str, what: str, err: BaseException) -> str:
    """What could not be fetched, why, and how to get it."""
    kind = type(err).__name__
    if kind == "GatedRepoError":
        why = ("it is gated: accept its licence on huggingface.co/" + repo_id +
               " and give this process a token (HF_TOKEN or `huggingface-cli login`)")
    elif kind in ("RepositoryNotFoundError", "RevisionNotFoundError"):
        why = "no such repository on the hub (or it is private: a token with access is needed)"
    elif kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or "connect" in str(err).lower():
        why = ("the hub cannot be reached from here and it is not in the local cache: download it on a "
               f"machine with access (`huggingface-cli download {repo_id}`) and pass the folder instead")
    else:
        why = f"{kind}: {str(err)[:200]}"
    return f"could not fetch {what} {repo_id!r}: {why}"


def _progress_tqdm(repo_id: str, progress: ProgressFn):
    """A tqdm class that reports each bar's fraction through `progress`."""
    from tqdm.auto import tqdm

    class ReportingTqdm(tqdm):
        def update(self, n=1):
            shown = super().update(n)
            if self.total:
                progress(f"Downloading {repo_id}: {self.desc or 'files'}", min(1.0, self.n / self.total))
            return shown

    return ReportingTqdm
