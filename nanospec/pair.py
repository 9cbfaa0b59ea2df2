"""Assemble a ready engine: target + draft head + token-frequency table (the offline default by default)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from nanospec import hub
from nanospec.loaders.default_model import ProgressFn, is_default_alias
from nanospec.decoding.engine import SpecEngine
from nanospec.heads.head import load_head
from nanospec.heads.head3 import is_eagle3_folder, load_eagle3
from nanospec.paths import ASSETS

logger = logging.getLogger(__name__)

DEFAULT_HEAD = ASSETS / "heads" / "smollm2-135m-eagle"
DEFAULT_FREQ = ASSETS / "freq" / "smollm2_token_freq.safetensors"
RETRIEVAL_DIR = ASSETS / "retrieval"  # a pair's store of the target's past answers: <pair>.npz (retrieval.build)
DEFAULT_RETRIEVAL = RETRIEVAL_DIR / "smollm2-135m.npz"


@dataclass
class PairInfo:
    target: str
    head: str | None
    device: str
    dtype: str
    vocab_size: int
    hidden_size: int
    notes: list[str] = field(default_factory=list)  # what loading decided, one sentence each
    head_family: str | None = None   # "eagle" (EAGLE-1/2) or "eagle3"; None without a head


def missing_before_load(methods: list[str], model: str | None = None, head: str | Path | None = None,
                        freq_table: str | Path | None = None) -> dict[str, str]:
    """{method: why it cannot run} for what `load_pair` with these arguments will lack, known without
    loading anything: no draft head (every method but `ar`), no frequency table file (`static`, `hybrid`).
    A table whose vocabulary does not match the target shows only after loading (`SpecEngine.missing_for`)."""
    has_head = head is not None or (is_default_alias(model) and DEFAULT_HEAD.exists())
    table = Path(freq_table) if freq_table is not None else DEFAULT_FREQ
    out = {}
    for method in methods:
        if method != "ar" and not has_head:
            out[method] = "needs a draft head (--head); this target has none"
        elif method in ("static", "hybrid") and not table.exists():
            out[method] = f"needs a token-frequency table (--freq-table); {table.name} does not exist"
    return out


def load_pair(model: str | None = None, head: str | Path | None = None, *, device: str | None = None,
              dtype: str | None = None, freq_table: str | Path | None = None,
              progress: ProgressFn | None = None, trust_remote_code: bool = False,
              pack_linears: bool = True, retrieval: str | Path | None = None) -> tuple[SpecEngine, PairInfo]:
    """`model=None` is the offline default SmolLM2-135M-Instruct with the project's shipped head.

    `model` and `head` are folders or hub ids (fetched through `nanospec.hub`, with progress).
    A head may be omitted for other targets: then only `ar` runs. The frequency table (for `static` /
    `hybrid`; `.safetensors`/`.npy` counts or FR-Spec's ranked `freq_*.pt`) defaults to the shipped
    one when its vocabulary matches the target.
    `pack_linears=False` keeps PyTorch's default fp32 CPU linear kernel (see cpu_linear.py).
    `retrieval`: the store of the target's past answers for the retrieved branch (the `retrieval_nodes`
    option; default: the shipped `assets/retrieval/smollm2-135m.npz` for the default target, else none).
    A missing or bad store leaves the branch off with one log line; it never fails the load.
    """
    from nanospec.loaders.loading import check_dtype_supported, load_target, resolve_device, resolve_dtype

    torch_device = resolve_device(device)
    check_dtype_supported(resolve_dtype(dtype, torch_device), torch_device)  # before any download or weight read
    name = model
    if isinstance(model, str) and not is_default_alias(model) and not Path(model).expanduser().exists():
        model = str(hub.fetch_folder(model, "target", progress))  # a hub id: downloaded, then a folder
    loaded = load_target(model, device=device, dtype=dtype, progress=progress, trust_remote_code=trust_remote_code)
    target = loaded.model
    if head is None and is_default_alias(model) and DEFAULT_HEAD.exists():
        head = DEFAULT_HEAD
    draft = None
    if head is not None:
        head_path = hub.fetch_folder(str(head), "draft head", progress)
        if is_eagle3_folder(head_path):
            draft = load_eagle3(head_path, target=target, device=loaded.device, dtype=loaded.dtype)
        else:
            draft = load_head(head_path, target=target, device=loaded.device, dtype=loaded.dtype)
    vocab = target.get_output_embeddings().weight.shape[0]
    engine = SpecEngine(target, loaded.tokenizer, draft, frequent_ids=_frequent_ids(freq_table, vocab),
                        pack_linears=pack_linears)
    info = PairInfo(target=loaded.name if name is None or loaded.source == "default" else str(name),
                    head=str(head) if head is not None else None, device=str(loaded.device),
                    dtype=str(loaded.dtype).removeprefix("torch."), vocab_size=vocab,
                    hidden_size=target.config.hidden_size, notes=list(draft.notes) if draft is not None else [],
                    head_family=head_family(draft))
    _attach_retrieval(engine, info, retrieval if retrieval is not None or not is_default_alias(model)
                      else DEFAULT_RETRIEVAL, explicit=retrieval is not None)
    return engine, info


def _attach_retrieval(engine: SpecEngine, info: PairInfo, path: str | Path | None, explicit: bool) -> None:
    """The engine's retrieval index from `path`, or none: one log line when a store was asked for and is
    missing or bad (`load_retrieval`), or when the default one is absent."""
    from nanospec.decoding.retrieved_branch import load_retrieval

    if path is None:
        return
    path = Path(path)
    if not explicit and not path.exists():
        logger.info("no retrieval store at %s (python -m nanospec.retrieval.build); retrieved drafts are off", path)
        return
    engine.retrieval = load_retrieval(path, engine.tokenizer)
    if engine.retrieval is not None:
        info.notes.append(f"retrieval store {path.name}: {len(engine.retrieval.store):,} tokens")


def _frequent_ids(freq_table: str | Path | None, vocab: int):
    """All ids by frequency from the table (None when the default table does not fit this vocabulary)."""
    from nanospec.data.freq_table import load_frequency_table, top_ids

    table = Path(freq_table) if freq_table is not None else DEFAULT_FREQ
    if not table.exists():
        if freq_table is not None:
            raise ValueError(f"frequency table {table} does not exist")
        return None
    counts = load_frequency_table(table, vocab_size=vocab)
    if counts.shape[0] == vocab:
        return top_ids(counts, vocab)
    if freq_table is not None:
        raise ValueError(f"frequency table {table} has {counts.shape[0]} entries; the target's vocabulary has {vocab}")
    return None



def head_family(head) -> str | None:
    """'eagle3' for an EAGLE-3 head, 'eagle' for an EAGLE-1/2 head, None for no head."""
    if head is None:
        return None
    return getattr(head, "family", "eagle")
