"""Reproducer of the v0.26.0 fix `prompt-logprobs` on the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py).

The script (tests/repro_v0_26_0/prompt_logprobs.py) runs the real `HPUModelRunner` of
vllm_gaudi/v1/worker/hpu_model_runner.py: the collection statements of its `sample_tokens` (read from the loaded
module) and its `_get_prompt_logprobs_dict` / `_gather_prompt_logprobs_hpu`, with a real vllm_gaudi `InputBatch`,
vLLM 0.26.0's `SamplingParams(prompt_logprobs=5)`, `Sampler` and `SchedulerOutput`, on a prefill batch of 2 x 2048
tokens (prompts of 2000 and 1500) whose hidden states are flat, [batch * seq, hidden], as the `flatten_input` models
(qwen3_5_moe, ...) return them.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image


def test_prompt_logprobs(sim_image, patched_site) -> None:
    """Pristine b059f9c: the first prompt_logprobs request raises
    `RuntimeError: Index tensor must have the same number of dimensions as input tensor` (the runner keeps
    `non_flattened_hidden_states[i]`, one token's [hidden] vector of the flat batch).

    With the payload: logprobs, token ids and ranks equal to a whole-prompt fp32 reference (max abs diff 0.0), the same
    result for [batch, seq, hidden] hidden states, gathered ids int64, and with VLLM_PROMPT_LOGPROBS_CHUNK_ROWS=256 and
    a 16,384 vocabulary no logits tensor above 256 rows (14 calls) and a peak of 36.2 MiB of CPU allocations during the
    call (torch.profiler memory events), against 1999-row logits and 281.4 MiB when one chunk covers the request.
    """
    pristine = sim_image.repro("prompt-logprobs")
    assert not pristine["fixed"], pristine
    assert "Index tensor must have the same number of dimensions as input tensor" in pristine["symptom"], pristine

    patched = sim_image.repro("prompt-logprobs", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["max_abs_diff"] <= 1e-5, patched
    assert max(patched["logits_rows"]) <= patched["chunk_rows"] == 256, patched
    assert max(patched["whole_request_logits_rows"]) == 1999, patched
    assert patched["peak_cpu_bytes"] <= 3 * patched["fp32_logits_bytes_chunk"], patched
    assert patched["whole_request_peak_cpu_bytes"] >= 2 * patched["fp32_logits_bytes_whole_request"], patched
    assert patched["gather_ids_dtype"] == "torch.int64", patched
