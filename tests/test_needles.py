"""cookbook.checks.needles: scoring and wording (unit), the grid on SmolLM2 (integration)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from cookbook import plots
from cookbook.checks import CHECKS, CheckContext, run_checks
from cookbook.checks.needles import NeedleCell, NeedleGrid, default_lengths, result_text
from cookbook.endpoint import Endpoint
from cookbook.recipes import Recipe
from cookbook.results import CheckResult


def cell(length: int, depth: float, found: bool, seconds: float = 1.0, cached: int | None = 0) -> NeedleCell:
    return NeedleCell(
        target_tokens=length, prompt_tokens=length, depth=depth, actual_depth=depth, needle_key="the blue door",
        needle_value="4829173", answer="4829173" if found else "I do not know", found=found, seconds=seconds,
        cached_tokens=cached,
    )


def grid(rows: dict[int, list[bool]]) -> NeedleGrid:
    depths = [0.1, 0.5, 0.9]
    cells = [cell(length, d, ok) for length, oks in rows.items() for d, ok in zip(depths, oks)]
    return NeedleGrid(lengths=list(rows), depths=depths, cells=cells)


def test_registered_in_the_long_context_group() -> None:
    assert CHECKS["needles"].group == "long-context"
    assert CHECKS["prefix-cache"].group == "long-context"


def test_result_text_in_the_seeds_wording() -> None:
    everything = grid({65000: [True] * 3, 131000: [True] * 3, 244000: [True] * 3})
    assert everything.passed
    assert result_text(everything) == "3/3 at 65K, 131K and 244K tokens"
    partial = grid({2000: [True] * 3, 4000: [True] * 3, 7600: [True, False, True]})
    assert not partial.passed
    assert result_text(partial) == "3/3 at 2K and 4K, 2/3 at 7.6K tokens"


def test_a_cell_that_was_not_cold_fails_the_grid() -> None:
    warm = NeedleGrid(lengths=[1000], depths=[0.5], cells=[cell(1000, 0.5, True, cached=896)])
    assert not warm.passed
    assert result_text(warm) == "1/1 at 1K tokens; 1 cell not cold (cached tokens with a fresh cache_salt)"


def test_times_keep_the_first_cell_apart() -> None:
    timed = NeedleGrid(
        lengths=[65000], depths=[0.1, 0.5], cells=[cell(65000, 0.1, True, 99.0), cell(65000, 0.5, True, 17.0)]
    )
    assert timed.times() == {"65000": {"first": 99.0, "min": 17.0, "max": 99.0}}


def test_default_lengths_follow_the_seeds_proportions() -> None:
    assert default_lengths(262144) == [65000, 131000, 244000]
    assert default_lengths(8192) == [2031, 4096, 7618]


@pytest.mark.integration
def test_needle_grid_on_smollm2(cpu_server: Endpoint, cpu_recipe: Recipe, tmp_path: Path) -> None:
    lengths = [800, 2000]
    started = time.monotonic()
    ctx = CheckContext(cpu_server, cpu_recipe, out_dir=tmp_path, params={"needle_lengths": lengths})
    [result] = run_checks(ctx, ["needles"]).checks
    cells = result.details["cells"]
    assert len(cells) == len(lengths) * 3
    assert sorted({c["prompt_tokens"] for c in cells}) == lengths  # token-exact, as the server counted them
    assert len({c["needle_value"] for c in cells}) == len(cells)  # a fresh needle per cell
    assert all(not c["cached_tokens"] for c in cells)  # every cell cold
    for c in cells:
        assert c["found"] == (c["needle_value"] in c["answer"])
    assert "figure" not in result.details and list(tmp_path.iterdir()) == []  # the check returns data, never draws
    assert plots.save(plots.needles_figure(result), tmp_path / "needles.png").read_bytes()[:4] == b"\x89PNG"
    # SmolLM2-135M finds the needle at every cell of this grid (measured); a miss is a real regression.
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    assert result.result == "3/3 at 800 and 2K tokens"
    assert result.label == "Needle in a haystack, 3 depths, cold"
    print(f"\nSmolLM2 needles: {result.result}; times {result.details['times']} ({time.monotonic() - started:.1f} s)")


@pytest.mark.integration
def test_needles_do_not_run_on_the_random_weight_hybrid(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    [result] = run_checks(CheckContext(hybrid_server, hybrid_recipe), ["needles"]).checks
    assert result.status == "skipped" and "random weights" in result.result


# -- through the fault proxy ---------------------------------------------------------------------------------------


def _needles_through(server: Endpoint, recipe: Recipe, fault: object, lengths: list[int], depths: list[float]) -> CheckResult:
    from cookbook.faultproxy import FaultProxy

    with FaultProxy(server.base_url, fault) as proxy:  # type: ignore[arg-type]
        params = {"needle_lengths": lengths, "needle_depths": depths}
        ctx = CheckContext(Endpoint(proxy.base_url, server.model), recipe, params=params)
        [result] = run_checks(ctx, ["needles"]).checks
    return result


@pytest.mark.integration
def test_a_needle_lost_beyond_a_depth_fails_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import NeedleLostBeyond

    result = _needles_through(cpu_server, cpu_recipe, NeedleLostBeyond(depth=0.5), [800], [0.1, 0.9])
    assert result.status == "fail"
    assert result.result == "1/2 at 800 tokens"
    [miss] = [c for c in result.details["cells"] if not c["found"]]
    assert miss["depth"] == 0.9
    assert "expected" in result.evidence[0].note and "at depth 0.9" in result.evidence[0].note


@pytest.mark.integration
def test_a_needle_lost_beyond_a_length_fails_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import NeedleLostBeyond

    result = _needles_through(cpu_server, cpu_recipe, NeedleLostBeyond(depth=None, tokens=1500), [800, 2000], [0.5])
    assert result.status == "fail"
    assert result.result == "1/1 at 800, 0/1 at 2K tokens"
    assert any(re.search(NeedleLostBeyond.symptom, e.note) for e in result.evidence), [e.note for e in result.evidence]


@pytest.mark.integration
def test_a_shorter_needle_lost_or_altered_still_fails(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """The recipe's shorter needle (verification.needles.value_digits) detects as the seven-digit one did: a needle
    lost beyond a depth fails its cell, and only that cell."""
    from cookbook.faultproxy import FaultProxy
    from cookbook.faults_longctx import NeedleLostBeyond

    with FaultProxy(cpu_server.base_url, NeedleLostBeyond(depth=0.5)) as proxy:
        params = {"needle_lengths": [800], "needle_depths": [0.1, 0.9], "needle_digits": 5}
        [result] = run_checks(CheckContext(Endpoint(proxy.base_url, cpu_server.model), cpu_recipe, params=params), ["needles"]).checks
    assert result.status == "fail" and result.result == "1/2 at 800 tokens"
    assert all(len(c["needle_value"]) == 5 for c in result.details["cells"])
    [miss] = [c for c in result.details["cells"] if not c["found"]]
    assert miss["depth"] == 0.9 and miss["needle_value"] not in miss["answer"]


@pytest.mark.integration
def test_cached_tokens_on_a_cold_cell_fail_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import CachedOnCold

    result = _needles_through(cpu_server, cpu_recipe, CachedOnCold(), [800], [0.5])
    assert result.status == "fail"
    assert result.result == "1/1 at 800 tokens; 1 cell not cold (cached tokens with a fresh cache_salt)"
    assert any(re.search(CachedOnCold.symptom, e.note) for e in result.evidence), [e.note for e in result.evidence]


def test_the_needle_fault_finds_the_needle_depth_in_a_request() -> None:
    from cookbook.faults_longctx import needle_depth
    from cookbook.haystack import _messages, make_needle

    needle = make_needle(0)
    content = _messages(f"{'Filler. ' * 90}{needle.sentence} {'Filler. ' * 10}", needle)[0]["content"]
    depth = needle_depth(content)
    assert depth is not None and 0.75 < depth < 0.95
    assert needle_depth("no document here") is None


def test_long_context_faults_are_made_by_name_from_a_table_of_ones_own() -> None:
    from cookbook.faultproxy import FAULTS, fault_table, make_fault
    from cookbook.faults_longctx import LONG_CONTEXT_FAULTS

    table = fault_table(LONG_CONTEXT_FAULTS)  # a fresh dict: the shared FAULTS stays as it was
    for name, fault in LONG_CONTEXT_FAULTS.items():
        made = make_fault(name, table)
        assert type(made) is type(fault) and made is not fault
        assert set(made.catches) <= {"prefix-cache", "needles"} and made.symptom
        assert name not in FAULTS
