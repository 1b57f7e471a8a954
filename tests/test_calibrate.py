"""`cookbook calibrate`: tolerances from clean runs. Unit tests build RunResults by hand; the integration test runs
one cheap check twice against the session's SmolLM2 server, into a copy of the recipe folder (never recipes/)."""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

import cookbook.pages as pages
from cookbook.calibrate import (allowed_for, calibrate, calibration_from, calibration_yaml, margin_words,
                                rounding_step, saw_failures, write_calibration)
from cookbook.checks.kit.tolerances import FAULT_FLOOR, RUN_DRIFT, tolerances
from cookbook.cli import main
from cookbook.endpoint import Endpoint
from cookbook.errors import EXIT_USAGE, UsageError
from cookbook.recipes import CALIBRATION_FILE, Calibration, Recipe, load_recipe
from cookbook.results import CheckResult, Hardware, RunResults

ROOT = Path(__file__).resolve().parent.parent
CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture
def recipe_copy(tmp_path: Path) -> Path:
    """The SmolLM2 recipe folder copied to tmp_path (without any calibration.yaml it may have)."""
    folder = tmp_path / "SmolLM2-135M-Instruct"
    shutil.copytree(ROOT / "recipes" / CPU, folder)
    (folder / CALIBRATION_FILE).unlink(missing_ok=True)
    return folder


def _run(*checks: tuple[str, str, dict[str, Any]]) -> RunResults:
    return RunResults(
        recipe=CPU, model="m", hardware=Hardware(kind="cpu", description="test"),
        checks=[CheckResult(name=n, label=n, status=status, result=f"{n} {status}", details={"noise": noise})
                for n, status, noise in checks],
    )


# -- the margin ----------------------------------------------------------------------------------------------------


def test_the_margin_is_a_factor_and_at_least_one_rounding_step() -> None:
    assert rounding_step("bf16") == 0.125 and rounding_step("bfloat16") == 0.125
    assert rounding_step("fp16") == pytest.approx(16 * 2**-10)
    assert allowed_for(RUN_DRIFT, 0.08, 1.5, "bf16") == pytest.approx(0.205)  # 0.08 + 0.125 beats 0.12
    assert allowed_for(RUN_DRIFT, 1.0, 1.5, "bf16") == pytest.approx(1.5)  # x1.5 beats + 0.125
    assert allowed_for("reference.mean_abs_delta", 0.02, 1.5, "bf16") == pytest.approx(0.03)  # a mean: x1.5 only
    assert allowed_for("reference.max_topk_divergence", 0.04, 2.0, "bf16") == pytest.approx(0.08)
    assert allowed_for("reference.mean_abs_delta", 0.0, 1.5, "bf16") > 0  # a tolerance is never 0
    for measured in (0.0123456, 0.3333333, 7.77777):  # rounded up, never below what was measured with its margin
        assert allowed_for(RUN_DRIFT, measured, 1.5, "fp32") >= measured * 1.5
    assert "1.5 x measured" in margin_words(1.5, "bf16") and "0.125" in margin_words(1.5, "bf16")


# -- aggregation ---------------------------------------------------------------------------------------------------


def test_the_largest_clean_value_over_checks_and_runs_is_measured(recipe_copy: Path) -> None:
    recipe = load_recipe(recipe_copy)
    runs = [
        _run(("batch-composition", "pass", {RUN_DRIFT: 0.05, "runs.tie_margin": None}),
             ("same-step", "pass", {RUN_DRIFT: 0.09, "reference.tie_margin": 0.3}),
             ("needles", "pass", {"needles.model_misses": ["4000@0.5"]})),
        _run(("batch-composition", "pass", {RUN_DRIFT: 0.07}),
             ("oracle", "pass", {"reference.max_abs_delta": 0.4, "reference.mean_abs_delta": 0.02}),
             ("needles", "pass", {"needles.model_misses": ["4000@0.5", "8000@0.1"]})),
    ]
    c = calibration_from(runs, recipe, 1.5, when="2026-01-01T00:00:00Z", on="test box")
    assert c.runs == 2 and c.when == "2026-01-01T00:00:00Z" and c.on == "test box"
    assert c.values[RUN_DRIFT].measured == pytest.approx(0.09) and c.values[RUN_DRIFT].runs_seen == 2
    assert c.values[RUN_DRIFT].allowed == pytest.approx(0.215)
    assert c.values["reference.tie_margin"].runs_seen == 1
    assert c.values["reference.mean_abs_delta"].allowed == pytest.approx(0.03)
    assert "runs.tie_margin" not in c.values  # no run measured it: the checks fall back to the recipe/default
    assert "prefix_cache.max_logprob_diff" not in c.values
    assert c.model_misses == ["4000@0.5", "8000@0.1"]
    assert any("8000@0.1 missed in 1 of 2 runs" in n for n in c.notes)
    assert not saw_failures(c)


def test_failures_on_the_clean_server_and_bad_noise_are_noted(recipe_copy: Path) -> None:
    recipe = load_recipe(recipe_copy)
    runs = [_run(("batch-composition", "pass", {RUN_DRIFT: 0.05})),
            _run(("batch-composition", "fail", {RUN_DRIFT: 0.2, "runs.typo": 1.0, "runs.tie_margin": math.nan}))]
    runs[1].stopped = "server down during batch-composition"
    c = calibration_from(runs, recipe)
    assert saw_failures(c) and c.notes[0].startswith("checks failed on the clean server in 1 of 2 runs (run 2)")
    assert any("run 2: batch-composition fail on the clean server" in n for n in c.notes)
    assert any("'runs.typo', not a tolerance name" in n for n in c.notes)
    assert any("runs.tie_margin = nan, not a number" in n for n in c.notes)
    assert any("run 2 stopped early" in n for n in c.notes)
    assert c.values[RUN_DRIFT].measured == pytest.approx(0.2)  # the failing run's noise still counts (and is said)


def test_noise_as_large_as_the_fault_is_said(recipe_copy: Path) -> None:
    recipe = load_recipe(recipe_copy)
    c = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.9}))], recipe)
    assert c.values[RUN_DRIFT].allowed >= FAULT_FLOOR[RUN_DRIFT]
    assert any(n.startswith(f"{RUN_DRIFT}: allowed") and "as large as the fault" in n for n in c.notes)
    quiet = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.1}))], recipe)
    assert not any("as large as the fault" in n for n in quiet.notes)


# -- what the oracle publishes ------------------------------------------------------------------------------------


def test_the_oracle_publishes_its_noise() -> None:
    from cookbook.checks.oracle import _outcome, compare_prompt, margin_drift
    from cookbook.checks.kit.tolerances import REFERENCE_DEFAULTS
    from cookbook.reference import Layout, OraclePrompt, RefPosition, RefScore, Served

    ref = RefPosition(5, -1.0, {5: -1.0, 6: -2.0, 7: -3.5})
    assert margin_drift(ref, {5: -1.0, 6: -2.0, 7: -3.5}) == 0.0
    assert margin_drift(ref, {5: -1.1, 6: -1.8, 9: -3.0}) == pytest.approx(0.3)  # served margin 0.7, reference 1.0
    assert margin_drift(ref, {6: -1.8, 7: -3.0}) == 0.0  # the reference's top token not served: nothing to compare

    prompt = OraclePrompt("short", "test", [1, 5, 6])
    score = RefScore("test", [None, RefPosition(5, -1.0, {5: -1.0, 6: -2.0}), RefPosition(6, -0.5, {6: -0.5, 7: -0.9})],
                     [RefPosition(9, -0.2, {9: -0.2, 8: -2.0})])
    served = Served(tokens=[9], logprobs=[-0.25], top=[{9: -0.25, 8: -1.85}],
                    prompt_logprobs=[None, -1.2, -0.7], prompt_top=[{}, {5: -1.2, 6: -2.0}, {7: -0.6, 6: -0.7}],
                    prompt_rank1=[None, 5, 7], seconds=0.1, body={})
    tol = REFERENCE_DEFAULTS["bf16"]
    comparison = compare_prompt(prompt, served, score, tol, None)  # type: ignore[arg-type]
    noise = _outcome([comparison], tol, "t", "golden file t", Layout(128, (), 8192), [], 2).details["noise"]
    assert noise["reference.max_abs_delta"] == pytest.approx(0.2)  # position 1 and 2: 1.2 - 1.0, 0.7 - 0.5
    assert noise["reference.mean_abs_delta"] == pytest.approx((0.2 + 0.2 + 0.05) / 3)
    assert noise["reference.max_topk_divergence"] > 0
    # position 2: a top-1 near-tie (margin 0.4); its drift, served -0.1 against reference 0.4, is 0.5: the larger
    assert noise["reference.tie_margin"] == pytest.approx(0.5)


# -- writing, and reading back -------------------------------------------------------------------------------------


def test_the_written_file_round_trips_through_the_recipe_loader(recipe_copy: Path) -> None:
    recipe = load_recipe(recipe_copy)
    before = tolerances(recipe).runs_drift
    assert not before.source.startswith("calibration")
    c = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.0712, "reference.max_abs_delta": 0.33}))],
                         recipe, when="2026-01-01T00:00:00Z")
    path = write_calibration(recipe, c)
    assert path == recipe_copy / CALIBRATION_FILE
    assert [p.name for p in recipe_copy.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    again = load_recipe(recipe_copy)
    assert again.calibration is not None and again.calibration == c
    assert again.calibration.values[RUN_DRIFT].allowed == pytest.approx(0.197)
    picked = tolerances(again)
    assert picked.runs_drift.value == pytest.approx(0.197)
    assert picked.runs_drift.source.startswith("calibration (1 clean runs, 2026-01-01T00:00:00Z")
    assert picked.reference.max_abs_delta == pytest.approx(0.495) and picked.reference_from.startswith("calibration")


def test_an_error_mid_write_leaves_the_old_file(recipe_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe(recipe_copy)
    first = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.05}))], recipe)
    path = write_calibration(recipe, first)
    old = path.read_text()
    second = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.5}))], recipe)

    def interrupted(_src: object, _dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pages.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_calibration(recipe, second)
    assert path.read_text() == old
    assert sorted(p.name for p in recipe_copy.iterdir() if p.name.startswith(".")) == []
    path.unlink()
    with pytest.raises(KeyboardInterrupt):
        write_calibration(recipe, second)
    assert not path.exists()  # none before, none after: never half a file


def test_the_yaml_says_it_is_written_by_the_command(recipe_copy: Path) -> None:
    c = calibration_from([_run(("batch-composition", "pass", {RUN_DRIFT: 0.05}))], load_recipe(recipe_copy))
    text = calibration_yaml(c)
    assert text.startswith("# Written by `cookbook calibrate`")
    assert Calibration.model_validate(yaml.safe_load(text)) == c


# -- bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "flag"), [
    (["--runs", "0"], "--runs"),
    (["--margin", "0.9"], "--margin"),
    (["--margin", "nan"], "--margin"),
    (["--checks", "no-such-check"], "--checks"),
    (["--checks", "a,,b"], "--checks"),
    (["--base-url", "http://127.0.0.1:9", "--no-restart"], "--no-restart"),
    (["--base-url", "http://127.0.0.1:9", "--launch-profile", "engine-states"], "--launch-profile"),
    (["--param", "concurrency=0"], "concurrency"),
    (["--timeout", "0"], "--timeout"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], flag: str, recipe_copy: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(recipe_copy), *argv]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err
    assert not (recipe_copy / CALIBRATION_FILE).exists()


def test_an_unknown_recipe_and_a_missing_one_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "no/such-recipe"]) == EXIT_USAGE
    assert "no/such-recipe" in capsys.readouterr().err
    assert main(["calibrate"]) == EXIT_USAGE  # RECIPE is required


def test_the_library_refuses_what_it_cannot_do(recipe_copy: Path) -> None:
    recipe = load_recipe(recipe_copy)
    with pytest.raises(UsageError, match="cannot restart a server it did not start"):
        calibrate(recipe, base_url="http://127.0.0.1:9", restart=True)
    with pytest.raises(UsageError, match="--runs"):
        calibrate(recipe, base_url="http://127.0.0.1:9", runs=0)


def test_an_unreachable_server_exits_3_and_writes_nothing(recipe_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(recipe_copy), "--base-url", "http://127.0.0.1:9", "--runs", "1"]) == 3
    assert "127.0.0.1:9" in capsys.readouterr().err
    assert not (recipe_copy / CALIBRATION_FILE).exists()


class _FakeServer:
    """Stands in for launch.Server: counts starts and stops (calibrate's launched mode, no vLLM)."""

    events: list[str] = []

    def __init__(self, recipe: Recipe, **_kw: Any) -> None:
        self.base_url = f"http://fake-{len(self.events)}"

    def line(self) -> str:
        return f"ready: {self.base_url}"

    def stop(self) -> None:
        self.events.append("stop")


@pytest.mark.parametrize(("restart", "starts"), [(None, 3), (False, 1)])
def test_the_launched_server_is_fresh_per_run_and_always_stopped(
    restart: bool | None, starts: int, recipe_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cookbook.checks as checks
    import cookbook.launch as launch

    _FakeServer.events = []
    seen_urls: list[str] = []

    def started(server: _FakeServer, _say: object) -> _FakeServer:
        _FakeServer.events.append("start")
        return server

    def run_checks(ctx: Any, _names: object, progress: object = None) -> RunResults:
        seen_urls.append(ctx.endpoint.base_url)
        if len(seen_urls) == 2 and restart is False:
            raise KeyboardInterrupt  # Ctrl-C mid-calibration: the server stops, nothing is written
        return _run(("batch-composition", "pass", {RUN_DRIFT: 0.01 * len(seen_urls)}))

    monkeypatch.setattr(launch, "Server", _FakeServer)
    monkeypatch.setattr(launch, "start_or_report", started)
    monkeypatch.setattr(launch, "attach", lambda url, model: Endpoint(url, model))
    monkeypatch.setattr(checks, "run_checks", run_checks)
    recipe = load_recipe(recipe_copy)
    if restart is False:
        with pytest.raises(KeyboardInterrupt):
            calibrate(recipe, runs=3, restart=False, checks=["batch-composition"])
        assert _FakeServer.events == ["start", "stop"] and len(set(seen_urls)) == 1
        assert not (recipe_copy / CALIBRATION_FILE).exists()
        return
    c = calibrate(recipe, runs=3, restart=restart, checks=["batch-composition"])
    assert _FakeServer.events == ["start", "stop"] * starts and len(set(seen_urls)) == 3
    assert c.values[RUN_DRIFT].measured == pytest.approx(0.03) and c.values[RUN_DRIFT].runs_seen == 3
    assert not any("attached" in n for n in c.notes)
    assert load_recipe(recipe_copy).calibration == c


# -- integration: the session's server -----------------------------------------------------------------------------


@pytest.mark.integration
def test_two_clean_runs_write_plausible_values(cpu_server: Endpoint, recipe_copy: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["calibrate", str(recipe_copy), "--base-url", cpu_server.base_url, "--runs", "2",
               "--checks", "batch-composition", "--param", "batch_sizes=2,4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    recipe: Recipe = load_recipe(recipe_copy)
    assert recipe.calibration is not None and recipe.calibration.runs == 2
    drift = recipe.calibration.values[RUN_DRIFT]
    # A server whose runs agree bit for bit (fp32 on a CPU without native bf16) measures 0; the tolerance is never 0.
    assert drift.runs_seen == 2 and 0 <= drift.measured < drift.allowed and math.isfinite(drift.allowed)
    assert drift.allowed >= rounding_step("bf16")
    assert drift.allowed == pytest.approx(allowed_for(RUN_DRIFT, drift.measured, 1.5, "bf16"))
    assert "attached to a running server" in recipe.calibration.notes[0]
    assert tolerances(recipe).runs_drift.source.startswith("calibration (2 clean runs")
    assert f"| {RUN_DRIFT} | {drift.measured:g} | {drift.allowed:g} | 2/2 |" in out
