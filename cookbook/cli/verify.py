"""`cookbook verify [RECIPE] --base-url URL [--checks a,b] [--out DIR]`: run the Verified checks against a server, or
with `--launch` against the recipe's own server, started for the run (with launch overrides) and stopped after.

Prints the Verified table (Check | Result) and the KV pool line; exits 0 only if every check passed, is a known
limitation of the recipe's model, or does not apply. The JSON is written even when the server dies mid-run.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..checks import CheckContext, run_checks, selected_checks
from ..checks.params import listing
from ..checks.registry import CheckSpec, check_params, verified_table
from ..endpoint import Endpoint
from ..errors import EXIT_RUN_FAILED, UsageError
from ..launch import Server, attach, free_port, launch_flags, start_or_report
from ..plots import save_check_figures
from ..recipes import Recipe
from ..results import Hardware, RunResults, check_output_path, parse_hardware, write_results
from ._common import (add_hardware_arg, add_out_arg, add_param_arg, add_server_args, deprecated, recipe_from,
                      parse_params as _parse_params)
from ._progress import cli_progress

EVIDENCE_SHOWN = 2
DEFAULT_BUDGET_S = 1800.0


EXAMPLES = """
  cookbook verify HuggingFaceTB/SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000 --checks core
  cookbook verify Qwen/Qwen3-Coder-Next --base-url http://gaudi-box:8000 --hardware "gaudi2:four Gaudi 2 cards" --out runs/qwen
  cookbook verify HuggingFaceTB/SmolLM2-135M-Instruct --launch --launch-profile engine-states --checks engine-states
  cookbook verify --list-params --checks engine-states       # the check parameters --param takes, typed
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `verify` subparser on a parser built by hand (tests do); `cookbook` itself builds it from its table."""
    configure(subparsers.add_parser("verify"))


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_args(parser)
    parser.add_argument("--checks", metavar="A,B", help="checks or groups (core, long-context, ...); default: every check that applies to the recipe "
                        "(`--checks core` is the quick path)")
    add_out_arg(parser, "results.json and the figures")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the run's results (the results schema) to this file instead")
    add_hardware_arg(parser, "what served the run")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="wall-clock seconds one request may take, start to last byte (default 60)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"wall-clock seconds the whole run may take; checks past it are 'not run' (default {DEFAULT_BUDGET_S:g})")
    add_param_arg(parser, "a check parameter", "needle_lengths=2000,4000", "--list-params")
    parser.add_argument("--list-params", action="store_true",
                        help="list the check parameters of the checks selected (type, default, which checks), then exit")
    parser.add_argument(
        "--launch", action="store_true", help="start the recipe's server for this run (instead of --base-url) and stop it after"
    )
    parser.add_argument(
        "--launch-profile", metavar="NAME", help="with --launch: the recipe's verification.launch_profiles entry, e.g. engine-states"
    )
    parser.add_argument(
        "--launch-override",
        action="append",
        default=[],
        metavar="FLAG=VALUE",
        help="with --launch: a `vllm serve` flag to add or replace, e.g. num-gpu-blocks-override=17 (repeatable)",
    )
    parser.add_argument("--out-dir", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # deprecated: --out
    parser.set_defaults(run=run)


def parse_checks(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError("--checks: empty name in the list (write e.g. known-answer,seed)")
    return names


def parse_params(items: list[str], specs: list[CheckSpec] | None = None) -> dict[str, object]:
    """--param KEY=VALUE for the checks: the one grammar, then typed by what the checks (`specs`; default every
    check) declare: an unknown key or a value of the wrong type is a one-line error (exit 2)."""
    return check_params(_parse_params(items), specs)


def hardware_from(text: str | None) -> Hardware | None:
    """--hardware as the results' hardware: KIND:DESCRIPTION, as every command takes it. The free text verify used
    to take ('four Gaudi 2 cards', no kind) still works, with a warning: the kind is read from the words."""
    if text is None:
        return None
    if not text.strip():
        raise UsageError("--hardware: empty")
    kind, sep, _ = text.partition(":")
    if sep and kind.strip() and " " not in kind.strip():
        return parse_hardware(text)
    words = text.lower().replace("-", " ")
    kind = next((k for k, w in (("gaudi3", "gaudi 3"), ("gaudi2", "gaudi 2"), ("cpu", "cpu")) if w in words or k in words), "unknown")
    deprecated("--hardware TEXT", f"write KIND:DESCRIPTION, e.g. --hardware '{kind}:{text.strip()}'")
    return Hardware(kind=kind, description=text.strip())


def evidence_lines(results: RunResults) -> list[str]:
    """One line per piece of evidence (at most two per check) for every check that did not pass."""
    lines = []
    for c in results.checks:
        if c.status == "pass" or c.status == "skipped":
            continue
        for e in c.evidence[:EVIDENCE_SHOWN]:
            lines.append(f"- {c.name} ({c.status}): {e.note}")
    return lines


def run(args: argparse.Namespace) -> int:
    names = parse_checks(args.checks)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout: must be a positive number of seconds, got {args.timeout}")
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise UsageError(f"--budget: must be a positive number of seconds, got {args.budget}")
    check_output_path(args.json, "--json")  # before any request: the results must have somewhere to go
    check_output_path(args.out, "--out", folder=True)
    check_output_path(args.out_dir, "--out-dir", folder=True)
    if args.out_dir is not None:
        deprecated("--out-dir DIR", "--out DIR (results.json and the figures)")
    hardware_from(args.hardware)  # a bad --hardware fails before any request
    recipe = recipe_from(args)
    specs = selected_checks(names, recipe)  # unknown names fail here, before any request
    if args.list_params:
        print(listing(specs), end="")
        return 0
    parse_params(args.param, specs)  # a misspelt key or a mistyped value fails before any request
    if args.launch:
        return _run_launched(args, names, recipe)
    if args.launch_profile or args.launch_override:
        raise UsageError("--launch-profile/--launch-override: only with --launch")
    if not args.base_url:
        raise UsageError("--base-url: required (start a server with `cookbook serve RECIPE`, or use --launch)")
    return _run_checks(args, names, recipe, args.base_url, {})


def _run_launched(args: argparse.Namespace, names: list[str] | None, recipe: Recipe | None) -> int:
    """Start the recipe's server with the launch overrides, run the checks against it, stop it."""
    if recipe is None:
        raise UsageError("--launch: needs RECIPE (the server to start)")
    if args.base_url:
        raise UsageError("--launch: give either --launch or --base-url, not both")
    flags = launch_flags(recipe, args.launch_profile, args.launch_override)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    server = Server(recipe, port=free_port(), extra_flags=flags, say=say, progress=cli_progress())
    ready = start_or_report(server, say)
    if ready is None:
        return EXIT_RUN_FAILED
    try:
        say(ready.line())
        return _run_checks(args, names, recipe, ready.base_url, flags)
    finally:
        server.stop()
        say("verify: the launched server was stopped")


def _run_checks(
    args: argparse.Namespace, names: list[str] | None, recipe: Recipe | None, base_url: str, launched: dict[str, Any]
) -> int:
    model = args.model or (recipe.served_model_name if recipe else None)
    # With a model name known, a server that is already down still gets a full table of "not run" (and its JSON).
    endpoint = Endpoint(base_url, model) if model else attach(base_url)
    endpoint.timeout_s = min(endpoint.timeout_s, args.timeout)
    json_path = args.json or (args.out / "results.json" if args.out else None)
    out_dir = args.out or args.out_dir or (args.json.parent if args.json else None)
    ctx = CheckContext(
        endpoint,
        recipe,
        out_dir=out_dir,
        params={**parse_params(args.param, selected_checks(names, recipe)),
                **({"launch_overrides": launched} if launched else {})},
        request_timeout_s=args.timeout,
        hardware=hardware_from(args.hardware),
        budget_s=args.budget,
    )
    started = time.monotonic()
    results = run_checks(ctx, names, progress=cli_progress())
    if json_path:  # what was measured is written first, whatever happens to the figures
        write_results(results, json_path)
    if out_dir is not None and _save_figures(results, out_dir, json_path.parent if json_path else out_dir) and json_path:
        write_results(results, json_path)  # again, naming the figures in its artifacts
    print(verified_table(results), end="")
    evidence = evidence_lines(results)
    if evidence:
        print("\nEvidence:\n" + "\n".join(evidence))
    print(f"verify: {len(results.checks)} checks in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0 if results.all_ok else 1


def _save_figures(results: RunResults, out_dir: Path, base: Path) -> bool:
    """The checks' figures into `out_dir`, named in the results' artifacts relative to `base` (the results file's
    folder); a figure that cannot be drawn is said, and never costs the results. True when any was written."""
    try:
        paths = save_check_figures(results, out_dir)
    except Exception as exc:  # noqa: BLE001 - the numbers matter more than their picture
        print(f"verify: figures not written: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    results.artifacts.update({name: os.path.relpath(path, base) for name, path in paths.items()})
    return bool(paths)
