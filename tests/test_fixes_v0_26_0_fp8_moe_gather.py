"""Contract test of the v0.26.0 opt-in fix `fp8-moe-gather` on the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py).

An opt-in backport (the gathered-expert FP8 MoE decode path behind VLLM_HPU_MOE_GATHER), proven gaudi-only: the real
FP8 kernel, the device graphs and the speed-up need a Gaudi card. The script (tests/repro_v0_26_0/fp8_moe_gather.py)
runs the real `HPUFp8MoEMethod` of vllm_gaudi/ops/hpu_fp8.py (vLLM 0.26.0's Fp8Config and FusedMoEConfig, a 128x128
block-FP8 layer converted to per-channel FP8 as the seed's Qwen3.5-122B-A10B-FP8 runs) with CPU references of
torch.ops.hpu.cast_to_fp8_v2, fp8_gemm_v2 and the stock mixture_of_experts kernel, on one card holding 64 experts and
on card 2 of 4 holding 64 of 256 (expert parallelism), top_k 8, ratio 1.0.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_sim import SimImage, apply_all, overlay

pytestmark = pytest.mark.sim_image

PROFILE = "v0.26.0"
CARDS = {"one card, 64 experts", "expert parallel, card 2 of 4 (experts 128..191 of 256)"}


def test_fp8_moe_gather(sim_image: SimImage, tmp_path: Path) -> None:
    """Gaudi-only (speed, device graphs, the real FP8 kernel); this is the payload's contract. Pristine b059f9c: there
    is no gathered path, VLLM_HPU_MOE_GATHER=1 does nothing ("apply_monolithic ran the stock MoE op at 1 decode
    token(s), expected gathered") and vllm_gaudi.ops.hpu_moe_combine does not exist.

    With the payload, on both cards: unset, the stock op runs (off by default); VLLM_HPU_MOE_GATHER=1 with ratio 1.0
    maps to 8 tokens (64 experts / top_k 8) and ratio 0.5 to 4; at 1..8 decode tokens (3 random routings each, one
    token routed only off the expert-parallel card) only the FP8 GEMMs on the G = min(64, 8 * tokens) gathered
    experts run (two each), within 0.08
    relative L2 per token of the stock op (measured 0.024-0.032: the gathered path quantizes the SiLU output to FP8,
    the reference kernel does not) and within 1e-2 of a reference written in the script that quantizes as it does
    (measured 0 to 9.4e-4); at 9 tokens the stock op runs, bit-identical. VLLM_HPU_MOE_GATHER_VERIFY=1 runs both,
    passes on the right gather, and raises "differs from the stock op" on a gather shifted by one expert (relative
    error 0.9-1.0)."""
    pristine = sim_image.repro("fp8-moe-gather")
    assert not pristine["fixed"], pristine
    assert ("VLLM_HPU_MOE_GATHER=1 (one card, 64 experts): apply_monolithic ran the stock MoE op at 1 decode "
            "token(s), expected gathered") in pristine["symptom"], pristine
    assert "No module named 'vllm_gaudi.ops.hpu_moe_combine'" in pristine["symptom"], pristine
    assert not pristine["combine_module"], pristine
    for card, got in pristine["cards"].items():
        assert all(t["path"] == ["stock"] for t in got["tokens"].values()), (card, got)

    site = overlay(sim_image, tmp_path / "site")
    done = apply_all(sim_image, "--profile", PROFILE, "fp8-moe-gather", "--root", str(site))
    assert done.returncode == 0, done.stderr
    patched = sim_image.repro("fp8-moe-gather", overlay=site)
    assert patched["fixed"], patched
    assert patched["combine_module"] and set(patched["cards"]) == CARDS, patched
    for card, got in patched["cards"].items():
        assert got["threshold"] == 8 and got["default_off_path"] == "stock", (card, got)
        assert set(got["tokens"]) == {str(t) for t in range(1, 10)}, (card, got)
        for tokens, t in got["tokens"].items():
            assert t["path"] == (["gathered"] if int(tokens) <= 8 else ["stock"]), (card, tokens, t)
            assert t["max_rel_err"] <= (0.08 if int(tokens) <= 8 else 0.0), (card, tokens, t)
            assert t["max_rel_err_matched"] <= 1e-2, (card, tokens, t)
            # reads only G = min(64, 8 * tokens) experts: two FP8 GEMMs each (8 tokens: all 64, the boundary)
            assert t["fp8_gemms"] == ([2 * min(64, 8 * int(tokens))] if int(tokens) <= 8 else [0]), (card, tokens, t)
        assert got["verify_right_gather"] == "passed" and got["verify_path"] == "both", (card, got)
        assert "differs from the stock op" in got["verify_wrong_gather"], (card, got)
        assert got["wrong_gather_rel_err"] > 0.5, (card, got)
    assert patched["cards"]["one card, 64 experts"]["threshold_ratio_0.5"] == 4, patched
