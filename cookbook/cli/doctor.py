"""`cookbook doctor [RECIPE] [--port N]`: what the recipe needs against what this box has; exit 1 if it cannot run."""
from __future__ import annotations

import argparse

from ..doctor import diagnose, failed
from ..recipes import load_recipe


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="what a recipe needs against what this box has, one line each")
    parser.add_argument("recipe", metavar="ID", nargs="?", help="recipe id or path (omit: the box alone)")
    parser.add_argument("--port", type=int, default=8000, help="the port the server will use (default 8000)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe) if args.recipe else None
    lines = diagnose(recipe, port=args.port)
    for line in lines:
        print(line.render())
    verdict = "cannot run here" if failed(lines) else "can run here"
    print(f"{recipe.id if recipe else 'this box'}: {verdict}" if recipe else f"this box: {'problems found' if failed(lines) else 'ok'}")
    return 1 if failed(lines) else 0
