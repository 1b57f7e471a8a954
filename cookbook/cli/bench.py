"""`cookbook bench [RECIPE] --base-url URL [--workloads table,sweep] [--out DIR]`: the Performance table, its detail,
the sweep and the roofline, printed; optionally as results JSON and PNG figures."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from ..bench import DATASETS, TABLE, WORKLOADS, BenchConfig, DatasetConfig, OpenLoopConfig, format_report, parse_goodput, run_performance_table
from ..bench.datasets import read_sharegpt
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


def _rates(text: str) -> list[float] | None:
    if text.strip() == "auto":
        return None
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or comma-separated requests per second, got {text!r}") from None
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive and finite, got {text!r}")
    return rates


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
  cookbook bench HuggingFaceTB/SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000 --workloads rate \\
      --rates 0.5,1,2 --requests 16 --input-len 64 --output-len 64 --goodput ttft:500 tpot:100 --out runs/rate
  cookbook bench Qwen/Qwen3-Coder-Next --base-url http://gaudi-box:8000 --workloads table,sweep \\
      --hardware "gaudi2:four Gaudi 2 cards" --out runs/qwen-bench
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_args(parser)
    parser.add_argument("--workloads", type=_workloads, default=list(TABLE),
                        help="comma-separated: table (= single,streams,cold), single, streams, cold, sweep, rate "
                             "(the open loop) (default table)")
    parser.add_argument("--long-lengths", type=_ints, metavar="N,N,...",
                        help="cold prompt lengths in tokens (default: the recipe's needle lengths, else the seeds' scaled)")
    parser.add_argument("--streams", type=int, help="N of the N-stream figure and the sweep's top (default --max-num-seqs)")
    parser.add_argument("--output-tokens", type=int, default=256, help="tokens per short-prompt stream (default 256)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one short request may take (default 300)")
    parser.add_argument("--budget", type=float, default=3600.0, metavar="S",
                        help="wall-clock seconds the whole run may take; workloads past it are not measured (default 3600)")
    rate = parser.add_argument_group("the rate workload (open loop, as vllm bench serve --request-rate)")
    rate.add_argument("--rates", type=_rates, default=None, metavar="R,R,...|auto",
                      help="offered requests per second, in order; auto (default): 0.5, 1, 2, ... until saturated")
    rate.add_argument("--max-rate", type=float, help="the automatic sweep goes no higher than this rate")
    rate.add_argument("--requests", type=int, default=32, help="requests sent at each rate (default 32)")
    rate.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of the arrivals: 1 Poisson (default), < 1 burstier, > 1 steadier, inf constant")
    rate.add_argument("--seed", type=int, default=0, help="seed of the arrivals and of the random datasets (default 0)")
    rate.add_argument("--dataset", choices=DATASETS, default="random", help="what is sent (default random)")
    rate.add_argument("--dataset-path", type=Path, metavar="FILE", help="the ShareGPT-shaped JSON file of --dataset sharegpt")
    rate.add_argument("--input-len", type=int, default=128, help="mean prompt tokens (shared-prefix: per-request suffix; default 128)")
    rate.add_argument("--output-len", type=int, default=128, help="mean output tokens, fixed with ignore_eos (default 128)")
    rate.add_argument("--range-ratio", type=float, default=0.0, help="spread of both lengths, uniform in len x (1 -/+ r) (default 0)")
    rate.add_argument("--prefix-groups", type=int, default=4, help="shared-prefix: groups sharing one prefix (default 4)")
    rate.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens of each group's prefix (default 512)")
    rate.add_argument("--sharegpt-output-len", type=int, help="sharegpt: fixed output tokens instead of each answer's length")
    rate.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                      help="objectives of goodput, any of ttft:MS tpot:MS e2el:MS (a request counts when it meets all)")
    add_out_arg(parser, "results.json, throughput.png, latency.png, roofline.png, open_loop.png")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results (the shared RunResults schema) to this file")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write throughput.png, latency.png, roofline.png in this folder")
    add_hardware_arg(parser)
    parser.set_defaults(run=run)


def open_loop_config(args: argparse.Namespace) -> OpenLoopConfig:
    """The rate workload's flags as its config; each bad value is one line naming its flag."""
    for flag, value in (("--requests", args.requests), ("--input-len", args.input_len), ("--output-len", args.output_len),
                        ("--prefix-groups", args.prefix_groups), ("--prefix-len", args.prefix_len)):
        if value <= 0:
            raise UsageError(f"{flag}: must be a positive integer, got {value}")
    if args.sharegpt_output_len is not None and args.sharegpt_output_len <= 0:
        raise UsageError(f"--sharegpt-output-len: must be a positive integer, got {args.sharegpt_output_len}")
    if not (args.burstiness > 0):  # inf is allowed: constant gaps
        raise UsageError(f"--burstiness: must be positive (inf: constant gaps), got {args.burstiness}")
    if not (0 <= args.range_ratio < 1):
        raise UsageError(f"--range-ratio: must be at least 0 and below 1, got {args.range_ratio}")
    if args.max_rate is not None and not (math.isfinite(args.max_rate) and args.max_rate > 0):
        raise UsageError(f"--max-rate: must be a positive number of requests per second, got {args.max_rate}")
    if args.dataset == "sharegpt":
        if args.dataset_path is None:
            raise UsageError("--dataset sharegpt needs --dataset-path FILE")
        read_sharegpt(args.dataset_path)  # a file that is not ShareGPT-shaped fails here, naming it
    elif args.dataset_path is not None:
        raise UsageError(f"--dataset-path: only read by --dataset sharegpt (got --dataset {args.dataset})")
    dataset = DatasetConfig(name=args.dataset, input_len=args.input_len, output_len=args.output_len,
                            range_ratio=args.range_ratio, prefix_groups=args.prefix_groups, prefix_len=args.prefix_len,
                            path=args.dataset_path, sharegpt_output_len=args.sharegpt_output_len)
    return OpenLoopConfig(rates=args.rates, requests=args.requests, burstiness=args.burstiness, seed=args.seed,
                          dataset=dataset, goodput=parse_goodput(args.goodput), max_rate=args.max_rate)


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
    open_loop = open_loop_config(args)  # a bad rate flag or dataset file fails before any request
    hardware = parse_hardware(args.hardware)  # a bad --hardware fails before any request
    recipe = recipe_from(args)
    endpoint = endpoint_from(args, recipe)
    endpoint.timeout_s = min(endpoint.timeout_s, args.timeout)  # /tokenize, /metrics: bounded like a request
    endpoint.budget = Deadline(args.budget, "the run's budget")
    config = BenchConfig(
        output_tokens=args.output_tokens, streams=args.streams, long_lengths=args.long_lengths, request_timeout_s=args.timeout,
        open_loop=open_loop,
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
