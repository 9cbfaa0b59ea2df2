"""The page's HTML and CSS templates (app/templates/): `string.Template` files, read once.

Values are substituted as given: callers escape text (`html.escape`) before it goes in."""

from __future__ import annotations

import functools
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).resolve().parent / "templates"


@functools.cache
def text(name: str) -> str:
    """The file `name` in app/templates/, as it is (a stylesheet, or a template before substitution)."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


@functools.cache
def template(name: str) -> Template:
    return Template(text(name))


def render(name: str, **values) -> str:
    """Template `name` with every `${key}` replaced by `values[key]` (a missing key raises KeyError)."""
    return template(name).substitute(values)
