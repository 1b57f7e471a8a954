"""`cookbook bench [RECIPE] --base-url URL [--workloads table,sweep] [--out DIR]`: the Performance table, its detail,
the sweep and the roofline, printed; optionally as results JSON and PNG figures."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from ..bench import TABLE, WORKLOADS, BenchConfig, format_report, run_performance_table
from ..errors import UsageError
from ..plots import save_run_plots
from ..endpoint import Deadline
from ..results import check_output_path, parse_hardware, write_results
from ..roofline import roofline_rows
from ._common import add_hardware_arg, add_out_arg, add_server_args, endpoint_from, recipe_from
from ._progress import cli_progress


def _ints(text: str) -> list[int]:
    try:
        return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _workloads(text: str) -> list[str]:
    names: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        names.extend(TABLE if part == "table" else [part])
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload {unknown[0]!r} (known: table, {', '.join(WORKLOADS)})")
    return names


EXAMPLES = """
  cookbook bench HuggingFaceTB/SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000 --workloads single,streams
  cookbook bench Qwen/Qwen3-Coder-Next --base-url http://gaudi-box:8000 --workloads table,sweep \\
      --hardware "gaudi2:four Gaudi 2 cards" --out runs/qwen-bench
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_args(parser)
    parser.add_argument("--workloads", type=_workloads, default=list(TABLE),
                        help="comma-separated: table (= single,streams,cold), single, streams, cold, sweep (default table)")
    parser.add_argument("--long-lengths", type=_ints, metavar="N,N,...",
                        help="cold prompt lengths in tokens (default: the recipe's needle lengths, else the seeds' scaled)")
    parser.add_argument("--streams", type=int, help="N of the N-stream figure and the sweep's top (default --max-num-seqs)")
    parser.add_argument("--output-tokens", type=int, default=256, help="tokens per short-prompt stream (default 256)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one short request may take (default 300)")
    parser.add_argument("--budget", type=float, default=3600.0, metavar="S",
                        help="wall-clock seconds the whole run may take; workloads past it are not measured (default 3600)")
    add_out_arg(parser, "results.json, throughput.png, latency.png, roofline.png")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results (the shared RunResults schema) to this file")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write throughput.png, latency.png, roofline.png in this folder")
    add_hardware_arg(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.output_tokens <= 0 or (args.streams is not None and args.streams <= 0):
        raise UsageError("--output-tokens and --streams must be positive")
    for flag, value in (("--timeout", args.timeout), ("--budget", args.budget)):
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag}: must be a positive number of seconds, got {value}")
    check_output_path(args.out, "--out", folder=True)
    if args.out is not None:  # --out DIR: the results and the figures in one folder
        args.json, args.plots = args.json or args.out / "results.json", args.plots or args.out
    check_output_path(args.json, "--json")  # before any request: a run's figures must have somewhere to go
    check_output_path(args.plots, "--plots", folder=True)
    hardware = parse_hardware(args.hardware)  # a bad --hardware fails before any request
    recipe = recipe_from(args)
    endpoint = endpoint_from(args, recipe)
    endpoint.timeout_s = min(endpoint.timeout_s, args.timeout)  # /tokenize, /metrics: bounded like a request
    endpoint.budget = Deadline(args.budget, "the run's budget")
    config = BenchConfig(
        output_tokens=args.output_tokens, streams=args.streams, long_lengths=args.long_lengths, request_timeout_s=args.timeout
    )
    say = lambda line: print(f"bench: {line}", file=sys.stderr, flush=True)  # noqa: E731
    results = run_performance_table(endpoint, recipe, config, hardware, args.workloads, cli_progress())
    if args.json:  # what was measured is written first, whatever happens to the plots
        write_results(results, args.json)
    if args.plots:
        try:
            paths = save_run_plots(results, recipe, args.plots)
        except Exception as exc:  # a figure that cannot be drawn must not lose the numbers
            say(f"plots not written: {type(exc).__name__}: {exc}")
            paths = {}
        base = args.json.parent if args.json else args.plots
        results.artifacts.update({name: os.path.relpath(path, base) for name, path in paths.items()})
        for path in paths.values():
            say(f"wrote {path}")
    if args.json:
        write_results(results, args.json)
        say(f"wrote {args.json}")
    rows = roofline_rows(recipe, results.performance, results.hardware) if recipe else None
    print(format_report(results, rows, recipe))
    failed = sum(f.failed_requests for f in results.performance)
    endpoint.close()
    if failed:
        errors = sorted({e for f in results.performance for e in f.details.get("errors", [])})
        print(f"\n{failed} request(s) failed: {'; '.join(errors)[:500]}", file=sys.stderr)
    if results.stopped:
        print(f"error: {results.stopped}", file=sys.stderr)
        return 1
    return 1 if failed else 0
