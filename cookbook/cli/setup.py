"""`cookbook setup`: build the CPU image and the CPU recipes' models into the cache (idempotent)."""
from __future__ import annotations

import argparse
import time

from ..image import detect_image, ensure_cpu_image
from ..models import MODELS, ensure_model
from ._progress import cli_progress


EXAMPLES = """
  cookbook setup                     # the CPU image and every CPU recipe's model
  cookbook setup smollm2-135m-instruct   # one model
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", choices=[[], *MODELS], metavar="MODEL", help=f"default: all of {', '.join(MODELS)}")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    progress = cli_progress()  # each build step with pip's or the conversion's last line, instead of minutes of silence
    image = ensure_cpu_image(progress=progress)
    print(f"image: {detect_image(image).describe()} at {image.python.parent.parent}")
    for name in args.models or list(MODELS):
        print(f"model: {name} at {ensure_model(name, image, progress)}")
    print(f"setup done in {time.monotonic() - started:.1f} s")
    return 0
