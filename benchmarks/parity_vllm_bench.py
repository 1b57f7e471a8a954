#!/usr/bin/env python3
"""Trust in the numbers: our single-stream and N-stream workloads against `vllm bench serve`, on one server.

Both tools send the same chat prompts (the cookbook's short prompts) with the same output length (ignore_eos and a
fixed token budget, temperature 0), interleaved A B B A A B ... so that drift on a shared machine hits both alike, and
this prints the ratio ours / vllm bench of the aggregate tokens/s and of the mean TTFT: the median of the per-pair
ratios (robust to a run that a neighbour slowed down) and the ratio of the means. Target: within 2 %. With
`--overhead-streams N` (default 16; 0 leaves it out) the same interleaved run also holds client_overhead.py's workload
(N streams at once) and prints each tool's client CPU per generated token for every workload, so that parity and
client overhead come from one run on one server.

`vllm bench serve` runs in the CPU image's Python through the same function its CLI calls
(`vllm.benchmarks.serve.main`, with its own argument parser), with two hooks: the data set is our prompt list (the
image has no pandas for `--dataset-name custom`), and the client CPU time is read around the main run only.

    scripts/in-env.sh python benchmarks/parity_vllm_bench.py --base-url http://127.0.0.1:8000
    scripts/in-env.sh python benchmarks/parity_vllm_bench.py --launch        # its own server on a free port
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from cookbook.bench import run_batch, short_prompts, short_requests
from cookbook.endpoint import Endpoint
from cookbook.image import ImageEnv, cpu_image
from cookbook.launch import Server, attach, free_port
from cookbook.models import models_dir
from cookbook.recipes import Recipe, load_recipe

sys.path.insert(0, str(Path(__file__).parent))
from _vllm_bench import EmbeddedVllmBench  # noqa: E402

DEFAULT_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
TARGET = 0.02

# vllm bench's data set is our prompt list (the image has no pandas for `--dataset-name custom`).
HOOKS = r"""
from vllm.benchmarks.datasets import SampleRequest

job = {}
def samples(args, tokenizer):
    return [SampleRequest(prompt=p, prompt_len=len(tokenizer(p).input_ids), expected_output_len=args.output_len,
                          request_id=f"cookbook-{i}", chat_messages=[{"role": "user", "content": p}])
            for i, p in enumerate(job["prompts"])]
serve.get_samples = samples

def prepare(new_job):
    job.clear()
    job.update(new_job)

def finish(result, keep):
    keep.update({k: v for k, v in result.items() if isinstance(v, (int, float, str)) or v is None})
"""


@dataclass
class Run:
    """One run of one tool: what both report, the same way (aggregate = output tokens / duration)."""

    tool: str
    load: float  # the machine's 1-minute load average when the run ended: how noisy it was
    aggregate_tokens_per_s: float
    mean_ttft_ms: float
    output_tokens: int
    prompt_tokens: int
    failed: int
    client_cpu_s: float
    wall_s: float


def tokenizer_for(recipe: Recipe) -> str:
    """Where vllm bench loads the tokenizer: the prepared checkpoint for the CPU recipes, else the hub id."""
    if recipe.serve.weights is not None:
        return str(models_dir() / recipe.serve.weights.prepare)
    return recipe.model.id


def bench_serve_args(endpoint: Endpoint, tokenizer: str, requests: int, concurrency: int, output_tokens: int) -> list[str]:
    """`vllm bench serve` arguments for the same work as ours (printed, so it can be re-run by hand)."""
    return [
        "--backend", "openai-chat", "--base-url", endpoint.base_url, "--endpoint", "/v1/chat/completions",
        "--model", endpoint.model, "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", "cookbook.jsonl",
        "--output-len", str(output_tokens), "--ignore-eos", "--temperature", "0", "--num-prompts", str(requests),
        "--max-concurrency", str(concurrency), "--ready-check-timeout-sec", "0", "--disable-tqdm",
    ]


class VllmBench:
    """`vllm bench serve` in one long-lived process of the image (imported once), so that each of its runs sits
    right beside ours instead of behind a vLLM import."""

    def __init__(self, image: ImageEnv, tokenizer: str) -> None:
        self._bench = EmbeddedVllmBench(image, HOOKS)
        self.tokenizer = tokenizer

    def run(self, endpoint: Endpoint, requests: int, concurrency: int, output_tokens: int, timeout_s: float = 900.0) -> Run:
        """One `vllm bench serve` run; the process is killed (and this fails) if it takes longer than `timeout_s`."""
        data = self._bench.ask({"argv": bench_serve_args(endpoint, self.tokenizer, requests, concurrency, output_tokens),
                                "prompts": short_prompts(requests)}, timeout_s)
        return Run("vllm bench", os.getloadavg()[0], data["output_throughput"], data["mean_ttft_ms"],
                   data["total_output_tokens"], data["total_input_tokens"], data.get("failed", 0), data["client_cpu_s"],
                   data["client_wall_s"])

    def close(self) -> None:
        self._bench.close()

    def __enter__(self) -> "VllmBench":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_ours(endpoint: Endpoint, requests: int, concurrency: int, output_tokens: int, timeout_s: float = 900.0) -> Run:
    batch = run_batch(endpoint, short_requests(requests, output_tokens, timeout_s), concurrency)
    ttfts = [r.ttft_s for r in batch.ok if r.ttft_s is not None]
    return Run("cookbook", os.getloadavg()[0], batch.aggregate_tokens_per_s or 0.0, 1e3 * statistics.fmean(ttfts) if ttfts else float("nan"),
               batch.generated_tokens, sum(r.prompt_tokens or 0 for r in batch.ok), batch.failed, batch.client_cpu_s,
               batch.wall_s)


@contextlib.contextmanager
def server_for(args: argparse.Namespace, recipe: Recipe) -> Iterator[Endpoint]:
    """The server to measure: attached (--base-url) or the recipe's own on a free port (--launch)."""
    if args.base_url:
        yield attach(args.base_url, recipe.served_model_name)
        return
    with Server(recipe, port=free_port(), say=lambda line: print(f"  {line}", file=sys.stderr)) as server:
        print(f"launched {server.endpoint.base_url} ({server.ready.line() if server.ready else ''})", file=sys.stderr)
        yield server.endpoint


def add_common_args(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="a running server to measure")
    target.add_argument("--launch", action="store_true", help="start the recipe's own server on a free port")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--rounds", type=int, default=5, help="pairs per workload, A B then B A (default 5)")
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, help="write every run and the ratios here")


def ratios(ours: list[Run], theirs: list[Run]) -> dict[str, Any]:
    """Ours / vllm bench for aggregate tokens/s and mean TTFT: median of the pairs, and ratio of the means."""
    pairs = {
        "aggregate": [a.aggregate_tokens_per_s / b.aggregate_tokens_per_s for a, b in zip(ours, theirs)],
        "ttft": [a.mean_ttft_ms / b.mean_ttft_ms for a, b in zip(ours, theirs)],
    }
    means = {
        "aggregate": statistics.fmean(r.aggregate_tokens_per_s for r in ours) / statistics.fmean(r.aggregate_tokens_per_s for r in theirs),
        "ttft": statistics.fmean(r.mean_ttft_ms for r in ours) / statistics.fmean(r.mean_ttft_ms for r in theirs),
    }
    return {"pairs": pairs, "median": {k: statistics.median(v) for k, v in pairs.items()}, "of_means": means}


def _ratio_line(name: str, ours: list[Run], theirs: list[Run]) -> dict[str, Any]:
    result = ratios(ours, theirs)
    verdict = lambda x: "within 2%" if abs(x - 1) <= TARGET else "OUTSIDE 2%"  # noqa: E731
    for key, title in (("aggregate", "aggregate tokens/s"), ("ttft", "mean TTFT")):
        median, of_means = result["median"][key], result["of_means"][key]
        print(f"{name}: {title} ours/vllm bench: median of pairs {median:.4f} ({verdict(median)}), ratio of means "
              f"{of_means:.4f}; pairs {', '.join(f'{p:.3f}' for p in result['pairs'][key])}")
    load = statistics.fmean(r.load for r in ours + theirs)
    cpu = {tool: sum(r.client_cpu_s for r in runs) / max(1, sum(r.output_tokens for r in runs))
           for tool, runs in (("cookbook", ours), ("vllm bench", theirs))}
    share = {tool: sum(r.client_cpu_s for r in runs) / sum(r.wall_s for r in runs)
             for tool, runs in (("cookbook", ours), ("vllm bench", theirs))}
    print(f"{name}: client CPU per token: cookbook {cpu['cookbook'] * 1e6:.1f} us ({share['cookbook']:.2%} of a core), "
          f"vllm bench {cpu['vllm bench'] * 1e6:.1f} us ({share['vllm bench']:.2%}); ratio {cpu['cookbook'] / cpu['vllm bench']:.2f}")
    print(f"{name}: mean 1-minute load average over the runs {load:.1f} (2 cores)")
    return {"workload": name, **result, "load_average": load, "cpu_s_per_token": cpu, "core_share": share}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--streams", type=int, help="N of the N-stream workload (default the recipe's --max-num-seqs)")
    parser.add_argument("--single-requests", type=int, default=4, help="requests of the single-stream run, one at a time")
    parser.add_argument("--overhead-streams", type=int, default=16,
                        help="also client_overhead.py's workload, this many streams at once, in the same run (0: not)")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    streams = args.streams or recipe.max_num_seqs
    workloads = {"single-stream": (args.single_requests, 1), "n-streams": (streams, streams)}
    if args.overhead_streams:
        workloads[f"overhead-{args.overhead_streams}"] = (args.overhead_streams, args.overhead_streams)
    tokenizer = tokenizer_for(recipe)
    runs: dict[str, list[Run]] = {f"{w}/{t}": [] for w in workloads for t in ("cookbook", "vllm bench")}
    with server_for(args, recipe) as endpoint, VllmBench(cpu_image(), tokenizer) as vllm_bench:
        serve_args = bench_serve_args(endpoint, tokenizer, streams, streams, args.output_tokens)
        print(f"server {endpoint.base_url}, model {endpoint.model}; vllm bench serve {' '.join(serve_args)}")
        run_ours(endpoint, 1, 1, 16)  # warm-up, not counted
        for round_ in range(1, args.rounds + 1):
            for name, (requests, concurrency) in workloads.items():
                pair = [lambda: run_ours(endpoint, requests, concurrency, args.output_tokens),
                        lambda: vllm_bench.run(endpoint, requests, concurrency, args.output_tokens)]
                for measure in pair if round_ % 2 else reversed(pair):  # A B, then B A: drift cancels
                    run = measure()
                    runs[f"{name}/{run.tool}"].append(run)
                    print(f"round {round_} {name:<13} {run.tool:<10} {run.aggregate_tokens_per_s:8.2f} tok/s  TTFT "
                          f"{run.mean_ttft_ms:8.1f} ms  tokens {run.output_tokens} (prompts {run.prompt_tokens})  "
                          f"failed {run.failed}  load {run.load:.1f}", flush=True)
    print()
    summary = [_ratio_line(name, runs[f"{name}/cookbook"], runs[f"{name}/vllm bench"]) for name in workloads]
    if args.json:
        args.json.write_text(json.dumps({"runs": {k: [r.__dict__ for r in v] for k, v in runs.items()}, "ratios": summary}, indent=1))
    failed = sum(r.failed for v in runs.values() for r in v)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
