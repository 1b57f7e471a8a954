"""`cookbook compare RUN_A RUN_B [RUN ...] [--out DIR]`: two runs: checks that changed status, performance deltas,
regressions, a figure; three or more: the trend of the headline figures with regressions marked."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from ..compare import DEFAULT_THRESHOLD, compare_runs, format_comparison, format_trend, load_run, trend_runs
from ..errors import UsageError
from ..pages import write_atomic
from ..plots import comparison_figure, figure_path, save, trend_figure
from ..results import check_output_path
from ._common import add_out_arg

EXAMPLES = """
  cookbook compare runs/2026-11-30-smol runs/2026-12-01-smol                  # exit 1 on a regression
  cookbook compare runs/before/results.json runs/after/results.json --threshold 10 --out runs/compare
  cookbook compare runs/*-smol --order date --out runs/trend     # trend.png, trend.json; exit 1 if the last regressed
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the baseline")
    parser.add_argument("run_b", type=Path, metavar="RUN_B")
    parser.add_argument("more", type=Path, nargs="*", metavar="RUN", help="more runs: a trend over all of them")
    parser.add_argument("--baseline", choices=("previous", "first"), default="previous",
                        help="a trend's regressions: each run against the previous run (default) or the first")
    parser.add_argument("--order", choices=("given", "date"), default="given",
                        help="a trend's runs as given (default) or by their start time")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD * 100,
                        help=f"percent worse that counts as a regression (default {DEFAULT_THRESHOLD * 100:g})")
    add_out_arg(parser, "comparison.png and comparison.json (a trend: trend.png and trend.json)")
    parser.add_argument("--figure", type=Path, metavar="FILE", help="write the comparison figure (PNG) to this file")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON to this file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold < 1000:  # NaN fails this too
        raise UsageError(f"--threshold: expected a percentage between 0 and 1000, got {args.threshold:g}")
    check_output_path(args.out, "--out", folder=True)
    stem = "trend" if args.more else "comparison"
    if args.out is not None:  # --out DIR: both files in one folder
        args.figure, args.json = args.figure or args.out / f"{stem}.png", args.json or args.out / f"{stem}.json"
    figure = figure_path(args.figure) if args.figure else None
    check_output_path(figure, "--figure")  # before anything is read: the outputs must have somewhere to go
    check_output_path(args.json, "--json")
    if args.more:  # three or more runs: the trend
        paths = [args.run_a, args.run_b, *args.more]
        trend = trend_runs([load_run(p) for p in paths], [str(p) for p in paths], args.threshold / 100, args.baseline,
                           args.order)
        return _write(format_trend(trend), lambda: trend_figure(trend), trend, trend.ok, figure, args.json)
    a, b = load_run(args.run_a), load_run(args.run_b)
    comparison = compare_runs(a, b, args.threshold / 100, (str(args.run_a), str(args.run_b)))
    return _write(format_comparison(comparison), lambda: comparison_figure(comparison), comparison, comparison.ok,
                  figure, args.json)


def _write(text: str, draw: Callable[[], Any], record: BaseModel, ok: bool, figure: Path | None, json_path: Path | None) -> int:
    """Print the text, save the figure and the JSON where asked; exit 1 when not ok (a regression, a check failing)."""
    print(text)
    if figure is not None:
        save(draw(), figure)
        print(f"figure: {figure}")
    if json_path:
        write_atomic(json_path, record.model_dump_json(indent=2) + "\n")
    return 0 if ok else 1
