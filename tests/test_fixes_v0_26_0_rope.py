"""Contract test of the v0.26.0 fix `rope-cpu-cache` on the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py).

The bug itself needs a Gaudi card (gaudi-only): the HPU's fp32 cos/sin are wrong for large angles, and vLLM 0.26.0's
rotary `__init__` builds each cos/sin table under the model loader's default device, the HPU. The script
(tests/repro_v0_26_0/rope_cpu_cache.py) checks what the payload promises, on the real classes of
vllm_gaudi/ops/hpu_rotary_embedding.py (plain, linear, dynamic NTK, YaRN, DeepSeek-YaRN, Llama 3, Phi-3 LongRoPE,
MRoPE with and without YaRN, Llama 4 vision) built by vLLM's own `__init__`:

- with `torch.device("meta")` as the default device (a stand-in for the HPU: "not the CPU"), the cos/sin of the table
  are evaluated on the CPU (the shipped classes evaluate them on meta), and the buffer still lands on the default
  device in the model dtype;
- built on the CPU, every table entry up to position 262,144 is within fp32 rounding of a float64 reference.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image

CLASSES = {
    "HPURotaryEmbedding", "HPULinearScalingRotaryEmbedding", "HPUDynamicNTKScalingRotaryEmbedding",
    "HPUYaRNScalingRotaryEmbedding", "HPUDeepseekScalingRotaryEmbedding", "HPULlama3RotaryEmbedding",
    "HPUPhi3LongRoPEScaledRotaryEmbedding", "HPUMRotaryEmbedding", "HPUMRotaryEmbedding+YaRN",
    "HPULlama4VisionRotaryEmbedding"
}


def test_rope_cpu_cache(sim_image, patched_site) -> None:
    """Gaudi-only bug; this is the payload's contract. Pristine b059f9c: every class evaluates its table's cos/sin on
    the default device ("HPURotaryEmbedding: cos/sin table built on meta/float32, not the CPU"), and the fp32 table is
    off a float64 reference by up to 2.4e-3 (plain, max at row 260,307; 6.0e-3 for Phi-3 LongRoPE).

    With the payload: each class evaluates cos/sin on the CPU (in float64), its buffer is on meta in the requested
    dtype, and the fp32 table is within fp32 rounding of float64 on every row up to 262,144 (max error 6.0e-8).
    """
    pristine = sim_image.repro("rope-cpu-cache")
    assert not pristine["fixed"], pristine
    assert "HPURotaryEmbedding: cos/sin table built on meta/float32, not the CPU" in pristine["symptom"], pristine
    assert set(pristine["classes"]) == CLASSES, pristine
    for name, got in pristine["classes"].items():
        assert got["trig_on"] == ["meta/float32"], (name, got)

    patched = sim_image.repro("rope-cpu-cache", overlay=patched_site)
    assert patched["fixed"], patched
    assert set(patched["classes"]) == CLASSES, patched
    for name, got in patched["classes"].items():
        assert got["trig_on"] == ["cpu/float64"] and got["built_on_cpu"], (name, got)
        assert got["buffer_on_default_device"], (name, got)
        assert got["accurate"] and got["cpu_table_dtype"] == "float32", (name, got)
        assert got["max_err"] <= 2.0**-23, (name, got)
        assert got["rows"] >= (577 if "Llama4Vision" in name else 262144), (name, got)
