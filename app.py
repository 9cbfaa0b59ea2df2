"""Launch NanoSpec Explorer (also the Hugging Face Space entry point).

    python app.py                       # offline default SmolLM2-135M-Instruct + shipped head, 0.0.0.0:7860
    python app.py --port 8000 --device cpu
    python app.py --preset llama-3.2-1b  # a pair from assets/presets.json (also: NANOSPEC_PRESET=...)
    python app.py --model meta-llama/Llama-3.2-1B-Instruct --head yuhuili/EAGLE-LLaMA3.2-Instruct-1B
    python app.py --random-head         # UI development before a head exists (τ ≈ 1)
"""

from __future__ import annotations

import argparse
import logging
import os

from app.decoding import lower_server_priority
from app import zerogpu
from app.models import pair_loader
from app.pairs import PairProvider, preset_provider
from app.poll.routes import poll_app_kwargs
from app.trace import MAX_UPLOAD_BYTES
from app.ui import build_app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="NanoSpec Explorer (Gradio app)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--preset", default=os.environ.get("NANOSPEC_PRESET"),
                        help="startup pair from assets/presets.json (default: $NANOSPEC_PRESET, else the file's default)")
    parser.add_argument("--model", default=None, help="target: hub id or folder (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--head", default=None, help="EAGLE-1/2 draft head: folder or hub id (default: the shipped one)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:0, mps (default: CUDA if available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: by device)")
    parser.add_argument("--ui-nice", type=int, default=int(os.environ.get("NANOSPEC_UI_NICE", "10")),
                        help="lower the web server's CPU priority by this much (Linux; 0 = off) so that decoding, "
                             "which keeps the normal priority, wins when both want the CPU")
    dev = parser.add_argument_group("development")
    dev.add_argument("--random-head", action="store_true",
                     help="give a target without a trained head a random one so every method runs")
    dev.add_argument("--tiny", action="store_true", help="a tiny random model instead of a real one")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # first, before any other thread exists: the decode thread keeps the normal priority, every thread
    # created after this (web server, queue, callbacks) inherits the lower one
    if not zerogpu.active():  # ZeroGPU: no decode thread at all (app/zerogpu.py)
        lower_server_priority(args.ui_nice)
    if args.tiny:
        from app.dev.devtools import tiny_loader

        demo = build_app(tiny_loader(), device_hint=args.device)
    else:
        demo = build_app(provider=startup_provider(args))
    # the class poll's phone pages (/poll/<code>) are plain routes of the same server (app/poll/routes.py)
    demo.launch(server_name=args.host, server_port=args.port, max_file_size=MAX_UPLOAD_BYTES,
                app_kwargs=poll_app_kwargs())


def startup_provider(args: argparse.Namespace) -> PairProvider:
    """Presets (plus the command line's --model/--head pair); on ZeroGPU the served pairs load here, in the
    main thread before the server starts: the startup preset and those named in $NANOSPEC_SPACE_PRESETS."""
    custom = None
    if args.model or args.head or args.random_head:
        custom = pair_loader(args.model, args.head, device=args.device, dtype=args.dtype,
                             random_head_if_missing=args.random_head)
    try:
        provider = preset_provider(args.device, startup=args.preset, custom=custom)
    except ValueError as err:
        raise SystemExit(f"app.py: {err}") from None
    if zerogpu.active():
        extra = [n.strip() for n in os.environ.get("NANOSPEC_SPACE_PRESETS", "").split(",") if n.strip()]
        zerogpu.preload(provider, [provider.current, *[n for n in extra if n != provider.current]])
    return provider


if __name__ == "__main__":
    main()
