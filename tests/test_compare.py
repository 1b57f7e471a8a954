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


# -- more than two runs: a trend -------------------------------------------------------------------------------


def bench_run(aggregate: float, ttft_p99: float, started: str = "", statuses: dict[str, str] | None = None) -> RunResults:
    return RunResults(
        recipe="r", model="m", hardware=Hardware(kind="cpu", description="a cpu"), started_at=started,
        checks=[CheckResult(name=n, label=n, status=s, result=s) for n, s in (statuses or {}).items()],  # type: ignore[arg-type]
        performance=[Figure(name="n-streams", label="8 streams", result="x",
                            metrics={"aggregate_tokens_per_s": aggregate, "ttft_ms_p99": ttft_p99, "streams": 8, "wall_s": 3.0})],
    )


def test_a_trend_marks_the_regression_and_not_the_improvement() -> None:
    runs = [bench_run(300.0, 100.0), bench_run(330.0, 90.0), bench_run(280.0, 120.0)]
    trend = compare.trend_runs(runs, ["one", "two", "three"], threshold=0.05)
    series = {s.metric: s for s in trend.series}
    assert set(series) == {"aggregate_tokens_per_s", "ttft_ms_p99"}  # headline metrics only: no streams, no wall_s
    rate = series["aggregate_tokens_per_s"].points
    assert [p.regression for p in rate] == [False, False, True]  # +10 % is an improvement; -15 % against "two" is not
    assert rate[2].against == "two" and rate[2].change == pytest.approx(280 / 330 - 1)
    assert [p.regression for p in series["ttft_ms_p99"].points] == [False, False, True]  # slower is worse for a time
    assert not trend.ok and len(trend.latest_regressions) == 2
    text = compare.format_trend(trend)
    assert "n-streams aggregate_tokens_per_s: 300 -> 330 (+10.0%) -> 280 (-15.2%) REGRESSION" in text


def test_a_trend_against_the_first_run_and_an_earlier_regression_that_recovered() -> None:
    runs = [bench_run(300.0, 100.0), bench_run(250.0, 100.0), bench_run(290.0, 100.0)]
    previous = compare.trend_runs(runs, ["a", "b", "c"], threshold=0.05)
    rate = next(s for s in previous.series if s.metric == "aggregate_tokens_per_s").points
    assert [p.regression for p in rate] == [False, True, False]  # c recovered (+16 % on b)
    assert previous.ok  # the last run is not a regression: the CLI exits 0
    first = compare.trend_runs(runs, ["a", "b", "c"], threshold=0.05, baseline="first")
    rate = next(s for s in first.series if s.metric == "aggregate_tokens_per_s").points
    assert [p.regression for p in rate] == [False, True, False] and rate[2].against == "a"  # -3.3 %: inside 5 %
    strict = compare.trend_runs(runs, ["a", "b", "c"], threshold=0.02, baseline="first")
    assert not strict.ok  # -3.3 % against the first run is beyond 2 %


def test_a_trend_names_each_runs_client_load() -> None:
    busy = bench_run(200.0, 100.0)
    busy.performance[0].details["client_load_average"] = 18.5
    trend = compare.trend_runs([bench_run(300.0, 100.0), busy, bench_run(300.0, 100.0)], ["a", "b", "c"])
    assert trend.client_load == [None, 18.5, None]
    assert "2. b on a cpu (measured), client load up to 18.5" in compare.format_trend(trend)


def test_a_trend_by_date_and_a_missing_figure() -> None:
    runs = [bench_run(280.0, 100.0, "2026-12-03T10:00:00Z"), bench_run(300.0, 100.0, "2026-12-01T10:00:00Z"),
            RunResults(recipe="r", model="m", hardware=Hardware(kind="cpu", description="a cpu"), started_at="2026-12-02T10:00:00Z")]
    trend = compare.trend_runs(runs, ["late", "early", "empty"], threshold=0.05, order="date")
    assert trend.runs == ["early", "empty", "late"]
    rate = next(s for s in trend.series if s.metric == "aggregate_tokens_per_s").points
    assert [p.value for p in rate] == [300.0, None, 280.0] and rate[2].against == "early" and rate[2].regression


def test_a_trend_counts_a_newly_failing_check_and_a_broken_number() -> None:
    runs = [bench_run(300.0, 100.0, statuses={"known-answer": "pass"}), bench_run(300.0, 100.0, statuses={"known-answer": "pass"}),
            bench_run(float("nan"), 100.0, statuses={"known-answer": "fail"})]
    trend = compare.trend_runs(runs, ["a", "b", "c"])
    assert [c.name for c in trend.checks[-1].newly_failing] == ["known-answer"] and not trend.ok
    assert [p.run for _, p in trend.regressions] == ["c"]
    assert "c: check known-answer: pass -> fail  WORSE" in compare.format_trend(trend)


def test_cli_trend_over_three_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folders = []
    for name, rate in (("r1", 300.0), ("r2", 310.0), ("r3", 250.0)):
        write_results(bench_run(rate, 100.0), tmp_path / name / "results.json")
        folders.append(str(tmp_path / name))
    assert main(["compare", *folders, "--out", str(tmp_path / "trend")]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "figure:" in out
    assert (tmp_path / "trend" / "trend.png").read_bytes()[:4] == b"\x89PNG"
    assert '"regression": true' in (tmp_path / "trend" / "trend.json").read_text()
    assert main(["compare", *folders[:2], str(tmp_path / "r2"), "--threshold", "50"]) == 0  # nothing beyond 50 %
    assert main(["compare", *folders[:2]]) == 0 and "A: " in capsys.readouterr().out  # two folders: the comparison
