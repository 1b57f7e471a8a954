"""`cookbook page RECIPE [--results RUN_DIR|results.json] [--out DIR]`: the recipe page in Markdown."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..pages import default_results, render_page, write_atomic
from ..recipes import load_recipe
from ..results import RunResults, read_results
from ._common import add_out_arg, add_recipe_arg, out_file

EXAMPLES = """
  cookbook page Qwen/Qwen3-Coder-Next                                   # printed, with the recipe's published results
  cookbook page HuggingFaceTB/SmolLM2-135M-Instruct --results runs/2026-12-01-smol --out runs/2026-12-01-smol
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser)
    parser.add_argument(
        "--results", type=Path, help="a run's results.json or run folder (default: the results.json beside the recipe)"
    )
    add_out_arg(parser, "write page.md in it instead of printing the page")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = out_file(args.out, "page.md", ".md")  # before anything is read: the page must have somewhere to go
    recipe = load_recipe(args.recipe)
    if args.results is not None:
        path = args.results / "results.json" if args.results.is_dir() else args.results
        results: RunResults | None = read_results(path)
    else:
        results = default_results(recipe)
    text = render_page(recipe, results)
    if out is not None:
        write_atomic(out, text)
        print(f"wrote {out}")
    else:
        print(text, end="")
    return 0
