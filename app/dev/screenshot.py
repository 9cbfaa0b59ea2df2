"""Retake the README's screenshot: the Live tab after a run of the default pair, in headless Chromium.

    python -m app.dev.screenshot [--out docs/screenshot.png] [--example qa:] [--max-new-tokens 48] [--replay]

Launches the app on the offline default pair, runs one example prompt with the app's defaults (the
context-copy chain and the draft budget on, as on a CPU), waits until the run has finished, checks
the machine was steady while it ran (`nanospec.bench.trust`: the figures in the picture must
not be those of a busy machine) and writes the page. Run it on an idle machine; it refuses
otherwise. Needs Debian's `chromium` and `pip install playwright` (no `playwright install`).

`--replay`: the browser redraws every step's charts on the same cores as the decoding, so a run
streamed to it is slower than the engine. With `--replay` the run is decoded first with no
browser (the same prompt and settings), saved as a trace, and the picture shows that trace
replayed in the Live tab: the engine's own speed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from nanospec.timing import MIN_CPU_SHARE, metered

ROOT = Path(__file__).resolve().parents[2]  # the repository (app/dev/screenshot.py)
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def record(example: str, max_new_tokens: int, path: Path) -> float:
    """Decode `example` with the app's defaults and no browser, save the trace; the CPU share while it ran."""
    from nanospec.config import GenerationConfig
    from nanospec.events import save_trace
    from nanospec.pair import load_pair

    from app.callbacks import cost_curve_meta
    from app.inputs import defaults_for, example_prompts

    text = next(t for label, t in example_prompts() if example in label or example in t)
    engine, info = load_pair()
    options = {k: v for k, v in defaults_for(engine.device).items() if k != "method"}
    cfg = GenerationConfig.build("nanospec", **{**options, "max_new_tokens": max_new_tokens})
    engine.generate(text, cfg)  # warm-up (and the draft budget's cost curve), untimed
    with metered() as meter:
        result = engine.generate(text, cfg)
    save_trace(path, result.events, result.summary, meta={"target": info.target, "prompt": text,
                                                          "config": cfg.to_dict(),
                                                          "cost_curve": cost_curve_meta(engine)})
    return meter.cpu_share


def take(out: Path, example: str, max_new_tokens: int, width: int = 1400, replay: Path | None = None) -> float:
    """Run `example` in the Live tab (then show the `replay` trace, if given) and screenshot the
    page; returns the CPU share while the browser's run streamed."""
    from playwright.sync_api import sync_playwright

    from app.models import pair_loader
    from app.ui import build_app

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    demo = build_app(pair_loader())
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.set_default_timeout(300_000)
            page.goto(url, wait_until="load")
            page.locator("#run-btn").wait_for(state="visible")
            box = page.locator("#prompt textarea")
            for _ in range(10):  # a click before the page's handlers attach is lost
                page.get_by_text(example, exact=False).first.click()
                page.wait_for_timeout(300)
                if box.input_value().strip():
                    break
            tokens = page.locator("#max-new-tokens input[type=number]")
            tokens.fill(str(max_new_tokens))
            tokens.press("Enter")
            # a first, untimed run loads the model and warms it up; the picture shows the second
            page.locator("#run-btn").click()
            page.locator("#json-btn:not([disabled])").first.wait_for()
            page.wait_for_timeout(1000)
            with metered() as meter:
                page.locator("#run-btn").click()
                page.wait_for_timeout(500)
                page.locator("#json-btn:not([disabled])").first.wait_for()
            page.wait_for_timeout(1500)
            if replay is not None:  # the trace decoded without a browser, shown as the finished run
                page.get_by_text("Replay a saved trace", exact=False).first.click()
                page.locator("#replay-file input[type=file]").set_input_files(str(replay))
                page.wait_for_timeout(8000)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
    finally:
        demo.close()
    return meter.cpu_share


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.dev.screenshot", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    ap.add_argument("--example", default="qa:", help="text of the example prompt to click")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--replay", action="store_true",
                    help="decode without the browser first and show that trace (the engine's own speed)")
    a = ap.parse_args(argv)
    trace = None
    if a.replay:
        import tempfile
        trace = Path(tempfile.mkdtemp()) / "screenshot_run.json"
        share = record(a.example, a.max_new_tokens, trace)
        print(f"cpu share while the run decoded (no browser): {share:.2f}", file=sys.stderr)
        if share < MIN_CPU_SHARE:
            print(f"the machine was busy (cpu share {share:.2f}); no screenshot taken", file=sys.stderr)
            return 1
    share = take(Path(a.out), a.example, a.max_new_tokens, replay=trace)
    if trace is not None:  # the browser's own run is not in the picture: only the recorded one counts
        print(f"wrote {a.out}", file=sys.stderr)
        return 0
    # the app decodes on its own thread while this one waits on the browser: across both, an idle
    # machine keeps the process busy; another job on the machine shows as a lower share
    print(f"cpu share while the run streamed: {share:.2f}", file=sys.stderr)
    if share < MIN_CPU_SHARE / 2:
        print(f"the machine was busy (cpu share {share:.2f}); the screenshot at {a.out} is not fit for the README",
              file=sys.stderr)
        return 1
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
