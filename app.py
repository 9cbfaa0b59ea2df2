"""Launch NanoSpec Explorer (also the Hugging Face Space entry point).

    python app.py                       # offline default SmolLM2-135M-Instruct + shipped head, 0.0.0.0:7860
    python app.py --port 8000 --device cpu
    python app.py --model HuggingFaceTB/SmolLM2-135M-Instruct --head path/to/eagle-head
    python app.py --random-head         # UI development before a head exists (τ ≈ 1)
"""

from __future__ import annotations

import argparse
import logging
import os

from app.decoding import lower_server_priority
from app.models import pair_loader
from app.ui import build_app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="NanoSpec Explorer (Gradio app)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--model", default=None, help="target: hub id or folder (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--head", default=None, help="EAGLE-1/2 draft head folder (default: the shipped one)")
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
    lower_server_priority(args.ui_nice)
    if args.tiny:
        from app.devtools import tiny_loader

        loader = tiny_loader()
    else:
        loader = pair_loader(args.model, args.head, device=args.device, dtype=args.dtype,
                             random_head_if_missing=args.random_head)
    demo = build_app(loader, device_hint=args.device)
    demo.launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
