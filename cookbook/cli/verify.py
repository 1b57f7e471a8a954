"""`cookbook verify --base-url URL [--recipe ID] [--model NAME] [--checks a,b] [--json OUT] [--hardware TEXT]`, or
`cookbook verify --launch --recipe ID [--launch-profile NAME] [--launch-override FLAG=VALUE ...] ...`, which starts
the recipe's server (with the overrides), runs the checks against it and stops it.

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
from ..checks.registry import check_params, verified_table
from ..endpoint import Endpoint
from ..errors import CookbookError, UsageError
from ..launch import Server, attach, free_port, launch_flags, start_or_report
from ..plots import save_check_figures
from ..recipes import Recipe
from ..results import Hardware, RunResults, check_output_path, write_results
from ._common import add_server_args, recipe_from

EVIDENCE_SHOWN = 2
DEFAULT_BUDGET_S = 1800.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="run the Verified checks against a server; exit 0 only if every check meets the recipe"
    )
    add_server_args(parser)
    parser.add_argument("--checks", metavar="A,B", help="checks or groups (core, long-context, ...); default: every check that applies to the recipe "
                        "(`--checks core` is the quick path)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the run's results (the results schema) here")
    parser.add_argument(
        "--hardware", metavar="TEXT", help="what served the run, e.g. 'four Gaudi 2 cards' (default: this machine for CPU recipes, else unknown)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="wall-clock seconds one request may take, start to last byte (default 60)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"wall-clock seconds the whole run may take; checks past it are 'not run' (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a check parameter, e.g. needle_lengths=2000,4000 or prefix_cache_prompt_tokens=300,1500 (repeatable)",
    )
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
    parser.add_argument("--out-dir", type=Path, metavar="DIR",
                        help="where the checks' figures go (verify.png, needles.png, prefix_cache.png, engine_states.png; "
                        "default: beside --json)")
    parser.set_defaults(run=run)


def parse_checks(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError("--checks: empty name in the list (write e.g. known-answer,seed)")
    return names


def parse_params(items: list[str]) -> dict[str, object]:
    """--param KEY=VALUE: numbers become numbers; a plural key (needle_lengths) or a comma list becomes a list."""
    params: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--param: expected KEY=VALUE, got {item!r}")
        words = [_number(w.strip()) for w in value.split(",")]
        params[key.strip()] = words if "," in value or key.strip().endswith("s") else words[0]
    return params


def _number(word: str) -> object:
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def hardware_from(text: str | None) -> Hardware | None:
    """--hardware TEXT as the results' hardware; the kind is read from the words, else 'unknown'."""
    if text is None:
        return None
    if not text.strip():
        raise UsageError("--hardware: empty")
    words = text.lower().replace("-", " ")
    kind = next((k for k, w in (("gaudi3", "gaudi 3"), ("gaudi2", "gaudi 2"), ("cpu", "cpu")) if w in words or k in words), "unknown")
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
    check_params(parse_params(args.param))  # a bad --param fails before any request
    check_output_path(args.json, "--json")  # before any request: the results must have somewhere to go
    check_output_path(args.out_dir, "--out-dir", folder=True)
    recipe = recipe_from(args)
    selected_checks(names, recipe)  # unknown names fail here, before any request
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
        raise UsageError("--launch: needs --recipe (the server to start)")
    if args.base_url:
        raise UsageError("--launch: give either --launch or --base-url, not both")
    flags = launch_flags(recipe, args.launch_profile, args.launch_override)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    server = Server(recipe, port=free_port(), extra_flags=flags, say=say)
    ready = start_or_report(server, say)
    if ready is None:
        return 1
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
    out_dir = args.out_dir or (args.json.parent if args.json else None)
    ctx = CheckContext(
        endpoint,
        recipe,
        out_dir=out_dir,
        params={**check_params(parse_params(args.param)), **({"launch_overrides": launched} if launched else {})},
        request_timeout_s=args.timeout,
        hardware=hardware_from(args.hardware),
        budget_s=args.budget,
    )
    started = time.monotonic()
    results = run_checks(ctx, names, progress=lambda name: print(f"verify: {name}", file=sys.stderr, flush=True))
    if args.json:  # what was measured is written first, whatever happens to the figures
        write_results(results, args.json)
    if out_dir is not None and _save_figures(results, out_dir, args.json.parent if args.json else out_dir) and args.json:
        write_results(results, args.json)  # again, naming the figures in its artifacts
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
