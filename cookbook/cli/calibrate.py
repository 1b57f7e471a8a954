"""`cookbook calibrate RECIPE [--runs N] [--checks a,b] [--base-url URL] [--margin X] [--dry-run]`: run the checks
N times against a clean server and write the recipe's measured tolerances to calibration.yaml beside it.

Without --base-url the recipe's own server is started, a fresh one for every run (--no-restart: one for all).
Prints each tolerance measured and allowed, and the notes (checks that failed on the clean server, noise as large
as the fault a check exists for); exits 1 when a check failed on the clean server (the file is still written).
"""
from __future__ import annotations

import argparse
import math
import sys

from ..calibrate import MARGIN_FACTOR, calibrate, calibration_path, calibration_yaml, saw_failures
from ..errors import EXIT_NOT_MET, UsageError
from ..recipes import Calibration
from ._common import add_param_arg, add_recipe_arg, parse_params, recipe_from
from ._progress import cli_progress

EXAMPLES = """
  cookbook calibrate HuggingFaceTB/SmolLM2-135M-Instruct --runs 5                 # starts the server, 5 fresh starts
  cookbook calibrate HuggingFaceTB/SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000 --checks engine-states
  cookbook calibrate Qwen/Qwen3-Coder-Next --base-url http://gaudi-box:8000 --runs 3 --dry-run
"""

DEFAULT_RUNS = 3


def configure(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser, help="recipe id or path (calibration.yaml is written beside its recipe.yaml)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, metavar="N",
                        help=f"clean runs of the checks (default {DEFAULT_RUNS})")
    parser.add_argument("--checks", metavar="A,B", help="checks or groups to run; default: the recipe's suite")
    parser.add_argument("--base-url", metavar="URL",
                        help="attach to this running server (never restarted); default: start the recipe's own")
    parser.add_argument("--margin", type=float, default=MARGIN_FACTOR, metavar="X",
                        help=f"allowed = X times the largest clean value (and one rounding step above it for "
                        f"logprob differences; default {MARGIN_FACTOR:g})")
    parser.add_argument("--dry-run", action="store_true", help="print the calibration.yaml instead of writing it")
    parser.add_argument("--no-restart", action="store_true",
                        help="with the recipe's own server: start it once for every run instead of once per run")
    parser.add_argument("--launch-profile", metavar="NAME",
                        help="with the recipe's own server: its verification.launch_profiles entry, e.g. engine-states")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="wall-clock seconds one request may take (default 60)")
    add_param_arg(parser, "a check parameter", "batch_sizes=2,4")
    parser.set_defaults(run=run)


def _checks(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError("--checks: empty name in the list (write e.g. batch-composition,same-step)")
    return names


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UsageError(f"--runs: must be at least 1, got {args.runs}")
    if not (math.isfinite(args.margin) and args.margin >= 1):
        raise UsageError(f"--margin: must be a factor of at least 1 (e.g. {MARGIN_FACTOR:g}), got {args.margin:g}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout: must be a positive number of seconds, got {args.timeout:g}")
    if args.base_url and args.no_restart:
        raise UsageError("--no-restart: only when calibrate starts the recipe's server (no --base-url)")
    checks = _checks(args.checks)
    params = parse_params(args.param)
    recipe = recipe_from(args)
    assert recipe is not None  # RECIPE is required
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    calibration = calibrate(
        recipe, base_url=args.base_url, runs=args.runs, checks=checks, margin=args.margin,
        restart=False if args.no_restart else None, params=params, launch_profile=args.launch_profile,
        request_timeout_s=args.timeout, write=not args.dry_run, say=say, progress=cli_progress(),
    )
    print(summary(calibration))
    if args.dry_run:
        print(calibration_yaml(calibration), end="")
    else:
        print(f"calibrate: wrote {calibration_path(recipe)}")
    return EXIT_NOT_MET if saw_failures(calibration) else 0


def summary(calibration: Calibration) -> str:
    rows = ["| Tolerance | Measured | Allowed | Runs seen |", "|---|---|---|---|"]
    rows += [f"| {name} | {v.measured:g} | {v.allowed:g} | {v.runs_seen}/{calibration.runs} |"
             for name, v in calibration.values.items()]
    if calibration.model_misses:
        rows += ["", f"Cells the model itself misses: {', '.join(calibration.model_misses)}"]
    if calibration.notes:
        rows += ["", "Notes:"] + [f"- {note}" for note in calibration.notes]
    return "\n".join(rows) + "\n"
