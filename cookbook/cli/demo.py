"""`cookbook demo [--out DIR]`: the main job, from a fresh machine to an HTML report of the CPU recipe."""
from __future__ import annotations

import argparse

from ._progress import cli_progress
from .run import add_batch_args, exit_code, notebook_list, parse_params, print_summary

EXAMPLES = """
  cookbook demo                       # what `make demo` runs
  cookbook demo --out runs/demo --notebooks verify,throughput
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_batch_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..batch import run_demo

    summary = run_demo(args.out, notebook_list(args.notebooks), parse_params(args.param), progress=cli_progress())
    timings = ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value:.0f} s" for name, value in summary.timings.items())
    print_summary(summary)
    print(f"demo: {timings}")
    print(f"open {summary.run_dir}/{summary.index}")
    return exit_code(summary)
