"""Reproducers of the v0.26.0 fixes in vllm_gaudi/v1/worker/hpu_input_batch.py that concern the rows of one sampling
call: bad-words-index, logitsprocs-rows, seeded-sampling.

Each runs `tests/repro_v0_26_0/<fix>.py` in the simulated image (tests/gaudi_sim.py): the real b059f9c `InputBatch`
against vLLM 0.26.0's real `SamplingParams`, `CachedRequestState`, logits processors and `Sampler`. The pristine image
must show the symptom the fix names; the overlay with the whole v0.26.0 profile applied must not.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image


def test_bad_words_index(sim_image, patched_site) -> None:
    """Bad words keyed by batch slot: IndexError in vLLM's apply_bad_words for a subset of the batch, and the ban on
    a pad row (the request samples the banned token) for a padded prefill."""
    pristine = sim_image.repro("bad-words-index")
    assert not pristine["fixed"], pristine
    assert "IndexError: index 2 is out of bounds for dimension 0 with size 2" in pristine["symptom"], pristine
    assert "case B: the request sampled the banned token" in pristine["symptom"], pristine
    patched = sim_image.repro("bad-words-index", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["case_a_tokens"] == [5, 9] and patched["case_b_tokens"][0] == 9, patched


def test_logitsprocs_rows(sim_image, patched_site) -> None:
    """No BatchUpdate reaches vLLM's built-in logits processors: logit_bias, min_p and min_tokens change nothing;
    with the payload each takes effect on its own row, for a padded decode batch and a reordered subset, after a
    condense and a swap, and min_tokens lets EOS through once reached."""
    pristine = sim_image.repro("logitsprocs-rows")
    assert not pristine["fixed"], pristine
    for symptom in ("logit_bias ignored", "min_p ignored", "min_tokens ignored"):
        assert symptom in pristine["symptom"], (symptom, pristine)
    patched = sim_image.repro("logitsprocs-rows", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["decode_tokens"] == {"plain-4": [7], "minp": [7], "mintok": [5], "bias": [9]}, patched
    assert patched["after_min_tokens"]["mintok"] == [7], patched


def test_seeded_sampling(sim_image, patched_site) -> None:
    """Pad rows repeat the first request and each advances its seeded generator (CPU-visible part of the bug; the
    lazy-mode segfault itself needs a Gaudi card): the seeded stream depends on the pad count."""
    pristine = sim_image.repro("seeded-sampling")
    assert not pristine["fixed"], pristine
    assert "2 pad rows: the seeded generator advanced 3 times in one step" in pristine["symptom"], pristine
    assert "6 pad rows: the seeded generator advanced 7 times in one step" in pristine["symptom"], pristine
    patched = sim_image.repro("seeded-sampling", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["tokens"]["0"] == patched["tokens"]["2"] == patched["tokens"]["6"], patched
