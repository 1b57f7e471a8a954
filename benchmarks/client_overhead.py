#!/usr/bin/env python3
"""The client's own cost: CPU seconds per generated token at 16 streams, ours and `vllm bench serve`'s.

Both send the same 16 chat prompts with the same output length at 16 in flight (the server queues what exceeds its
--max-num-seqs), interleaved A B B A .... CPU time is this process's (user + system, all threads) over the main run
only: for ours from the first send to the last token (`BatchResult.client_cpu_s`), for vllm bench between the
metrics it fetches just before and just after its main run (see parity_vllm_bench.py). Targets: under 10 % of one
core, and no more than vllm bench per token.

    scripts/in-env.sh python benchmarks/client_overhead.py --base-url http://127.0.0.1:8000
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from parity_vllm_bench import Run, VllmBench, add_common_args, run_ours, server_for, tokenizer_for

from cookbook.image import cpu_image
from cookbook.recipes import load_recipe

CORE_TARGET = 0.10


def _line(run: Run) -> str:
    per_token = run.client_cpu_s / max(1, run.output_tokens)
    return (f"{run.tool:<10} {run.output_tokens} tokens in {run.wall_s:6.1f} s: client CPU {run.client_cpu_s:.3f} s = "
            f"{per_token * 1e6:6.1f} us/token, {run.client_cpu_s / run.wall_s:6.2%} of a core, failed {run.failed}, "
            f"load {run.load:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--streams", type=int, default=16, help="streams in flight (default 16)")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    ours: list[Run] = []
    theirs: list[Run] = []
    with server_for(args, recipe) as endpoint, VllmBench(cpu_image(), tokenizer_for(recipe)) as vllm_bench:
        run_ours(endpoint, 1, 1, 16)  # warm-up, not counted
        for round_ in range(1, args.rounds + 1):
            pair = [lambda: run_ours(endpoint, args.streams, args.streams, args.output_tokens),
                    lambda: vllm_bench.run(endpoint, args.streams, args.streams, args.output_tokens)]
            for measure in pair if round_ % 2 else reversed(pair):  # A B, then B A
                run = measure()
                (ours if run.tool == "cookbook" else theirs).append(run)
                print(f"round {round_} {_line(run)}", flush=True)
    per_token = lambda runs: sum(r.client_cpu_s for r in runs) / sum(r.output_tokens for r in runs)  # noqa: E731
    share = lambda runs: sum(r.client_cpu_s for r in runs) / sum(r.wall_s for r in runs)  # noqa: E731
    mine, vllm = per_token(ours), per_token(theirs)
    print()
    print(f"cookbook:   {mine * 1e6:.1f} us CPU per token, {share(ours):.2%} of a core "
          f"({'under' if share(ours) < CORE_TARGET else 'OVER'} the 10% target)")
    print(f"vllm bench: {vllm * 1e6:.1f} us CPU per token, {share(theirs):.2%} of a core")
    spread = [a.client_cpu_s / a.output_tokens / (b.client_cpu_s / b.output_tokens) for a, b in zip(ours, theirs)]
    print(f"ratio ours/vllm bench: {mine / vllm:.2f} (pairs {', '.join(f'{x:.2f}' for x in spread)}); "
          f"{'no more than' if mine <= vllm else 'MORE than'} vllm bench")
    if args.json:
        args.json.write_text(json.dumps({
            "runs": {"cookbook": [r.__dict__ for r in ours], "vllm bench": [r.__dict__ for r in theirs]},
            "cpu_s_per_token": {"cookbook": mine, "vllm bench": vllm},
            "core_share": {"cookbook": share(ours), "vllm bench": share(theirs)},
            "median_pair_ratio": statistics.median(spread),
        }, indent=1))
    return 1 if any(r.failed for r in ours + theirs) else 0


if __name__ == "__main__":
    sys.exit(main())
