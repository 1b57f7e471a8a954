"""What a server starting beside a serving one costs it, with both bound to one core and with each on its own.

vLLM's CPU worker binds its OpenMP threads to one core, and `auto` picks the same core for every server on a 2-vCPU
machine, so a test server started ahead (tests/servers.py) computes its start on the core the tests' server serves
on. This starts server A (the recipe, bound to core 0), times a fixed greedy prefill on it alone, then starts
server B (the same recipe) bound to core 0 and then to core 1, timing A's prefill over and over while B starts,
and prints A's median prefill alone and during each start, and how long B took to start.

    scripts/in-env.sh python benchmarks/start_beside.py                  # SmolLM2
    scripts/in-env.sh python benchmarks/start_beside.py --prompt-words 200
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cookbook.endpoint import Endpoint  # noqa: E402
from cookbook.launch import Server, free_port  # noqa: E402
from cookbook.recipes import load_recipe  # noqa: E402

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def prefill_s(endpoint: Endpoint, words: int, salt: int) -> float:
    """One cold prefill of `words` words (a fresh salt, so no cache hit) and one output token."""
    prompt = f"{salt} " + " ".join(f"word{i}" for i in range(words))
    started = time.perf_counter()
    endpoint.post("/v1/completions", {"model": endpoint.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0},
                  timeout_s=600)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--prompt-words", type=int, default=120, help="words of the timed prompt (default 120)")
    parser.add_argument("--alone", type=int, default=5, help="prefills timed on A alone (default 5)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("one core only: nothing to compare")
        return 0
    recipe = load_recipe(args.recipe)
    salt = iter(range(10**6))
    os.environ[BIND_VAR] = "0"
    with Server(recipe, port=free_port(), say=lambda _line: None) as a:
        prefill_s(a.endpoint, args.prompt_words, next(salt))  # warm-up
        alone = [prefill_s(a.endpoint, args.prompt_words, next(salt)) for _ in range(args.alone)]
        print(f"A alone on core 0: prefill median {statistics.median(alone):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in alone)})", flush=True)
        for core in ("0", "1"):
            os.environ[BIND_VAR] = core
            took: dict[str, float] = {}

            def start_b() -> None:
                started = time.perf_counter()
                with Server(recipe, port=free_port(), say=lambda _line: None):
                    took["start"] = time.perf_counter() - started

            thread = threading.Thread(target=start_b)
            thread.start()
            during = []
            while thread.is_alive():
                during.append(prefill_s(a.endpoint, args.prompt_words, next(salt)))
            thread.join()
            print(f"B starting on core {core}: B took {took.get('start', float('nan')):.1f} s to start; A's prefill "
                  f"median {statistics.median(during):.2f} s over {len(during)} "
                  f"({statistics.median(during) / statistics.median(alone):.2f} x alone)", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
