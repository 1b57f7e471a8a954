"""`cookbook doctor [RECIPE] [--port N]`: what the recipe needs against what this box has; exit 1 if it cannot run."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..doctor import describe_box, diagnose, failed
from ..errors import UsageError
from ..image import ImageEnv
from ..recipes import load_recipe
from ._common import add_recipe_arg

EXAMPLES = """
  cookbook doctor                               # this box alone
  cookbook doctor Qwen/Qwen3-Coder-Next         # can this box run the recipe? exit 1 if not
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser, optional=True, help="recipe id or path (omit: the box alone)")
    parser.add_argument("--port", type=int, default=8000, help="the port the server will use (default 8000)")
    parser.add_argument("--image-python", type=Path, metavar="PATH",
                        help="the serving image's interpreter, whose site-packages are read (default: the CPU image "
                        "for CPU recipes, else python3 here: run doctor inside the vllm-gaudi container, or give this)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe) if args.recipe else None
    image = None
    if args.image_python is not None:
        if not args.image_python.is_file():
            raise UsageError(f"--image-python: {args.image_python} is not a file")
        image = ImageEnv(python=args.image_python, bin_dir=args.image_python.parent)
    lines = diagnose(recipe, port=args.port, image=image)
    for line in lines:
        print(line.render())
    if recipe is not None:
        print(f"{recipe.id}: {'cannot run here' if failed(lines) else 'can run here'}")
    else:
        print(f"this box: {describe_box(lines)}" + ("; problems found (FAIL above)" if failed(lines) else ""))
    return 1 if failed(lines) else 0
