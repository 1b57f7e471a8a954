#!/usr/bin/env python3
"""How far one client goes: client CPU per generated token, and the timing error the client adds, at 16, 256 and
2,000 concurrent streams against a stand-in server that streams tokens on a fixed schedule.

The stand-in (standin_stream.py, its own process) records on the machine's monotonic clock when each request arrived
and when each token was written. Per request, the client's error is its TTFT minus the stand-in's (first token
written minus request read), and its mean ITL minus the stand-in's mean gap between writes; what is left is the
client's own delay: connection, scheduling of its event loop, parsing. CPU is this process's over the batch
(`BatchResult.client_cpu_s`). The largest fleet one client drives is the most streams at which the client's p99
TTFT error stays under `--max-error-ms` (default 100 ms: small against the seconds a cold prompt takes, and the
ITL error, the figure a throughput table rests on, is then well under a millisecond) and it uses under `--max-core`
of one core (default half: the client must never be what limits a run); cookbook.fleet.CLIENT_MAX_STREAMS is set
from it (README, "How far one client goes").

    scripts/in-env.sh python benchmarks/client_scale.py --json runs/client-scale.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from cookbook.bench import StreamRequest, run_batch
from cookbook.endpoint import Endpoint
from cookbook.launch import free_port

HERE = Path(__file__).resolve().parent


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _get(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read() or b"{}")


def measure(base: str, streams: int, tokens: int, tag: str) -> dict[str, Any]:
    _get(f"{base}/reset", "POST")
    requests = [StreamRequest(messages=[{"role": "user", "content": f"{tag} request {i}"}], max_tokens=tokens, timeout_s=600)
                for i in range(streams)]
    endpoint = Endpoint(base, "stand-in")
    load_before = os.getloadavg()[0]
    batch = run_batch(endpoint, requests, concurrency=streams)
    endpoint.close()
    stats = _get(f"{base}/stats")
    ttft_err, itl_err = [], []
    for request, result in zip(requests, batch.results):
        seen = stats.get(request.messages[-1]["content"])
        if not result.ok or seen is None or result.ttft_s is None:
            continue
        sent = seen["sent_ns"]
        ttft_err.append(result.ttft_s * 1e3 - (sent[0] - seen["arrived_ns"]) / 1e6)
        if len(sent) > 1 and result.itl_s:
            itl_err.append(statistics.fmean(result.itl_s) * 1e3 - (sent[-1] - sent[0]) / 1e6 / (len(sent) - 1))
    tokens_done = batch.generated_tokens
    return {
        "streams": streams, "tokens_per_stream": tokens, "failed": batch.failed, "generated_tokens": tokens_done,
        "wall_s": round(batch.wall_s, 2), "client_cpu_s": round(batch.client_cpu_s, 3),
        "cpu_us_per_token": round(batch.client_cpu_s / max(1, tokens_done) * 1e6, 1),
        "core_share": round(batch.client_cpu_s / batch.wall_s, 3) if batch.wall_s else None,
        "ttft_error_ms_p50": round(_percentile(ttft_err, 0.5), 2), "ttft_error_ms_p99": round(_percentile(ttft_err, 0.99), 2),
        "itl_error_ms_p50": round(_percentile(itl_err, 0.5), 3), "itl_error_ms_p99": round(_percentile(itl_err, 0.99), 3),
        "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="16,256,2000", help="comma-separated stream counts (default 16,256,2000)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="the stand-in's time to first token (default 100)")
    parser.add_argument("--itl-ms", type=float, default=50.0, help="the stand-in's gap between tokens (default 50: 20 tokens/s a stream)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per stream count, interleaved (default 2)")
    parser.add_argument("--max-error-ms", type=float, default=100.0, help="p99 TTFT error one client may add (default 100)")
    parser.add_argument("--max-core", type=float, default=0.5, help="share of one core the client may use (default 0.5)")
    parser.add_argument("--json", type=Path, help="write every run and the verdict here")
    args = parser.parse_args()
    counts = [int(c) for c in args.streams.split(",") if c.strip()]
    port = free_port()
    standin = subprocess.Popen([sys.executable, str(HERE / "standin_stream.py"), "--port", str(port),
                                "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)], stdout=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    runs: list[dict[str, Any]] = []
    try:
        assert standin.stdout is not None
        print(standin.stdout.readline().strip(), flush=True)
        measure(base, 4, 4, "warm-up")
        for round_ in range(1, args.rounds + 1):
            for streams in counts if round_ % 2 else list(reversed(counts)):
                run = measure(base, streams, args.tokens, f"r{round_}s{streams}")
                runs.append(run)
                print(f"round {round_}: {streams:>5} streams: {run['cpu_us_per_token']:6.1f} us CPU/token, "
                      f"{run['core_share']:.0%} of a core; TTFT error p50 {run['ttft_error_ms_p50']} ms, p99 "
                      f"{run['ttft_error_ms_p99']} ms; ITL error p50 {run['itl_error_ms_p50']} ms, p99 {run['itl_error_ms_p99']} ms; "
                      f"failed {run['failed']}; load {run['load_before']} -> {run['load_after']}", flush=True)
                time.sleep(1)
    finally:
        standin.terminate()
        standin.wait(timeout=30)
    worst = {n: max((r for r in runs if r["streams"] == n), key=lambda r: r["ttft_error_ms_p99"]) for n in counts}
    fits = [n for n, r in worst.items() if r["ttft_error_ms_p99"] <= args.max_error_ms and (r["core_share"] or 0) <= args.max_core
            and not r["failed"]]
    largest = max(fits) if fits else None
    print()
    for n, r in worst.items():
        print(f"{n:>5} streams (worst of {args.rounds}): {r['cpu_us_per_token']} us CPU/token, {r['core_share']:.0%} of a core, "
              f"TTFT error p99 {r['ttft_error_ms_p99']} ms, ITL error p99 {r['itl_error_ms_p99']} ms, failed {r['failed']}")
    print(f"largest fleet one client drives (p99 TTFT error <= {args.max_error_ms} ms, <= {args.max_core:.0%} of a core): "
          f"{largest if largest is not None else 'none of these'} streams")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)}, "runs": runs,
                                         "largest_streams": largest}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
