"""`cookbook compare RUN_A RUN_B`: checks that changed status, performance deltas, regressions, a figure."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..compare import DEFAULT_THRESHOLD, compare_runs, format_comparison, load_run
from ..errors import CookbookError
from ..pages import write_atomic
from ..plots import comparison_figure, figure_path, save
from ..results import check_output_path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("compare", help="compare two runs (run folders or results.json files)")
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the baseline")
    parser.add_argument("run_b", type=Path, metavar="RUN_B")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD * 100,
                        help=f"percent worse that counts as a regression (default {DEFAULT_THRESHOLD * 100:g})")
    parser.add_argument("--figure", type=Path, help="write the comparison figure (PNG) here")
    parser.add_argument("--json", type=Path, help="write the comparison as JSON here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold < 1000:  # NaN fails this too
        raise CookbookError(f"--threshold: expected a percentage between 0 and 1000, got {args.threshold:g}")
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
