"""`cookbook demo [--out DIR]`: the main job, from a fresh machine to an HTML report of the CPU recipe."""
from __future__ import annotations

import argparse

from ..batch import run_demo
from .run import add_batch_args, notebook_list, parse_params, print_summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="set up the CPU image and model, launch the CPU recipe, run every notebook, write the report"
    )
    add_batch_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = run_demo(args.out, notebook_list(args.notebooks), parse_params(args.param))
    timings = ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value:.0f} s" for name, value in summary.timings.items())
    print_summary(summary)
    print(f"demo: {timings}")
    print(f"open {summary.run_dir}/{summary.index}")
    return 0 if summary.ok else 1
