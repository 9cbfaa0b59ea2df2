"""NanoSpec Explorer, the Gradio app: `build_app()` builds it, the root `app.py` launches it."""

from app.ui import build_app

__all__ = ["build_app"]
