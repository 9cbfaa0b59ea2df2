"""The recorder's pair: load the target and head a recording is made with, label them, and read the
tokens a trace shows (what each emitted token adds to the text, the target's top-3 at every position)."""

from __future__ import annotations

from pathlib import Path

import torch

from nanospec.paths import ASSETS


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Text each emitted token adds (decoding the growing prefix keeps multi-byte characters whole)."""
    pieces, before = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(before):])
        before = text
    return pieces


@torch.inference_mode()
def target_top3(engine, ids: list[int]) -> list[list[int]]:
    """The target's top-3 next-token guesses at every position of `ids` (one teacher-forced forward)."""
    x = torch.tensor([ids], device=engine.device)                      # [1, n]
    logits = engine.model(input_ids=x).logits[0]                       # [n, V]
    return torch.topk(logits, 3, dim=-1).indices.tolist()


def load_engine(head: str | None, device: str | None):
    from nanospec.pair import load_pair

    if head == "random":
        from nanospec.bench.random_pair import random_head

        engine, info = load_pair(None, device=device)
        from nanospec.decoding.engine import SpecEngine
        rh = random_head(engine.model.config, dtype=engine.lm_head_weight.dtype).to(engine.device)
        engine = SpecEngine(engine.model, engine.tokenizer, rh, frequent_ids=engine.frequent_ids)
        return engine, {"target": info.target, "head": "random untrained head (development only)",
                        "head_kind": "random", "device": info.device, "dtype": info.dtype,
                        "vocab_size": info.vocab_size, "hidden_size": info.hidden_size}
    engine, info = load_pair(None, head, device=device)
    if engine.head is None:
        raise ValueError("no draft head: the shipped head (assets/heads/smollm2-135m-eagle/) is missing; "
                         "pass --head FOLDER, or --head random for development traces")
    return engine, {"target": info.target, "head": _relative(info.head), "head_kind": "shipped" if head is None
                    else "given", "head_sha256": head_digest(Path(info.head)), "device": info.device,
                    "dtype": info.dtype, "vocab_size": info.vocab_size, "hidden_size": info.hidden_size}


def head_digest(folder: Path) -> str | None:
    """sha256 of the head's weight file: ties the traces to the exact head they were recorded with."""
    import hashlib

    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).exists():
            return hashlib.sha256((folder / name).read_bytes()).hexdigest()
    return None


def _relative(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(ASSETS.parent))
    except ValueError:
        return path
