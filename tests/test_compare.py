"""cookbook compare: status changes, deltas with regressions in the metric's better direction, the figure."""
from __future__ import annotations

from pathlib import Path

import pytest

from cookbook import compare
from cookbook.cli import main
from cookbook.results import CheckResult, Figure, Hardware, RunResults, write_results


def run(statuses: dict[str, str], tokens_per_s: float, ttft_s: float, kind: str = "cpu") -> RunResults:
    return RunResults(
        recipe="r",
        model="m",
        hardware=Hardware(kind=kind, description=f"a {kind}"),
        checks=[CheckResult(name=n, label=n.title(), status=s, result=s) for n, s in statuses.items()],  # type: ignore[arg-type]
        performance=[
            Figure(name="single-stream", label="One stream", result="x",
                   metrics={"tokens_per_s": tokens_per_s, "ttft_s": ttft_s, "streams": 1, "output_tokens": 256}),
        ],
    )


@pytest.mark.parametrize(
    ("metric", "direction"),
    [("tokens_per_s", "higher"), ("aggregate_tokens_per_s", "higher"), ("mbu", "higher"), ("ttft_s", "lower"),
     ("seconds_to_answer_max", "lower"), ("tpot_ms", "lower"), ("streams", None), ("prompt_tokens", None)],
)
def test_better_direction(metric: str, direction: str | None) -> None:
    assert compare.better_direction(metric) == direction


def test_status_changes_and_regressions() -> None:
    a = run({"known-answer": "pass", "top-logprobs": "pass", "tool-call-auto": "known limitation"}, 20.0, 0.10)
    b = run({"known-answer": "fail", "top-logprobs": "pass", "needles": "pass"}, 18.0, 0.104)
    result = compare.compare_runs(a, b, threshold=0.05)
    changes = {c.name: (c.before, c.after, c.worse) for c in result.status_changes}
    assert changes == {
        "known-answer": ("pass", "fail", True),
        "tool-call-auto": ("known limitation", "absent", False),
        "needles": ("absent", "pass", False),
    }
    deltas = {d.metric: d for d in result.deltas}
    assert set(deltas) == {"tokens_per_s", "ttft_s"}  # unchanged counts are left out
    assert deltas["tokens_per_s"].regression and deltas["tokens_per_s"].change == pytest.approx(-0.10)
    assert not deltas["ttft_s"].regression  # 4% slower: inside the 5% threshold
    assert not result.ok and len(result.regressions) == 1 and len(result.newly_failing) == 1
    text = compare.format_comparison(result)
    assert "known-answer: pass -> fail  WORSE" in text and "REGRESSION" in text


def test_lower_is_better_regression_and_hardware_note() -> None:
    result = compare.compare_runs(run({}, 20.0, 0.10, "gaudi2"), run({}, 20.0, 0.20), threshold=0.05)
    assert [d.metric for d in result.regressions] == ["ttft_s"]
    assert not result.same_hardware
    assert "different hardware" in compare.format_comparison(result)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a"
    write_results(run({"x": "pass"}, 20.0, 0.1), a / "results.json")
    b = write_results(run({"x": "pass"}, 20.5, 0.1), tmp_path / "b.json")
    assert main(["compare", str(a), str(b), "--figure", str(tmp_path / "c.png"), "--json", str(tmp_path / "c.json")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000 and "deltas" in (tmp_path / "c.json").read_text()
    assert "ok: no regression" in capsys.readouterr().out
    worse = write_results(run({"x": "error"}, 20.0, 0.1), tmp_path / "worse.json")
    assert main(["compare", str(b), str(worse)]) == 1
    assert main(["compare", str(a), str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--threshold", "-1"]) == 2
