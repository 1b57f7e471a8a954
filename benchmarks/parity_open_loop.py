#!/usr/bin/env python3
"""Trust in the open loop: `cookbook bench --workloads rate` against `vllm bench serve --request-rate` on one server.

At each rate both tools send the same requests (vllm bench serve's own random dataset: its prompts are recorded
from its run and sent by ours as the same chat messages with the same output lengths, ignore_eos, temperature 0),
with arrivals drawn from the same seed and burstiness (ours are `cookbook.bench.arrival_offsets`; the script prints
how far vllm bench's actual send times sat from them), interleaved B A, A B, B A ... so that drift on a shared
machine hits both alike. For each headline figure (request throughput, output tokens/s, mean and p99 TTFT and
TPOT, goodput) it prints the ratio ours / vllm bench as the median of the per-pair ratios. Targets: within 3 % on
throughput, 5 % on TTFT. With `--guidellm` it also runs guidellm's constant-rate profile on the same server from a
throwaway venv in the cache (installed from the package index on first use; skipped with the reason if it does not
install).

`--closed-loop` instead measures the 2026-12-01 discrepancy of the closed loop (issue 24): one wave of 8 streams x
256 tokens by `cookbook bench`'s n-streams workload against `vllm bench serve --dataset-name random
--random-input-len 32 --random-output-len 256 --ignore-eos --num-prompts 8 --max-concurrency 8` as given (its
default backend, the completions API, and no temperature, so the server samples at its default temperature 1), and
the same with `--temperature 0`, and through the chat API, to find which difference moves the figure.

    scripts/in-env.sh python benchmarks/parity_open_loop.py --base-url http://127.0.0.1:8011 --rates 1,2 --rounds 7
    scripts/in-env.sh python benchmarks/parity_open_loop.py --base-url http://127.0.0.1:8011 --closed-loop --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cookbook.bench import StreamRequest, arrival_offsets, parse_goodput, run_batch, run_open_loop, short_requests
from cookbook.endpoint import Endpoint
from cookbook.image import ImageEnv, cache_dir, cpu_image
from cookbook.launch import attach
from cookbook.recipes import load_recipe

sys.path.insert(0, str(Path(__file__).parent))
from _vllm_bench import EmbeddedVllmBench  # noqa: E402
from parity_vllm_bench import tokenizer_for  # noqa: E402

DEFAULT_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
TARGETS = {"request_throughput": 0.03, "output_throughput": 0.03, "mean_ttft_ms": 0.05, "p99_ttft_ms": 0.05}
HEADLINE = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
            "request_goodput")
GUIDELLM = "guidellm==0.8.1"

# vllm bench samples its own data set; the hooks record the prompts it sampled and when it let each request go.
HOOKS = r"""
recorded = {}
original_samples = serve.get_samples
def samples(args, tokenizer, **kw):
    out = original_samples(args, tokenizer, **kw)
    recorded["prompts"] = [[r.prompt, r.expected_output_len] for r in out]
    return out

original_request = serve.get_request
async def get_request(*a, **k):
    sends = recorded.setdefault("sent", [])
    async for item in original_request(*a, **k):
        sends.append(time.perf_counter())
        yield item

serve.get_samples = samples
serve.get_request = get_request

def prepare(job):
    recorded.clear()

def finish(result, keep):
    keep.update({k: v for k, v in result.items() if k != "generated_texts"})
    keep["prompts"] = recorded.get("prompts", [])
    sent = recorded.get("sent", [])
    keep["sent_offsets"] = [s - sent[0] for s in sent] if sent else []
"""


class VllmBench:
    """`vllm bench serve` in one long-lived process of the image, each run given as its own argument list."""

    def __init__(self, image: ImageEnv) -> None:
        self._bench = EmbeddedVllmBench(image, HOOKS, prefix="cookbook-parity-open-")

    def run(self, argv: list[str], timeout_s: float = 900.0) -> dict[str, Any]:
        data = self._bench.ask({"argv": argv}, timeout_s)
        data["load"] = os.getloadavg()[0]
        return data

    def close(self) -> None:
        self._bench.close()


def common_args(endpoint: Endpoint, tokenizer: str) -> list[str]:
    return ["--base-url", endpoint.base_url, "--model", endpoint.model, "--tokenizer", tokenizer, "--disable-tqdm", "--save-detailed"]


def open_loop_args(endpoint: Endpoint, tokenizer: str, args: argparse.Namespace, rate: float) -> list[str]:
    """`vllm bench serve` arguments of one open-loop run (printed, so that it can be re-run by hand)."""
    argv = [*common_args(endpoint, tokenizer), "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--random-range-ratio", str(args.range_ratio), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(args.requests), "--request-rate", str(rate), "--burstiness", str(args.burstiness),
            "--seed", str(args.seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    if args.goodput:
        argv += ["--goodput", *args.goodput]
    return argv


def ours_open(endpoint: Endpoint, prompts: list[list[Any]], args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """Our open loop on vllm bench's prompts, in the names of vllm bench's result."""
    requests = [StreamRequest([{"role": "user", "content": p}], int(n), 900.0) for p, n in prompts]
    slos = parse_goodput(args.goodput)
    run = run_open_loop(endpoint, requests, rate, args.burstiness, args.seed, slos)
    m = run.metrics()
    return {"request_throughput": m["request_throughput"], "output_throughput": m["output_tokens_per_s"],
            "mean_ttft_ms": m["ttft_ms_mean"], "p99_ttft_ms": m["ttft_ms_p99"], "mean_tpot_ms": m["tpot_ms_mean"],
            "p99_tpot_ms": m["tpot_ms_p99"], "request_goodput": m["request_goodput"], "failed": m["failed"],
            "total_output_tokens": m["generated_tokens"], "total_input_tokens": m["prompt_tokens"],
            "client_cpu_s": run.client_cpu_s, "client_wall_s": run.duration_s, "send_lag_ms_p99": m["send_lag_ms_p99"],
            "load": os.getloadavg()[0]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize_pairs(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        pairs = [r for a, b in zip(ours, theirs) if (r := _ratio(a.get(key), b.get(key))) is not None]
        out[key] = {"median": statistics.median(pairs) if pairs else None, "pairs": pairs,
                    "ours_mean": statistics.fmean(a[key] for a in ours if a.get(key) is not None) if ours else None,
                    "vllm_mean": statistics.fmean(b[key] for b in theirs if b.get(key) is not None) if theirs else None}
    return out


def guidellm_python() -> tuple[Path | None, str]:
    """guidellm's venv in the cache, made on first use; (None, why) when it does not install."""
    venv = cache_dir() / "guidellm-0.8.1"
    python = venv / "bin" / "python"
    if python.exists() and (venv / "bin" / "guidellm").exists():
        return python, "installed"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode:
        return None, f"python -m venv failed: {made.stderr.strip()[-300:]}"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", GUIDELLM], capture_output=True, text=True, timeout=1200)
    if pip.returncode:
        return None, f"pip install {GUIDELLM} failed: {pip.stderr.strip().splitlines()[-1] if pip.stderr.strip() else pip.returncode}"
    return python, "installed now"


def run_guidellm(python: Path, endpoint: Endpoint, tokenizer: str, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """guidellm's constant-rate profile at `rate` (its synthetic text of the same lengths, chat API) for as many
    requests as ours; throughputs re-read as vllm bench defines them (completed or output tokens over the
    benchmark's duration), TPOT as guidellm's inter-token latency (its (latency - TTFT) / (tokens - 1))."""
    with tempfile.TemporaryDirectory(prefix="cookbook-guidellm-") as folder:
        out = Path(folder) / "guidellm.json"
        cmd = [str(python.parent / "guidellm"), "run",
               "--backend", f"kind=openai_http,target={endpoint.base_url},model={endpoint.model}",
               "--tokenizer", f"kind=hf_auto,model={tokenizer}",
               "--profile", f"kind=constant,rate={rate}", "--constraint", f"kind=max_requests,count={args.requests}",
               "--data", f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}",
               "--output", f"kind=json,path={out}", "--disable-progress"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=folder)
        if done.returncode or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return {"error": f"guidellm exited {done.returncode}: {' | '.join(tail)[:400]}"}
        report = json.loads(out.read_text())
    bench = report["benchmarks"][0]
    metrics, duration = bench["metrics"], bench["duration"]

    def stat(name: str, field: str) -> float | None:
        value = metrics.get(name, {}).get("successful", {})
        return value.get("percentiles", {}).get(field) if field.startswith("p") else value.get(field)

    completed = metrics["request_totals"]["successful"]
    output = metrics["output_token_count"]["successful"].get("total_sum") or 0
    return {"request_throughput": completed / duration, "output_throughput": output / duration,
            "mean_ttft_ms": stat("time_to_first_token_ms", "mean"), "p99_ttft_ms": stat("time_to_first_token_ms", "p99"),
            "mean_tpot_ms": stat("inter_token_latency_ms", "mean"), "p99_tpot_ms": stat("inter_token_latency_ms", "p99"),
            "failed": metrics["request_totals"]["errored"], "load": os.getloadavg()[0]}


def open_loop(args: argparse.Namespace, endpoint: Endpoint, tokenizer: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"rates": {}, "uptime_start": _uptime()}
    runs: dict[str, Any] = {}
    vllm = VllmBench(cpu_image())
    try:
        run_batch(endpoint, short_requests(1, 16, 60.0), 1)  # warm-up, not counted
        for rate in args.rates:
            argv = open_loop_args(endpoint, tokenizer, args, rate)
            print(f"rate {rate:g}: vllm bench serve {' '.join(argv)}", flush=True)
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            prompts: list[list[Any]] | None = None
            schedule_gap: list[float] = []
            for round_ in range(1, args.rounds + 1):
                order = ("vllm", "ours") if round_ % 2 else ("ours", "vllm")
                if prompts is None:
                    order = ("vllm", "ours")
                for tool in order:
                    if tool == "vllm":
                        data = vllm.run(argv)
                        prompts = prompts or data["prompts"]
                        planned = arrival_offsets(len(data["sent_offsets"]), rate, args.burstiness, args.seed)
                        schedule_gap.append(max(abs((a - planned[0]) - b) for a, b in zip(planned, data["sent_offsets"])) * 1e3)
                        theirs.append(data)
                    else:
                        assert prompts is not None
                        data = ours_open(endpoint, prompts, args, rate)
                        ours.append(data)
                    print(f"  round {round_} {tool:<5} {data['request_throughput']:.3f} req/s  "
                          f"{data['output_throughput']:.1f} tok/s  TTFT {data['mean_ttft_ms']:.0f}/{data['p99_ttft_ms']:.0f} ms  "
                          f"TPOT {data['mean_tpot_ms']:.1f}/{data['p99_tpot_ms']:.1f} ms  goodput {data.get('request_goodput')}  "
                          f"failed {data.get('failed', 0)}  load {data['load']:.1f}", flush=True)
            result = summarize_pairs(ours, theirs, HEADLINE)
            result["schedule_gap_ms_max"] = max(schedule_gap) if schedule_gap else None
            result["load_mean"] = statistics.fmean(r["load"] for r in ours + theirs)
            if args.guidellm:
                python, why = guidellm_python()
                if python is None:
                    result["guidellm"] = {"skipped": why}
                else:
                    g = [run_guidellm(python, endpoint, tokenizer, args, rate) for _ in range(args.guidellm_rounds)]
                    ok = [x for x in g if "error" not in x]
                    result["guidellm"] = ({"runs": g, **summarize_pairs(ok, theirs[: len(ok)], HEADLINE[:-1])}
                                          if ok else {"skipped": g[0]["error"]})
            summary["rates"][f"{rate:g}"] = result
            runs[f"{rate:g}"] = {"ours": ours, "vllm": [{k: v for k, v in t.items() if not isinstance(v, list)} for t in theirs]}
            for key in HEADLINE:
                median = result[key]["median"]
                target = TARGETS.get(key)
                verdict = "" if target is None or median is None else (" (within target)" if abs(median - 1) <= target else " (OUTSIDE target)")
                print(f"rate {rate:g}: {key} ours/vllm median of {len(result[key]['pairs'])} pairs "
                      f"{'n/a' if median is None else f'{median:.3f}'}{verdict}", flush=True)
            print(f"rate {rate:g}: vllm bench's sends sat at most {result['schedule_gap_ms_max']:.1f} ms from our schedule "
                  f"for the same seed; mean load {result['load_mean']:.1f}", flush=True)
    finally:
        vllm.close()
    summary["uptime_end"] = _uptime()
    return {"summary": summary, "runs": runs}


def closed_loop(args: argparse.Namespace, endpoint: Endpoint, tokenizer: str) -> dict[str, Any]:
    """The closed-loop definitions side by side (see the module): each variant's aggregate tokens/s, and for vllm
    bench's runs its own per-request records re-read with our duration (first send to last token)."""
    base = [*common_args(endpoint, tokenizer), "--dataset-name", "random", "--random-input-len", "32",
            "--random-output-len", str(args.output_len_closed), "--ignore-eos", "--num-prompts", "8", "--max-concurrency", "8"]
    variants: dict[str, list[str] | None] = {
        "cookbook n-streams (chat, temperature 0)": None,
        "vllm bench as given (completions, no temperature)": base,
        "vllm bench --temperature 0 (completions)": [*base, "--temperature", "0"],
        "vllm bench --temperature 0, chat": [*base, "--temperature", "0", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions"],
        "cookbook n-streams at temperature 1": None,
    }
    if args.only:
        variants = {name: argv for name, argv in variants.items() if any(word in name for word in args.only)}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    vllm = VllmBench(cpu_image())
    try:
        run_batch(endpoint, short_requests(1, 16, 60.0), 1)  # warm-up, not counted
        names = list(variants)
        for round_ in range(1, args.rounds + 1):
            for name in names if round_ % 2 else reversed(names):
                argv = variants[name]
                cpu_before = server_cpu_s(args.server_pid)
                if argv is None:
                    temperature = 1.0 if "temperature 1" in name else 0.0
                    batch = run_batch(endpoint, short_requests(8, args.output_len_closed, 900.0), 8, temperature)
                    sends = [r.sent_at for r in batch.ok if r.sent_at is not None]
                    ends = [r.sent_at + r.e2e_s for r in batch.ok if r.sent_at is not None and r.e2e_s is not None]
                    row = {"aggregate": batch.aggregate_tokens_per_s, "tokens": batch.generated_tokens,
                           "prompt_tokens": sum(r.prompt_tokens or 0 for r in batch.ok),
                           "first_send_to_last_token": batch.generated_tokens / (max(ends) - min(sends)),
                           "wall_s": batch.wall_s}
                else:
                    data = vllm.run(argv)
                    ends = [s + lat for s, lat in zip(data["start_times"], data["latencies"])]
                    row = {"aggregate": data["output_throughput"], "tokens": data["total_output_tokens"],
                           "prompt_tokens": data["total_input_tokens"],
                           "first_send_to_last_token": data["total_output_tokens"] / (max(ends) - min(data["start_times"])),
                           "wall_s": data["duration"]}
                row["load"] = os.getloadavg()[0]
                row["server_cpu_us_per_token"] = 1e6 * (server_cpu_s(args.server_pid) - cpu_before) / row["tokens"]
                found[name].append(row)
                print(f"round {round_} {name:<52} {row['aggregate']:7.1f} tok/s (first send to last token "
                      f"{row['first_send_to_last_token']:7.1f}); server CPU {row['server_cpu_us_per_token']:6.0f} us/token; "
                      f"tokens {row['tokens']}, prompts {row['prompt_tokens']}, "
                      f"load {row['load']:.1f}", flush=True)
    finally:
        vllm.close()
    print()
    reference = found[names[0]]
    for name, rows in found.items():
        ratio = statistics.median(a["aggregate"] / b["aggregate"] for a, b in zip(reference, rows))
        cpu = statistics.median(a["server_cpu_us_per_token"] / b["server_cpu_us_per_token"] for a, b in zip(reference, rows)
                                if b["server_cpu_us_per_token"]) if args.server_pid else float("nan")
        print(f"{name:<52} median {statistics.median(r['aggregate'] for r in rows):7.1f} tok/s; cookbook / this: "
              f"median of pairs {ratio:.3f}; server CPU per token, this / cookbook: median of pairs {1 / cpu:.3f}")
    return {"closed_loop": found, "uptime": _uptime()}


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) the server process and its children (vLLM's engine core) have used: the
    server's own cost of a run, far steadier than its wall time on a machine shared with other work."""
    if pid is None:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="a running server to measure")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--rounds", type=int, default=7, help="pairs per rate (default 7)")
    parser.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[1.0, 2.0])
    parser.add_argument("--requests", type=int, default=16, help="requests per run (default 16)")
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--range-ratio", type=float, default=0.0)
    parser.add_argument("--goodput", nargs="+", default=["ttft:500", "tpot:100"], metavar="KEY:MS")
    parser.add_argument("--guidellm", action="store_true", help=f"also {GUIDELLM}'s constant-rate profile at each rate")
    parser.add_argument("--guidellm-rounds", type=int, default=3)
    parser.add_argument("--closed-loop", action="store_true", help="the closed-loop definitions instead (see the module)")
    parser.add_argument("--output-len-closed", type=int, default=256)
    parser.add_argument("--server-pid", type=int, help="--closed-loop: the server's pid, to read its CPU time per run")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="--closed-loop: only the variants whose name has a WORD")
    parser.add_argument("--json", type=Path, help="write every run and the ratios here")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    endpoint = attach(args.base_url, recipe.served_model_name)
    tokenizer = tokenizer_for(recipe)
    print(f"server {endpoint.base_url}, model {endpoint.model}; {_uptime()}", flush=True)
    out = closed_loop(args, endpoint, tokenizer) if args.closed_loop else open_loop(args, endpoint, tokenizer)
    print(_uptime())
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
