"""The run folder's contents: the notebooks' parts merged into one RunResults, checks in the Verified table's order."""
from __future__ import annotations

from pathlib import Path

import pytest

from cookbook import run_folder
from cookbook.errors import CookbookError
from cookbook.recipes import load_recipe
from cookbook.results import CheckResult, Figure, Hardware, RunResults, write_results

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_merge_parts(tmp_path: Path) -> None:
    hw = Hardware(kind="cpu", description="c")
    write_results(RunResults(recipe=CPU, model="m", hardware=hw, kv_pool_tokens=93184, started_at="2026-01-02"),
                  tmp_path / "parts" / "launch.json")
    write_results(RunResults(recipe=CPU, model="m", hardware=hw, started_at="2026-01-01",
                             checks=[CheckResult(name="a", label="A", status="pass", result="1/1")],
                             artifacts={"verify": "verify.png"}), tmp_path / "parts" / "verify.json")
    write_results(RunResults(recipe=CPU, model="m", hardware=hw, performance_note="Single runs (measured as: x).",
                             performance=[Figure(name="single-stream", label="One", result="1 tokens/s")]),
                  tmp_path / "parts" / "throughput.json")
    merged = run_folder.merge_parts(tmp_path, load_recipe(CPU))
    assert merged is not None
    assert merged.kv_pool_tokens == 93184 and [c.name for c in merged.checks] == ["a"]
    assert [f.name for f in merged.performance] == ["single-stream"]
    assert merged.artifacts == {"verify": "verify.png"} and merged.started_at == "2026-01-01"
    assert merged.performance_note == "Single runs (measured as: x)."
    write_results(RunResults(recipe="other", model="m", hardware=hw), tmp_path / "parts" / "zz.json")
    with pytest.raises(CookbookError, match="zz.json"):
        run_folder.merge_parts(tmp_path, load_recipe(CPU))


def test_checks_come_in_the_verified_tables_order() -> None:
    hw = Hardware(kind="cpu", description="c")
    names = ["needles", "server-health", "prefix-cache", "unknown-thing", "known-answer"]
    results = RunResults(recipe=CPU, model="m", hardware=hw,
                         checks=[CheckResult(name=n, label=n, status="pass", result="") for n in names])
    ordered = [c.name for c in run_folder.in_table_order(results).checks]
    assert ordered == ["known-answer", "prefix-cache", "needles", "server-health", "unknown-thing"]
