"""Reproducers of the v0.26.0 fixes on vllm_gaudi/v1/worker/hpu_input_batch.py's batch bookkeeping:
`sampling-rows-refresh` and `resumed-prefill-logits`.

Each runs its script in tests/repro_v0_26_0/ in the simulated image (tests/gaudi_sim.py): the real b059f9c
`InputBatch` and the real model-runner functions that read it, against vLLM 0.26.0's own classes. Pristine, the
symptom the fix names shows; with the whole profile applied by the real tool (`patched_site`) it is gone.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image


def test_sampling_rows_refresh(sim_image, patched_site) -> None:
    """After the runner reorders the batch with no request added or removed (batch_changed False, skip_copy=True),
    every sampled request must get its own device sampling rows and prompt-token rows."""
    pristine = sim_image.repro("sampling-rows-refresh")  # the image as shipped
    assert not pristine["fixed"] and "stale sampling rows after a reorder" in pristine["symptom"], pristine
    # Both halves of the bug show: the device rows (each request sampled with the other's temperature...) and the
    # penalties' prompt-token cache (each request penalised with the other's prompt).
    assert any("step 2 decode: b sampled with {'temperature': 0.5" in s for s in pristine["stale"]), pristine
    assert any("step 4 decode: a penalised with prompt_token_ids [90, 91, 92, 93]" in s
               for s in pristine["stale"]), pristine
    patched = sim_image.repro("sampling-rows-refresh", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["orders"] == pristine["orders"] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]], patched


def test_resumed_prefill_logits(sim_image, patched_site) -> None:
    """A request resumed after preemption from a prefix-cache hit must be sampled once, at its last scheduled position
    (none mid-chunk); a resumed request with no hit and a re-added running decode behave as before."""
    pristine = sim_image.repro("resumed-prefill-logits")  # the image as shipped
    assert not pristine["fixed"] and "resumed prefill sampled at recomputed positions" in pristine["symptom"], pristine
    hit = pristine["cases"]["prefix hit inside the prompt"]
    assert hit["num_prompt_tokens"] == 10 and hit["logits_positions"] == [1, 2, 3, 4, 5, 6], pristine
    patched = sim_image.repro("resumed-prefill-logits", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["cases"]["prefix hit inside the prompt"] == {"num_prompt_tokens": 15, "is_prompt": True,
                                                                "logits_positions": [6]}, patched
    for control in ("control: no prefix hit", "control: running decode re-added"):
        assert patched["cases"][control] == pristine["cases"][control], (control, patched)
