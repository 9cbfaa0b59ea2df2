"""Where the project's shipped files live (heads, frequency tables, prompts, lesson traces)."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
