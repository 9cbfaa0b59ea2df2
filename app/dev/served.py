"""The app as a separate server process, for tools that drive it through `gradio_client` (bench_app, soak)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (app/dev/served.py)


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, *app_args: str, log=subprocess.DEVNULL) -> subprocess.Popen:
    """`python app.py --host 127.0.0.1 --port PORT APP_ARGS...` in its own process."""
    return subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port), *app_args],
                            cwd=ROOT, stdout=log, stderr=log)


def connect(url: str, server: subprocess.Popen, timeout_s: float = 300.0, download_files: bool = True):
    """A `gradio_client.Client` for `url`, retried until the server answers (or exits, or `timeout_s`)."""
    from gradio_client import Client

    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the app exited with code {server.returncode} before it served")
        try:
            return Client(url, verbose=False, **({} if download_files else {"download_files": False}))
        except Exception:  # noqa: BLE001 — not up yet
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def stop_app(server: subprocess.Popen, timeout_s: float = 30.0) -> None:
    server.terminate()
    try:
        server.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout_s)
