"""What the Live and Compare callbacks share: errors for the page, figure payloads, sessions, status lines."""

from __future__ import annotations

import html
import logging

import gradio as gr
import plotly.io as pio
from gradio.components.plot import PlotData

from app.templating import render

logger = logging.getLogger("nanospec.app")


def fail(context: str, exc: BaseException | str) -> gr.Error:
    """A gr.Error for the page and a one-line warning (no traceback) for the server log."""
    message = f"{context}: {exc}" if str(exc) else context
    logger.warning("%s", " ".join(message.split()))
    return gr.Error(message, print_exception=False)


def plot_data(spec: dict) -> PlotData:
    """A figure dict as `gr.Plot`'s payload, serialised without building a `go.Figure` (see `charts`)."""
    return PlotData(type="plotly", plot=pio.to_json(spec, validate=False))


def session_of(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None


def loading_note(elapsed_s: float, latest: str = "") -> str:
    """The status line while the first run loads the model (shown where the KPIs appear)."""
    return render("loading_note.html", seconds=f"{elapsed_s:.0f}",
                  detail=f" · {html.escape(latest)}" if latest else "")
