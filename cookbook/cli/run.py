"""`cookbook run RECIPE [--base-url URL | --launch] [--out DIR] [--notebooks a,b]`, `cookbook run --all` and `cookbook run --fleet FILE`."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_NOT_MET, EXIT_OK, EXIT_RUN_FAILED, UsageError
from ._common import add_hardware_arg, add_out_arg, add_param_arg, add_recipe_arg, parse_params as _parse_params
from ._progress import cli_progress

if TYPE_CHECKING:
    from ..run_folder import BatchSummary

EXAMPLES = """
  cookbook run HuggingFaceTB/SmolLM2-135M-Instruct --launch --notebooks verify,throughput --param STREAMS=4
  cookbook run Qwen/Qwen3-Coder-Next --base-url http://gaudi-box:8000 --hardware "gaudi2:four Gaudi 2 cards"
  cookbook run --all --out runs/nightly
  cookbook run --fleet docs/examples/fleet-cpu.yaml --out runs/fleet
"""


def add_batch_args(parser: argparse.ArgumentParser) -> None:
    """Arguments `run` and `demo` share."""
    add_out_arg(parser, "the run folder (absent or empty; default runs/<time>-<recipe>)")
    parser.add_argument("--notebooks", help="comma-separated notebooks, e.g. verify,throughput (default: all)")
    add_param_arg(parser, "a notebook parameter (the notebooks' parameters cells)", "STREAMS=4")


def parse_params(items: list[str]) -> dict[str, Any]:
    """--param NAME=VALUE for the notebooks: the one grammar, with the notebooks' upper-case names (which notebook
    takes which is checked when the run is planned, before anything runs)."""
    return _parse_params(items, upper_case_keys=True)


def exit_code(summary: BatchSummary) -> int:
    """5 if a notebook failed (the run broke), else 0: the checks' verdicts are the report's to show, as ever."""
    return EXIT_OK if summary.ok else EXIT_RUN_FAILED


def notebook_list(text: str | None) -> list[str | Path] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def print_summary(summary: BatchSummary) -> None:
    from ..results import read_results

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


def configure(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser, optional=True, help="recipe id or path (omit with --all)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--base-url", metavar="URL", help="attach to this running server")
    target.add_argument("--launch", action="store_true", help="launch the recipe's server for the run (the default)")
    target.add_argument("--all", action="store_true", help="every recipe this machine can serve, each launched")
    target.add_argument("--fleet", type=Path, metavar="FILE",
                        help="a fleet file (YAML: recipe + base_url or launch: true, per server): every server at once, "
                        "each into OUT/<entry>/, plus OUT/index.html (docs/fleet.md)")
    add_hardware_arg(parser, "what serves --base-url")
    add_batch_args(parser)
    parser.set_defaults(run=run)


def run_fleet_file(args: argparse.Namespace) -> int:
    """`run --fleet FILE --out DIR`: 0 when every server passed, 1 when the worst is checks not met, 5 when a server
    was unreachable, died, or its run failed or was interrupted."""
    from ..fleet import run_fleet
    from ..fleet_file import load_fleet

    if args.recipe:
        raise UsageError("--fleet: give no recipe id with --fleet (the fleet file names them)")
    if args.notebooks or args.param or args.hardware:
        raise UsageError("--fleet: --notebooks, --param and --hardware go in the fleet file")
    if args.out is None:
        raise UsageError("--fleet: give --out, the folder the fleet's run folders and index go into")
    summary = run_fleet(load_fleet(args.fleet), args.out)
    for entry in summary.entries:
        print(f"{entry.label}: {entry.status}" + (f" ({entry.why})" if entry.why else ""))
    print(f"report: {args.out / 'index.html'}")
    statuses = {e.status for e in summary.entries}
    if statuses - {"passed", "checks not met"}:
        return EXIT_RUN_FAILED
    return EXIT_NOT_MET if "checks not met" in statuses else EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.fleet:
        return run_fleet_file(args)
    from ..batch import run_all, run_recipe
    from ..recipes import load_recipe
    from ..run_folder import SkippedRecipe

    params = parse_params(args.param)
    notebooks = notebook_list(args.notebooks)
    if args.all:
        if args.recipe:
            raise UsageError("--all: give no recipe id with --all")
        code = EXIT_OK
        for outcome in run_all(args.out, notebooks, params, progress=cli_progress()):
            if isinstance(outcome, SkippedRecipe):
                print(f"{outcome.recipe}: skipped ({outcome.reason})")
            else:
                print_summary(outcome)
                code = max(code, exit_code(outcome))
        return code
    if not args.recipe:
        raise UsageError("run: give a recipe id, or --all")
    summary = run_recipe(load_recipe(args.recipe), args.base_url, args.out, notebooks, params, args.hardware,
                         progress=cli_progress())
    print_summary(summary)
    return exit_code(summary)
