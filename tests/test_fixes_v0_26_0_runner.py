"""Reproducers of the v0.26.0 fixes in vllm_gaudi/v1/worker/hpu_model_runner.py on the simulated vllm-gaudi v0.26.0
image (tests/gaudi_sim.py): prompt-order, structured-output-rows and hybrid-decode-pad.

Each script (tests/repro_v0_26_0/<fix>.py) imports the real b059f9c model runner (its habana_frameworks imports are
served by the CPU stand-in, tests/standins) and runs the real method on real vLLM 0.26.0 objects: once on the image as
shipped (the bug shows) and once on an overlay with the whole v0.26.0 profile applied by the real fix tool.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image


def test_prompt_order(sim_image, patched_site) -> None:
    """`HPUModelRunner._ensure_decodes_first` on the persistent batch [P0, P1, D2, D3] (the runner's `_update_states`
    filled the freed slots 0 and 1 with the new prompts, in the scheduler's order; P1 has a prefix-cache hit on the
    block P0 writes in this step). Pristine: the swaps reverse the prompts ([D3, D2, P1, P0]), so P1's prefill runs,
    and reads the shared block, before P0 has written it. With the payload: [D2, D3, P0, P1], a stable partition; the
    block-table rows move with their requests."""
    pristine = sim_image.repro("prompt-order")
    assert not pristine["fixed"], pristine
    assert "P1 reads the prefix block P0 writes in this step before P0 runs" in pristine["symptom"], pristine
    assert pristine["prefill_order"] == ["P1", "P0"], pristine
    patched = sim_image.repro("prompt-order", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["batch_after"] == ["D2", "D3", "P0", "P1"], patched


def test_structured_output_rows(sim_image, patched_site) -> None:
    """`HPUModelRunner.sample_tokens` on a mixed step (decode D0, prompt chunk P0, both under a grammar), with only the
    model forward and the input preparation replaced. The logits are joined decodes first and the grammar bitmask is
    applied by batch index (decodes first: right), but pristine builds the sampling metadata prompt first, so row 0
    (D0) is sampled with P0's temperature and output history and row 1 with D0's. With the payload every row carries
    its own request's grammar mask, sampling parameters and output history."""
    pristine = sim_image.repro("structured-output-rows")
    assert not pristine["fixed"], pristine
    assert "logits row 0 (D0): grammar mask of D0, sampling params of P0" in pristine["symptom"], pristine
    patched = sim_image.repro("structured-output-rows", overlay=patched_site)
    assert patched["fixed"], patched
    assert [(r["request"], r["grammar_mask_of"], r["sampling_params_of"], r["output_history_of"])
            for r in patched["rows"]] == [("D0", "D0", "D0", "D0"), ("P0", "P0", "P0", "P0")], patched


def test_hybrid_decode_pad(sim_image, patched_site) -> None:
    """`HPUModelRunner.initialize_kv_cache` on a hybrid layout (GDN + attention, 384-token KV-manager block split into
    128-token kernel blocks, 8 blocks: 25 kernel blocks allocated, 3..23 mapped to a request by vLLM's block table).
    Pristine: the decode pad block is 8 (pad slots 1024..1151), a kernel block of scheduler block 2, which padded
    decode rows overwrite. With the payload: the pad block is 24, the spare last kernel block (slot 3072), and the
    Mamba/GDN pad stays 8 (its state tensors have num_blocks + 1 slots)."""
    pristine = sim_image.repro("hybrid-decode-pad")
    assert not pristine["fixed"], pristine
    assert "decode pad block 8 is a live kernel block" in pristine["symptom"], pristine
    patched = sim_image.repro("hybrid-decode-pad", overlay=patched_site)
    assert patched["fixed"], patched
    assert (patched["pad_block_id"], patched["pad_slot_id"], patched["mamba_pad_block_id"]) == (24, 3072, 8), patched
