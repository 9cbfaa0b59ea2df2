"""What the UI keeps of a run (events + token text), its downloads, and replay of saved traces."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nanospec import metrics
from nanospec.events import RunSummary, StepEvent, events_to_frame, load_trace, save_trace

PENDING = "\ufffd"  # what a byte-level tokenizer decodes half a UTF-8 character to
MAX_UPLOAD_BYTES = 10 * 2**20  # a trace of a 512-token run is well under 2 MB


def upload_folder() -> Path:
    """Where Gradio keeps uploaded files (its `GRADIO_TEMP_DIR`, by default `<temp>/gradio`)."""
    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio").resolve()


def uploaded_file(path: str | Path) -> Path:
    """`path` if it is a file inside Gradio's upload folder and at most `MAX_UPLOAD_BYTES`, else ValueError.

    Gradio itself refuses API calls that name files nobody uploaded; this check keeps that true
    whatever reaches the callback."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(upload_folder()) or not resolved.is_file():
        raise ValueError(f"{Path(path).name} was not uploaded to this app")
    size = resolved.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise ValueError(f"{resolved.name} is {size / 2**20:.1f} MB; traces up to {MAX_UPLOAD_BYTES // 2**20} MB "
                         "are accepted")
    return resolved


class TokenDecoder:
    """Text of each emitted token, decoded incrementally so multi-byte characters come out whole.

    Without a tokenizer every token shows as its id, e.g. ``⟨1234⟩``.
    """

    WINDOW = 48  # re-decode at most this many trailing ids per token

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._start = 0        # first id of the decode window
        self._printed = 0      # characters of the window's text already handed out
        self._single: dict[int, str] = {}
        # special tokens (end of sequence, chat markers) are not part of the answer's text
        self.special_ids: set[int] = set(getattr(tokenizer, "all_special_ids", None) or ())

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"⟨{token_id}⟩ "
        self._ids.append(int(token_id))
        text = self._decode(self._ids[self._start:])
        if text.endswith(PENDING):
            return ""  # half a character: the next token carries it
        piece = text[self._printed:]
        self._printed = len(text)
        if len(self._ids) - self._start > self.WINDOW:  # slide the window, keeping a few ids of context
            self._start = len(self._ids) - 4
            self._printed = len(self._decode(self._ids[self._start:]))
        return piece

    def text_of(self, token_id: int) -> str:
        """One token on its own (tree hovers)."""
        token_id = int(token_id)
        if token_id not in self._single:
            self._single[token_id] = self._decode([token_id]) if self.tokenizer is not None else f"⟨{token_id}⟩"
        return self._single[token_id]


@dataclass
class RunView:
    """Everything the charts need about one run; picklable (plain lists, dicts and dataclasses)."""

    events: list[StepEvent] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)          # text of each emitted token
    token_text: dict[int, str] = field(default_factory=dict)  # tree/bonus token id -> text
    summary: RunSummary | None = None
    meta: dict = field(default_factory=dict)
    wall_s: float = 0.0
    origins: list[str] = field(default_factory=list)          # where each emitted token came from
    special: list[bool] = field(default_factory=list)         # each emitted token is a special token (EOS, ...)
    stopped: bool = False                                     # Stop ended the run before its end

    def add(self, event: StepEvent, decoder: TokenDecoder) -> None:
        from app.charts import ORIGIN_LABELS

        self.events.append(event)
        self.pieces.extend(decoder.push(t) for t in event.tokens)
        self.special.extend(t in decoder.special_ids for t in event.tokens)
        self.origins.extend(ORIGIN_LABELS[o] for o in metrics.event_origins(event))
        for t in (*event.tree_tokens, event.bonus_token):
            if t not in self.token_text:
                self.token_text[t] = decoder.text_of(t)

    def snapshot(self) -> "RunView":
        """A copy whose lists the running decode cannot grow while the copy is drawn."""
        return RunView(events=list(self.events), pieces=list(self.pieces), token_text=dict(self.token_text),
                       summary=self.summary, meta=dict(self.meta), wall_s=self.wall_s, origins=list(self.origins),
                       special=list(self.special), stopped=self.stopped)

    def frame(self) -> pd.DataFrame:
        return events_to_frame(self.events)

    @property
    def last_step(self) -> int:
        return self.events[-1].step if self.events else 0


def save_downloads(view: RunView, folder: str | Path | None = None) -> tuple[Path, Path]:
    """Write the run as `<folder>/nanospec-trace.csv` and `.json` (re-loadable by `load_trace`)."""
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="nanospec-"))
    name = f"nanospec-{view.events[0].method if view.events else 'run'}-trace"
    meta = {**view.meta, "pieces": view.pieces, "special": view.special,
            "token_text": {str(k): v for k, v in view.token_text.items()}}
    csv_path = save_trace(folder / f"{name}.csv", view.events, view.summary, meta)
    json_path = save_trace(folder / f"{name}.json", view.events, view.summary, meta)
    return csv_path, json_path


def load_view(path: str | Path, tokenizer=None) -> RunView:
    """A saved trace as a `RunView`; token text from the trace, else `tokenizer` (pass one only when it
    belongs to the trace's model), else ids.

    Raises ValueError when the file is not a NanoSpec trace.
    """
    events, summary, meta = load_trace(path)
    if not events:
        raise ValueError(f"{Path(path).name} holds no steps")
    meta = dict(meta or {})
    pieces = meta.pop("pieces", None)
    special = meta.pop("special", None)
    saved_text = {int(k): v for k, v in (meta.pop("token_text", None) or {}).items()}
    n_tokens = sum(len(e.tokens) for e in events)
    view = RunView(summary=summary, meta=meta,
                   wall_s=summary.wall_s if summary else sum(e.wall_ms for e in events) / 1e3)
    decoder = TokenDecoder(tokenizer)
    for event in events:
        view.add(event, decoder)
    if isinstance(pieces, list) and len(pieces) == n_tokens:
        view.pieces = [str(p) for p in pieces]
    if isinstance(special, list) and len(special) == n_tokens:
        view.special = [bool(x) for x in special]
    view.token_text.update(saved_text)
    return view
