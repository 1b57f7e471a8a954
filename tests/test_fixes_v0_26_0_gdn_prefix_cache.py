"""Reproducers of the opt-in fix gdn-prefix-cache on the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py).

Three scripts (tests/repro_v0_26_0/gdn_prefix_cache*.py) run the real b059f9c modules (ops/hpu_gdn_pytorch.py,
ops/causal_conv1d_pytorch.py, models/qwen3_5.py, v1/worker/hpu_model_runner.py, v1/core/sched/hpu_async_scheduler.py)
against vLLM 0.26.0's own KV-cache manager: once on the image as shipped (the bug shows) and once on an overlay with
`--profile v0.26.0 gdn-prefix-cache` applied by the real fix tool. Proven on a CPU: the kernel, the bookkeeping and
the wiring of the GDN layer forward with the runner's plans. Not proven: the Gaudi device path (HPU graphs and
torch.compile of the patched forward, the device kernels, throughput).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_sim import SimImage, apply_all, overlay

pytestmark = pytest.mark.sim_image

PROFILE = "v0.26.0"
FIX = "gdn-prefix-cache"


def _fixed_site(sim_image: SimImage, tmp_path: Path) -> Path:
    site = overlay(sim_image, tmp_path / "site")
    done = apply_all(sim_image, "--profile", PROFILE, FIX, "--root", str(site))
    assert done.returncode == 0, done.stderr
    return site


def test_gdn_prefix_cache(sim_image: SimImage, tmp_path: Path) -> None:
    """Kernel: the b059f9c conv op + chunked GDN path on one layer (fp32), cold vs resumed at every hit the seeds'
    hybrid blocks allow (384 tokens: hits at 384 and 768 of a 968-token prompt; 1,152: a hit at 1,152 of 1,452, both
    ending mid-block), checked against a naive token-by-token recurrence. Pristine: a hit resumes from the request's
    private slot (zeros, or another request's state): the resumed output is off by >= 0.07. With the payload: the
    prefix ran with checkpoints at its block ends, stored in the GDN blocks' attention pages, and the hit restored
    from the page: equal to the cold run (and to the naive recurrence within 1e-4).

    Bookkeeping: vLLM 0.26.0's KVCacheManager (hybrid, 'align' Mamba mode) block tables for a prefill and two hits,
    at 384 and 1,152-token blocks. Pristine: chunk ends on 128-token multiples (512 of a 384-token block) and a hit
    reads the private compact slot; nothing holds the state at the hit's end. With the payload: chunks end on block
    boundaries, every checkpoint lands in the request's real GDN block at its block end after that block was zeroed,
    every hit restores the checkpoint written at exactly its hit length into the slot its layers read; each of seven
    deliberate off-by-one variants of the functions is caught.

    Wiring: the real `HPUGatedDeltaNetAttention.forward` (prefill and decode) fed the plans of the runner's new
    methods: hits of 768 (its last block completed by a decode) and 384 tokens, and a 768-token hit whose one
    remaining token runs as a decode (a request resumed after preemption), equal their cold runs with the payload;
    pristine, resumed from a re-used slot, they are off by >= 0.03."""
    site = _fixed_site(sim_image, tmp_path)

    pristine = sim_image.repro("gdn-prefix-cache-kernel")
    assert not pristine["fixed"] and not pristine["patched_kernel"], pristine
    assert "a prefix-cache hit resumes from the request's private GDN slot" in pristine["symptom"], pristine
    assert pristine["cold_matches_naive"] and pristine["min_wrong_state_error"] > 0.01, pristine
    patched = sim_image.repro("gdn-prefix-cache-kernel", overlay=site)
    assert patched["fixed"], patched
    hits = [(c["block"], h["hit_tokens"], h["resumed_tokens"]) for c in patched["cases"] for h in c["hits"]]
    assert hits == [(384, 384, 584), (384, 768, 200), (1152, 1152, 300)], patched
    assert patched["max_checkpoint_error"] < 1e-4 < 0.01 < patched["min_wrong_state_error"], patched

    pristine = sim_image.repro(FIX)
    assert not pristine["fixed"], pristine
    assert "reads GDN state index 4 (the request's private compact slot)" in pristine["symptom"], pristine
    assert "are not on 384-token block boundaries" in pristine["symptom"], pristine
    patched = sim_image.repro(FIX, overlay=site)
    assert patched["fixed"] and not patched["failures"], patched
    assert all(v is True or str(v).startswith("raised") for v in patched["off_by_one_caught"].values()), patched
    assert len(patched["off_by_one_caught"]) == 7, patched
    assert [h["hit_tokens"] for r in patched["results"] for h in r["hits"]] == [768, 384, 384, 384,
                                                                               2304, 1152, 1152, 1152], patched

    pristine = sim_image.repro("gdn-prefix-cache-wiring")
    assert not pristine["fixed"] and not pristine["patched"], pristine
    assert all(r["hit_tokens"] == r["expected_hit"] and r["max_hit_vs_cold"] > 0.01
               for r in pristine["results"]), pristine
    patched = sim_image.repro("gdn-prefix-cache-wiring", overlay=site)
    assert patched["fixed"], patched
    assert [(r["req"], r["hit_tokens"]) for r in patched["results"]] == [("B", 768), ("C", 384),
                                                                         ("E (decode)", 768)], patched
