"""`cookbook page RECIPE [--results results.json] [--out FILE]`: the recipe page in Markdown."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..pages import default_results, render_page, write_atomic
from ..recipes import load_recipe
from ..results import check_output_path, read_results


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("page", help="render a recipe page (Markdown) from the recipe and a run's results")
    parser.add_argument("recipe", metavar="ID")
    parser.add_argument(
        "--results", type=Path, help="a run's results.json or run folder (default: the results.json beside the recipe)"
    )
    parser.add_argument("--out", type=Path, help="write the page here instead of printing it")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_output_path(args.out, "--out")
    recipe = load_recipe(args.recipe)
    if args.results is not None:
        path = args.results / "results.json" if args.results.is_dir() else args.results
        results = read_results(path)
    else:
        results = default_results(recipe)
    text = render_page(recipe, results)
    if args.out:
        write_atomic(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
