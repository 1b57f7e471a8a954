"""What one core of this host can do for a model's prefill, and so the floor under the suite's model work.

    scripts/in-env.sh python benchmarks/core_gemm.py                    # SmolLM2's shapes, fp32 and bf16
    scripts/in-env.sh python benchmarks/core_gemm.py --dtypes float32 --seconds 2

Test servers run their model on one OpenMP thread (tests/servers.py), so a core's one-thread GEMM speed bounds their
prefill. This times torch's matmul in the CPU image (the torch vLLM runs on) at the model's shapes for a prefill
chunk of `--tokens` rows (the MLP's up projection and the vocabulary projection), one thread, on each core alone and
then on every core at once (are the cores independent, or siblings sharing one core's units?). From the model's
config it counts the linear layers' FLOPs per token, with the vocabulary projection at every position as prompt
logprobs need it, and prints the tokens per second one core could prefill at the slower core's measured speeds, every
decoder projection at the MLP's speed (the smaller attention projections run no faster), attention, norms and sampling
left out: a ceiling no server on this host passes, to set beside what the suite's servers did. Without native bf16
(an AVX2-only CPU) a bf16 matmul is emulated and takes a minute or more here."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cookbook.batch import DEMO_RECIPE  # noqa: E402
from cookbook.image import ensure_cpu_image  # noqa: E402
from cookbook.models import ensure_model  # noqa: E402
from cookbook.recipes import load_recipe  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

_CHILD = r"""
import json, os, sys, time, torch
core, dtype, rows, inner, outer, seconds = sys.argv[1:]
os.sched_setaffinity(0, {int(core)})
torch.set_num_threads(1)
kind = getattr(torch, dtype)
a = torch.randn(int(rows), int(inner), dtype=kind)
b = torch.randn(int(inner), int(outer), dtype=kind)
a @ b
runs, started = 0, time.perf_counter()
while runs == 0 or time.perf_counter() - started < float(seconds):
    a @ b
    runs += 1
elapsed = time.perf_counter() - started
print(json.dumps(2 * int(rows) * int(inner) * int(outer) * runs / elapsed / 1e9))
"""


def flops_per_token(config: dict) -> tuple[int, int]:
    """Linear layers' FLOPs per token: the decoder stack alone, and with the vocabulary projection."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head
    per_layer = hidden * config["num_attention_heads"] * head * 2 + hidden * kv * 2 + 3 * hidden * inter
    stack = 2 * layers * per_layer
    return stack, stack + 2 * hidden * config["vocab_size"]


def gflops(python: Path, cores: list[int], dtype: str, shape: tuple[int, int, int], seconds: float) -> list[float]:
    """One thread per core in `cores`, all at once: each one's GFLOP/s."""
    procs = [subprocess.Popen([str(python), "-c", _CHILD, str(core), dtype, *map(str, shape), str(seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for core in cores]
    speeds = []
    for core, proc in zip(cores, procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{dtype} matmul {shape} on core {core}: {last}")
        speeds.append(float(json.loads(out)))
    return speeds


def text_config(config: dict) -> dict:
    """The language model's part of a config (a multimodal checkpoint nests it under text_config)."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def demo_checkpoint() -> Path:
    """The demo recipe's prepared weights, built once if the cache lacks them."""
    weights = load_recipe(DEMO_RECIPE).serve.weights
    assert weights is not None, f"{DEMO_RECIPE}: the demo recipe prepares its weights"
    return ensure_model(weights.prepare, ensure_cpu_image())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="a checkpoint folder with config.json (default: the demo recipe's SmolLM2, built if absent)")
    parser.add_argument("--tokens", type=int, default=512, help="rows of the prefill chunk (default: 512)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="torch dtypes, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per measurement (default: 4)")
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        print(f"core_gemm: --dtypes: {unknown[0]!r} is not one of {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    folder = args.model or demo_checkpoint()
    config_path = folder / "config.json"
    if not config_path.is_file():
        print(f"core_gemm: --model: no config.json in {folder}", file=sys.stderr)
        return 2
    config = text_config(json.loads(config_path.read_text()))
    missing = [key for key in REQUIRED if key not in config]
    if missing:
        print(f"core_gemm: {config_path}: no {missing[0]!r}", file=sys.stderr)
        return 2
    python = ensure_cpu_image().python
    cores = sorted(os.sched_getaffinity(0))
    hidden = config["hidden_size"]
    shapes = {"MLP up": (args.tokens, hidden, config["intermediate_size"]),
              "vocabulary": (args.tokens, hidden, config["vocab_size"])}
    stack, with_vocab = flops_per_token(config)
    print(f"{folder.name}: {stack / 1e6:.0f} MFLOP per token in the decoder's linear layers, {with_vocab / 1e6:.0f} "
          f"with the vocabulary projection at every position; cores {cores}; one thread each")
    print(f"\n{'dtype':9} {'shape':11} {'alone, per core (GFLOP/s)':>27} {'all cores at once':>18}")
    ceilings = []
    try:
        for dtype in dtypes:
            slowest = {}
            for name, shape in shapes.items():
                alone = [gflops(python, [core], dtype, shape, args.seconds)[0] for core in cores]
                together = gflops(python, cores, dtype, shape, args.seconds)
                slowest[name] = min(alone)
                print(f"{dtype:9} {name:11} {', '.join(f'{g:.1f}' for g in alone):>27} "
                      f"{', '.join(f'{g:.1f}' for g in together):>18}")
            seconds_per_token = stack / (slowest["MLP up"] * 1e9) + (with_vocab - stack) / (slowest["vocabulary"] * 1e9)
            ceilings.append(f"{dtype} {1 / seconds_per_token:,.0f} tokens/s")
    except RuntimeError as exc:
        print(f"core_gemm: {exc}", file=sys.stderr)
        return 1
    print(f"\nprompt-logprob prefill on one core, linear layers alone: at most {', '.join(ceilings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
