"""Roofline arithmetic against cases worked out by hand from the seeds' published figures."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cookbook import roofline
from cookbook.recipes import ModelFacts, load_recipe
from cookbook.results import Figure, Hardware
from cookbook.roofline import (
    GAUDI2,
    GAUDI3,
    HardwareFacts,
    bytes_per_step,
    distinct_experts,
    expert_split,
    hardware_facts,
    roofline_for,
    roofline_rows,
    verdict,
)

CODER_NEXT = "Qwen/Qwen3-Coder-Next"  # 80B total, 3B active, 512 experts, 10 per token, BF16, 4x Gaudi 2
AGENTWORLD = "Qwen/Qwen-AgentWorld-35B-A3B"  # 35B total, 3B active, 256 experts, 8 per token, BF16, 2x Gaudi 2


def _model(**fields: float) -> ModelFacts:
    base = dict(id="m", architecture="A", summary="s", description="d", params_total=1e9, params_active=1e9, bytes_per_weight=2)
    return ModelFacts(**{**base, **fields})  # type: ignore[arg-type]


def _figure(name: str, **metrics: float) -> Figure:
    return Figure(name=name, label=name, result="", metrics=metrics)


def test_datasheet_facts() -> None:
    assert GAUDI2.bandwidth_per_card == 2.45e12 and GAUDI2.memory_gb == 96
    assert GAUDI3.bandwidth_per_card == 3.7e12 and GAUDI3.memory_gb == 128


def test_3b_active_bf16_reads_6_gb_per_step_at_batch_1_so_408_steps_per_card() -> None:
    model = load_recipe(AGENTWORLD).model
    step = bytes_per_step(model, 1)
    assert step == pytest.approx(6.0e9)  # 3e9 active params x 2 bytes
    assert GAUDI2.bandwidth_per_card / step == pytest.approx(408.3, abs=0.1)


def test_expert_split_of_qwen3_coder_next() -> None:
    non_expert, expert = expert_split(load_recipe(CODER_NEXT).model)
    # expert = (80e9 - 3e9) / (1 - 10/512) = 78.534e9; the rest (attention, shared expert, embeddings) 1.466e9
    assert expert == pytest.approx(78.534e9, rel=1e-4)
    assert non_expert == pytest.approx(1.466e9, rel=1e-3)
    assert non_expert + expert * 10 / 512 == pytest.approx(3.0e9)


def test_distinct_experts() -> None:
    assert distinct_experts(512, 10, 1) == pytest.approx(10)
    # 512 * (1 - (502/512)^8) = 74.74
    assert distinct_experts(512, 10, 8) == pytest.approx(74.74, abs=0.01)
    assert distinct_experts(256, 8, 16) == pytest.approx(256 * (1 - (31 / 32) ** 16))
    assert distinct_experts(512, 10, 10_000) == pytest.approx(512)  # a huge batch reads every expert
    assert distinct_experts(0, 0, 8) == 0


def test_dense_models_read_every_weight_at_every_batch() -> None:
    model = _model(params_total=134.5e6, params_active=134.5e6)
    assert expert_split(model) == (134.5e6, 0.0)
    assert bytes_per_step(model, 1) == bytes_per_step(model, 64) == pytest.approx(269e6)


def test_fp8_is_one_byte_per_weight() -> None:
    model = load_recipe("Qwen/Qwen3.5-122B-A10B-FP8").model
    assert bytes_per_step(model, 1) == pytest.approx(10e9)
    assert roofline.all_weight_bytes(model) == pytest.approx(122e9)


def test_cards_come_from_the_run_description() -> None:
    recipe = load_recipe(CODER_NEXT)
    assert hardware_facts(Hardware(kind="gaudi2", description="four Gaudi 2 cards")).cards == 4  # type: ignore[union-attr]
    assert hardware_facts(Hardware(kind="gaudi3", description="8x Gaudi 3")).bandwidth == pytest.approx(8 * 3.7e12)  # type: ignore[union-attr]
    assert hardware_facts(Hardware(kind="gaudi2", description="Gaudi 2 box"), recipe).cards == 4  # type: ignore[union-attr]
    assert hardware_facts(None, recipe).cards == 4  # type: ignore[union-attr]  # published figures: the recipe's own
    assert hardware_facts(Hardware(kind="unknown", description="not stated"), recipe) is None


def test_qwen3_coder_next_published_figures() -> None:
    """12.7 tokens/s at batch 1 on four Gaudi 2 cards: 6 GB x 12.7 / 9.8 TB/s = 0.78 % of the bandwidth; at 8
    streams (11.6 per stream) the step time barely moves while the routed experts' bytes grow 4.3x."""
    recipe = load_recipe(CODER_NEXT)
    hw = Hardware(kind="gaudi2", description="four Gaudi 2 cards")
    single = roofline_for(recipe, _figure("single-stream", streams=1, tokens_per_s=12.7), hw)
    assert single is not None
    assert single.bytes_per_step == pytest.approx(6.0e9)
    assert single.bound_steps_per_s == pytest.approx(9.8e12 / 6.0e9)
    assert single.mbu == pytest.approx(6.0e9 * 12.7 / 9.8e12)
    assert single.mbu == pytest.approx(0.00778, abs=1e-5)
    assert single.effective_bytes_per_token == pytest.approx(9.8e12 / 12.7)
    assert single.mbu == pytest.approx(single.bytes_per_token_bound / single.effective_bytes_per_token)
    assert single.rate_source == "end to end"

    eight = roofline_for(recipe, _figure("n-streams", streams=8, aggregate_tokens_per_s=92.4, per_stream_tokens_per_s=11.6), hw)
    assert eight is not None and eight.batch == 8
    assert eight.experts_touched == pytest.approx(74.74, abs=0.01)
    non_expert, expert = expert_split(recipe.model)
    assert eight.bytes_per_step == pytest.approx(2 * (non_expert + expert * 74.74 / 512), rel=1e-4)
    assert eight.measured_tokens_per_s == pytest.approx(92.8)  # 11.6 per stream x 8

    rows = roofline_rows(recipe, [_figure("single-stream", streams=1, tokens_per_s=12.7),
                                  _figure("n-streams", streams=8, aggregate_tokens_per_s=92.4, per_stream_tokens_per_s=11.6)], hw)
    line = verdict(rows, recipe)
    assert "reads every BF16 expert at each step" in line
    assert "x4.3" in line


def test_published_results_files_give_the_seed_verdict() -> None:
    from cookbook.results import read_results

    recipe = load_recipe(CODER_NEXT)
    published = read_results(recipe.folder / "results.json")
    rows = roofline_rows(recipe, published.performance, published.hardware)
    assert [r.figure for r in rows] == ["single-stream", "n-streams"]
    assert all(0 < r.mbu < 1 for r in rows)
    assert "every BF16 expert" in verdict(rows, recipe)


def test_tpot_is_preferred_and_batch_is_capped_at_max_num_seqs() -> None:
    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")  # --max-num-seqs 8
    facts = HardwareFacts(kind="cpu", bandwidth_per_card=20e9, source="declared")
    row = roofline_for(recipe, _figure("n-streams", streams=16, aggregate_tokens_per_s=100.0, tpot_ms_mean=50.0), facts)
    assert row is not None
    assert row.batch == 8  # 16 streams, 8 decode together
    assert row.rate_source == "TPOT"
    assert row.measured_steps_per_s == pytest.approx(20.0)
    assert row.measured_tokens_per_s == pytest.approx(160.0)
    assert row.mbu == pytest.approx(269e6 * 20 / 20e9)
    assert row.experts_touched is None


def test_no_row_for_cold_prompts_or_unknown_hardware() -> None:
    recipe = load_recipe(CODER_NEXT)
    cold = _figure("cold-prompt-65K", prompt_tokens=65000, seconds_to_answer_min=6)
    assert roofline_for(recipe, cold) is None
    assert roofline_for(recipe, _figure("single-stream", tokens_per_s=12.7), Hardware(kind="unknown", description="?")) is None
    assert roofline_rows(recipe, [cold], Hardware(kind="unknown", description="?")) == []


def test_sweep_rows_come_from_the_sweep_figure() -> None:
    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    facts = HardwareFacts(kind="cpu", bandwidth_per_card=20e9, source="declared")
    sweep = Figure(name="sweep", label="", result="", details={"rows": [
        {"streams": 1, "tpot_ms_mean": 20.0, "aggregate_tokens_per_s": 48.0},
        {"streams": 4, "tpot_ms_mean": 40.0, "aggregate_tokens_per_s": 95.0},
    ]})
    rows = roofline_rows(recipe, [sweep], facts)
    assert [r.figure for r in rows] == ["sweep@1", "sweep@4"]
    assert "x2.00" in rows[1].verdict and "not bandwidth" in rows[1].verdict  # dense: the same bytes, twice the time


def test_declared_cpu_bandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(roofline.CPU_BANDWIDTH_ENV, "12.5")
    facts = hardware_facts(Hardware(kind="cpu", description="2 vCPU"))
    assert facts is not None and facts.bandwidth == pytest.approx(12.5e9)
    assert "declared" in facts.source


def test_measured_cpu_bandwidth_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv(roofline.CPU_BANDWIDTH_ENV, raising=False)
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # a quiet machine: the figure is cached
    calls = []
    monkeypatch.setattr(roofline, "measure_read_bandwidth", lambda: calls.append(1) or 30e9)
    first = roofline.cpu_bandwidth()
    second = roofline.cpu_bandwidth()
    assert first[0] == second[0] == 30e9 and len(calls) == 1
    assert math.isclose(roofline.cpu_bandwidth(refresh=True)[0], 30e9) and len(calls) == 2


def test_a_bandwidth_cached_by_another_method_is_measured_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The wall-clock measurement cached on a loaded machine (5.3 GB/s on a CPU that reads 36) must not outlive the
    method that produced it."""
    monkeypatch.delenv(roofline.CPU_BANDWIDTH_ENV, raising=False)
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    stale = tmp_path / "roofline" / "cpu-read-bandwidth.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"cpu": roofline._cpu_model(), "bytes_per_s": 5.25e9, "date": "2026-12-01",
                                 "method": "numpy int64 max, 1 thread, best of 30, 256 MiB"}))
    monkeypatch.setattr(roofline, "measure_read_bandwidth", lambda: 36e9)
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert roofline.cpu_bandwidth()[0] == 36e9
    assert json.loads(stale.read_text())["method"].endswith("thread CPU time")


def test_a_bandwidth_measured_on_an_oversubscribed_machine_is_not_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(roofline.CPU_BANDWIDTH_ENV, raising=False)
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    monkeypatch.setattr(roofline, "measure_read_bandwidth", lambda: 5.25e9)
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (24.0, 20.0, 15.0))
    monkeypatch.setattr(roofline.os, "cpu_count", lambda: 2)
    value, source = roofline.cpu_bandwidth()
    assert value == 5.25e9 and "at load 24.0 (not cached)" in source
    assert not (tmp_path / "roofline" / "cpu-read-bandwidth.json").exists()
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (0.9, 1.0, 1.0))
    roofline.cpu_bandwidth()
    assert json.loads((tmp_path / "roofline" / "cpu-read-bandwidth.json").read_text())["load"] == 0.9


def test_read_bandwidth_measurement_is_plausible() -> None:
    value = roofline.measure_read_bandwidth(nbytes=16 * 2**20, runs=3)
    assert 1e8 < value < 1e13
