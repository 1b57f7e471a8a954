"""`cookbook run RECIPE [--base-url URL | --launch] [--out DIR] [--notebooks a,b]` and `cookbook run --all`."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml

from ..batch import run_all, run_recipe
from ..errors import CookbookError
from ..recipes import load_recipe
from ..results import read_results
from ..run_folder import BatchSummary, SkippedRecipe

_PARAM = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$", re.S)


def add_batch_args(parser: argparse.ArgumentParser) -> None:
    """Arguments `run` and `demo` share."""
    parser.add_argument("--out", type=Path, help="the run folder (absent or empty; default runs/<time>-<recipe>)")
    parser.add_argument("--notebooks", help="comma-separated notebooks, e.g. verify,throughput (default: all)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a notebook parameter (VALUE read as YAML), e.g. --param CONCURRENCY=4; repeatable")


def parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        match = _PARAM.match(item)
        if not match:
            raise CookbookError(f"--param: expected NAME=VALUE with an upper-case NAME, got {item!r}")
        try:
            params[match.group(1)] = yaml.safe_load(match.group(2))
        except yaml.YAMLError:
            raise CookbookError(f"--param: {match.group(1)}: the value is not valid YAML") from None
    return params


def notebook_list(text: str | None) -> list[str | Path] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def print_summary(summary: BatchSummary) -> None:
    print(f"{summary.recipe}: {summary.headline}")
    for nb in summary.notebooks:
        line = f"  {nb.name:<18} {nb.status:<7} {nb.seconds:6.0f} s"
        print(line + (f"  {nb.error}" if nb.error else ""))
    if summary.secrets_masked:
        print(f"  masked secret values in: {', '.join(summary.secrets_masked)}")
    results_path = Path(summary.run_dir) / summary.results if summary.results else None
    if results_path is not None and results_path.is_file():
        print(f"  {read_results(results_path).check_summary()}")
    print(f"  report: {Path(summary.run_dir) / summary.index}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="execute the notebook set headless against a server, into a report folder")
    parser.add_argument("recipe", metavar="ID", nargs="?", help="recipe id (omit with --all)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--base-url", help="attach to this running server")
    target.add_argument("--launch", action="store_true", help="launch the recipe's server for the run (the default)")
    target.add_argument("--all", action="store_true", help="every recipe this machine can serve, each launched")
    target.add_argument("--fleet", type=Path, metavar="FILE",
                        help="a fleet file (YAML: recipe + base_url or launch: true, per server): every server at once, "
                        "each into OUT/<entry>/, plus OUT/index.html")
    parser.add_argument("--hardware", metavar="KIND:DESCRIPTION",
                        help="what serves --base-url, e.g. 'gaudi2:four Gaudi 2 cards' (default: this machine for CPU recipes)")
    add_batch_args(parser)
    parser.set_defaults(run=run)


def run_fleet_file(args: argparse.Namespace) -> int:
    from ..fleet import run_fleet
    from ..fleet_file import load_fleet

    if args.recipe:
        raise CookbookError("--fleet: give no recipe id with --fleet (the fleet file names them)")
    if args.notebooks or args.param or args.hardware:
        raise CookbookError("--fleet: --notebooks, --param and --hardware go in the fleet file")
    if args.out is None:
        raise CookbookError("--fleet: give --out, the folder the fleet's run folders and index go into")
    fleet = load_fleet(args.fleet)
    summary = run_fleet(fleet, args.out)
    for entry in summary.entries:
        print(f"{entry.label}: {entry.status}" + (f" ({entry.why})" if entry.why else ""))
    print(f"report: {args.out / 'index.html'}")
    return 0 if summary.ok else 1


def run(args: argparse.Namespace) -> int:
    if args.fleet:
        return run_fleet_file(args)
    params = parse_params(args.param)
    notebooks = notebook_list(args.notebooks)
    if args.all:
        if args.recipe:
            raise CookbookError("--all: give no recipe id with --all")
        failed = False
        for outcome in run_all(args.out, notebooks, params):
            if isinstance(outcome, SkippedRecipe):
                print(f"{outcome.recipe}: skipped ({outcome.reason})")
            else:
                print_summary(outcome)
                failed = failed or not outcome.ok
        return 1 if failed else 0
    if not args.recipe:
        raise CookbookError("run: give a recipe id, or --all")
    summary = run_recipe(load_recipe(args.recipe), args.base_url, args.out, notebooks, params, args.hardware)
    print_summary(summary)
    return 0 if summary.ok else 1
