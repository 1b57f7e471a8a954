"""`cookbook compare RUN_A RUN_B [--out DIR]`: checks that changed status, performance deltas, regressions, a figure."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..compare import DEFAULT_THRESHOLD, compare_runs, format_comparison, load_run
from ..errors import UsageError
from ..pages import write_atomic
from ..plots import comparison_figure, figure_path, save
from ..results import check_output_path
from ._common import add_out_arg

EXAMPLES = """
  cookbook compare runs/2026-11-30-smol runs/2026-12-01-smol                  # exit 1 on a regression
  cookbook compare runs/before/results.json runs/after/results.json --threshold 10 --out runs/compare
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the baseline")
    parser.add_argument("run_b", type=Path, metavar="RUN_B")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD * 100,
                        help=f"percent worse that counts as a regression (default {DEFAULT_THRESHOLD * 100:g})")
    add_out_arg(parser, "comparison.png and comparison.json")
    parser.add_argument("--figure", type=Path, metavar="FILE", help="write the comparison figure (PNG) to this file")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON to this file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold < 1000:  # NaN fails this too
        raise UsageError(f"--threshold: expected a percentage between 0 and 1000, got {args.threshold:g}")
    check_output_path(args.out, "--out", folder=True)
    if args.out is not None:  # --out DIR: both files in one folder
        args.figure, args.json = args.figure or args.out / "comparison.png", args.json or args.out / "comparison.json"
    figure = figure_path(args.figure) if args.figure else None
    check_output_path(figure, "--figure")  # before anything is read: the outputs must have somewhere to go
    check_output_path(args.json, "--json")
    a, b = load_run(args.run_a), load_run(args.run_b)
    comparison = compare_runs(a, b, args.threshold / 100, (str(args.run_a), str(args.run_b)))
    print(format_comparison(comparison))
    if figure is not None:
        save(comparison_figure(comparison), figure)
        print(f"figure: {figure}")
    if args.json:
        write_atomic(args.json, comparison.model_dump_json(indent=2) + "\n")
    return 0 if comparison.ok else 1
