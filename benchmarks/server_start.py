"""Where a CPU server's start-up goes: each stage the launcher runs (cookbook/launch.py `Server.start`), timed.

    scripts/in-env.sh python benchmarks/server_start.py                        # SmolLM2, 3 starts
    scripts/in-env.sh python benchmarks/server_start.py cookbook/tiny-qwen3-next --starts 2

Stages: the image check, the image probe (`detect_image`), the model check (`ensure_model`), the fix step
(`apply_all.py`, already applied), then `vllm serve` split by the lines its three processes print as each comes up
(timestamped on arrival here, not from vLLM's one-second log stamps): the API server's import, the engine-core
process's (spawned: it imports vLLM again), the worker's (spawned again), weights, KV pool and warm-up, the API
routes; and the /health wait after the server says it listens. Prints the median of each over the starts."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cookbook import recipes as recipes_mod  # noqa: E402
from cookbook.endpoint import Endpoint  # noqa: E402
from cookbook.image import detect_image  # noqa: E402
from cookbook.launch import free_port, resolve_image  # noqa: E402
from cookbook.models import ensure_model, models_dir  # noqa: E402
from cookbook.progress import kill_session  # noqa: E402

# (stage name, the first line that ends it)
MARKERS = [
    ("API server: Python, torch, vLLM import", "non-default args"),
    ("engine core: spawned, imports vLLM again", "Initializing a V1 LLM engine"),
    ("worker: spawned, imports vLLM again", "Starting to load model"),
    ("weights", "Loading weights took"),
    ("KV pool, profile, warm-up", "init engine (profile, create kv cache"),
    ("API server: routes, listening", "Starting vLLM server on"),
]


def wait_healthy(proc: subprocess.Popen, endpoint: Endpoint, what: str) -> float:
    """Poll /health every 50 ms until it answers (its time.monotonic()); SystemExit if the server exits first."""
    while not endpoint.healthy(timeout_s=1.0):
        if proc.poll() is not None:
            raise SystemExit(f"{what}: the server exited during start-up (exit {proc.returncode})")
        time.sleep(0.05)
    return time.monotonic()


def one_start(recipe_id: str) -> dict[str, float]:
    recipe = recipes_mod.load_recipe(recipe_id)
    stages: dict[str, float] = {}
    t = time.monotonic()
    image = resolve_image(recipe)
    stages["image check"] = time.monotonic() - t
    t = time.monotonic()
    detect_image(image)
    stages["image probe (detect_image)"] = time.monotonic() - t
    t = time.monotonic()
    if recipe.serve.weights is not None:
        ensure_model(recipe.serve.weights.prepare, image)
    stages["model check"] = time.monotonic() - t
    env = image.env()
    env.update(recipe.environment)
    env["COOKBOOK"] = str(REPO)
    env["COOKBOOK_MODELS"] = str(models_dir())
    t = time.monotonic()
    subprocess.run([str(image.python), str(REPO / "fixes" / "apply_all.py"), *recipes_mod.fix_command(recipe)],
                   env=env, capture_output=True, check=True)
    stages["fix step (already applied)"] = time.monotonic() - t
    port = free_port()
    argv = recipes_mod.serve_argv(recipe, models_dir(), extra={"host": "127.0.0.1", "port": port})
    argv[0] = image.executable("vllm")
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            for name, marker in MARKERS:
                if marker in line and name not in seen:
                    seen[name] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    endpoint = Endpoint(f"http://127.0.0.1:{port}", recipe.served_model_name)
    try:
        healthy = wait_healthy(proc, endpoint, recipe_id)
    finally:
        kill_session(proc)  # type: ignore[arg-type]
        endpoint.close()
    last = started
    for name, _ in MARKERS:
        if name in seen:
            stages[name] = seen[name] - last
            last = seen[name]
    stages["/health after listening"] = healthy - last
    stages["vllm serve to /health, total"] = healthy - started
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()
    runs = [one_start(args.recipe) for _ in range(args.starts)]
    print(f"{args.recipe}: {args.starts} starts, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name in runs[0]:
        values = [run.get(name, float("nan")) for run in runs]
        print(f"  {name:<44} {statistics.median(values):>6.1f} s   ({', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
