"""A store on disk: one compressed .npz with `tokens`, `offsets`, `sa` and `manifest` (a JSON string).

The manifest says what the arrays are (format, counts, dtype), what they were built from (tokenizer
fingerprint, source chunks and their sha256, build settings) and the sha256 of the three arrays'
bytes, checked on load. `load_store` never raises on a bad file: a missing, truncated, altered or
foreign one is skipped with one warning line naming it, and it returns None (retrieval stays off).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from nanospec.retrieval.store import SuffixStore

FORMAT = 1
ARRAYS = ("tokens", "offsets", "sa")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides the ids: the vocabulary, the special tokens and the chat template (a store
    and the answer chunks record it; loading refuses a store built with another tokenizer)."""
    vocab = sorted(tokenizer.get_vocab().items())
    raw = json.dumps([vocab, tokenizer.eos_token, tokenizer.pad_token, getattr(tokenizer, "chat_template", None)])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def content_sha256(tokens: np.ndarray, offsets: np.ndarray, sa: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (tokens, offsets, sa):
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def save_store(path: Path | str, store: SuffixStore, manifest: dict) -> dict:
    """Write the store atomically (a temporary file, then a rename); returns the manifest written."""
    path = Path(path)
    full = dict(manifest, format=FORMAT, tokens=len(store), documents=store.n_documents,
                dtype=str(store.tokens.dtype),
                sha256=content_sha256(store.tokens, store.offsets, store.sa))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, tokens=store.tokens, offsets=store.offsets, sa=store.sa,
                        manifest=np.array(json.dumps(full, sort_keys=True)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(buffer.getvalue())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return full


def _read(path: Path, tokenizer_hash: str | None) -> SuffixStore:
    """The store, checked; ValueError/OSError saying what is wrong."""
    if not path.exists():
        raise FileNotFoundError("missing")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in (*ARRAYS, "manifest") if k not in z.files]
        if missing:
            raise ValueError(f"no {', '.join(missing)} in the file")
        arrays = {k: z[k] for k in ARRAYS}
        manifest = json.loads(str(z["manifest"]))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"format {manifest.get('format') if isinstance(manifest, dict) else '?'}, not {FORMAT}")
    if tokenizer_hash is not None and manifest.get("tokenizer") != tokenizer_hash:
        raise ValueError(f"built with tokenizer {manifest.get('tokenizer') or '?'}, not {tokenizer_hash} "
                         "(a foreign store)")
    tokens, offsets, sa = arrays["tokens"], arrays["offsets"], arrays["sa"]
    if tokens.dtype not in (np.uint16, np.uint32) or sa.dtype != np.int32 or offsets.dtype != np.int64:
        raise ValueError(f"unexpected dtypes (tokens {tokens.dtype}, sa {sa.dtype}, offsets {offsets.dtype})")
    digest = content_sha256(tokens, offsets, sa)
    if digest != manifest.get("sha256"):
        raise ValueError(f"sha256 {digest[:12]} differs from its manifest's {str(manifest.get('sha256'))[:12]} "
                         "(altered)")
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
        raise ValueError("offsets do not fit the tokens")
    return SuffixStore(tokens, offsets, sa, manifest)


def load_store(path: Path | str, tokenizer_hash: str | None = None,
               warn: Callable[[str], None] = print) -> SuffixStore | None:
    """The store at `path`, or None with one warning line naming it. `tokenizer_hash`: the running
    target's tokenizer fingerprint (`tokenizer_fingerprint`); None skips that check."""
    path = Path(path)
    try:
        return _read(path, tokenizer_hash)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        warn(f"warning: retrieval store {path} skipped: {err}; retrieved drafts are off")
        return None
