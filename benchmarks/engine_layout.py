"""vLLM's CPU process layout against one process for the engine and its model: same numbers, and what each costs.

    scripts/in-env.sh python benchmarks/engine_layout.py                 # SmolLM2, both layouts, 2 starts each
    scripts/in-env.sh python benchmarks/engine_layout.py --starts 1 --prompts 4

"as launched" is the recipe's own `vllm serve`: an API server, an engine core and a worker process that runs the
model, bound by vLLM to one core. "one process" adds tests/servers.py's ONE_PROCESS_ENGINE to the environment: the
engine core runs the model itself, with one OpenMP thread. For each layout this starts the server (time to /health,
and the CPU-seconds its processes spent to get there), runs greedy completions of `--prompts` prompts one at a time
with the top-5 logprobs of each token, times one 200-token stream and 8 concurrent ones, and reads the CPU-seconds
the server spent on that work. It then says whether the two layouts gave the same tokens and logprobs, to the last
bit, and exits 1 if they did not."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from cookbook import recipes as recipes_mod  # noqa: E402
from cookbook.endpoint import Endpoint  # noqa: E402
from cookbook.launch import free_port, resolve_image, session_pids  # noqa: E402
from cookbook.models import ensure_model, models_dir  # noqa: E402
from cookbook.progress import kill_session  # noqa: E402
from server_start import wait_healthy  # noqa: E402
from servers import ONE_PROCESS_ENGINE, _session_cpu  # noqa: E402

LAYOUTS = {"as launched": {}, "one process": ONE_PROCESS_ENGINE}


def _cpu_s(session: int) -> float:
    return _session_cpu({session: "server"})["server"]


def _processes(session: int) -> int:
    return len([pid for pid in session_pids(session) if Path(f"/proc/{pid}/cmdline").exists()])


def one_run(recipe_id: str, layout: dict[str, str], prompts: list[str]) -> dict:
    recipe = recipes_mod.load_recipe(recipe_id)
    image = resolve_image(recipe)
    if recipe.serve.weights is not None:
        ensure_model(recipe.serve.weights.prepare, image)
    env = image.env()
    env.update(recipe.environment)
    env.update(layout)
    env["COOKBOOK"] = str(REPO)
    env["COOKBOOK_MODELS"] = str(models_dir())
    port = free_port()
    argv = recipes_mod.serve_argv(recipe, models_dir(), extra={"host": "127.0.0.1", "port": port})
    argv[0] = image.executable("vllm")
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    endpoint = Endpoint(f"http://127.0.0.1:{port}", recipe.served_model_name)
    try:
        out: dict = {"start_s": wait_healthy(proc, endpoint, recipe_id) - started, "start_cpu_s": _cpu_s(proc.pid),
                     "processes": _processes(proc.pid)}

        def complete(prompt: str, max_tokens: int, logprobs: int | None) -> dict:
            body = {"model": recipe.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "logprobs": logprobs}
            if logprobs is None:
                body["ignore_eos"] = True
            return endpoint.post("/v1/completions", body, timeout_s=600)["choices"][0]

        before = _cpu_s(proc.pid)
        answers = [complete(p, 64, 5) for p in prompts]
        out["answers"] = [{"text": a["text"], "token_logprobs": a["logprobs"]["token_logprobs"],
                           "top_logprobs": a["logprobs"]["top_logprobs"]} for a in answers]
        t = time.monotonic()
        complete("The history of the Roman empire", 200, None)
        out["one_stream_tok_s"] = 200 / (time.monotonic() - t)
        t = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: complete(f"Story number {i}:", 200, None), range(8)))
        out["eight_streams_tok_s"] = 1600 / (time.monotonic() - t)
        out["work_cpu_s"] = _cpu_s(proc.pid) - before
        return out
    finally:
        kill_session(proc)  # type: ignore[arg-type]
        endpoint.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--starts", type=int, default=2, help="starts per layout, alternating (default 2)")
    parser.add_argument("--prompts", type=int, default=8, help="greedy prompts compared (default 8)")
    args = parser.parse_args()
    prompts = [f"Question {i}: explain in a few sentences why {topic}."
               for i, topic in enumerate(["the sky is blue", "bread rises", "ice floats", "magnets attract iron",
                                          "the moon has phases", "leaves change colour", "metal feels cold",
                                          "rivers meander", "bees make honey", "stars twinkle"] * 4)][:args.prompts]
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for _ in range(args.starts):
        for name, layout in LAYOUTS.items():
            runs[name].append(one_run(args.recipe, layout, prompts))
    print(f"{args.recipe}: {args.starts} starts per layout, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = [("processes", "processes", "{:.0f}"), ("start to /health (s)", "start_s", "{:.1f}"),
            ("start CPU-s", "start_cpu_s", "{:.1f}"), ("one stream (tokens/s)", "one_stream_tok_s", "{:.1f}"),
            ("8 streams (tokens/s)", "eight_streams_tok_s", "{:.1f}"),
            (f"CPU-s for the {args.prompts} prompts and both timings", "work_cpu_s", "{:.1f}")]
    print(f"  {'median':<48} " + " ".join(f"{name:>12}" for name in LAYOUTS))
    for label, key, form in rows:
        print(f"  {label:<48} " + " ".join(f"{form.format(statistics.median(r[key] for r in runs[name])):>12}"
                                          for name in LAYOUTS))
    answers = [json.dumps(run["answers"], sort_keys=True) for name in LAYOUTS for run in runs[name]]
    same = len(set(answers)) == 1
    print(f"  the {args.prompts} greedy answers, tokens and top-5 logprobs, over every start: "
          f"{'identical to the last bit' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
