"""Where the project's shipped files live (heads, frequency tables, prompts, lesson traces).

`ASSETS` is, in this order: the folder named by the environment variable `NANOSPEC_ASSETS`; the
copy installed with the package (`pip install .` ships the repository's `assets/` as
`nanospec/_assets`); the `assets/` folder of the source checkout this package sits in.
"""

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def find_assets(env: dict[str, str] | None = None) -> Path:
    """The assets folder (see the module docstring); the checkout's, even if missing, as the last resort."""
    override = (os.environ if env is None else env).get("NANOSPEC_ASSETS")
    if override:
        return Path(override).expanduser().resolve()
    installed = _PACKAGE / "_assets"
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / "assets"


ASSETS = find_assets()
