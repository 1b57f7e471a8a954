"""`cookbook verify`: bad input, the Verified table's formatting, and runs against the real CPU server."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cookbook.checks.registry import verified_table
from cookbook.cli import main
from cookbook.cli.verify import hardware_from, parse_checks
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.faultproxy import FaultProxy, KillAfter
from cookbook.launch import free_port
from cookbook.results import CheckResult, Hardware, RunResults, read_results

CPU_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _results(*checks: CheckResult, kv: int | None = 93184) -> RunResults:
    return RunResults(recipe="r", model="m", hardware=Hardware(kind="cpu", description="x"), kv_pool_tokens=kv, checks=list(checks))


def test_table_in_the_seeds_shape() -> None:
    table = verified_table(
        _results(
            CheckResult(name="a", label="Known-answer prompts", status="pass", result="8/8"),
            CheckResult(name="b", label="`top_logprobs: 20`", status="fail", result="19 entries on token 3 of 16"),
            CheckResult(name="c", label="Tool call", status="known limitation", result="0/5 valid calls (known limitation: x)"),
            CheckResult(name="d", label="Seed", status="not run", result="not run: server down"),
            CheckResult(name="e", label="Pipes", status="pass", result="a | b"),
        )
    )
    assert table.splitlines() == [
        "| Check | Result |",
        "|---|---|",
        "| Known-answer prompts | 8/8 |",
        "| `top_logprobs: 20` | fail: 19 entries on token 3 of 16 |",
        "| Tool call | 0/5 valid calls (known limitation: x) |",
        "| Seed | not run: server down |",
        "| Pipes | a \\| b |",
        "",
        "KV pool at start-up: 93,184 tokens.",
    ]
    assert "KV pool" not in verified_table(_results(kv=None))


def test_parse_checks_and_hardware() -> None:
    assert parse_checks(None) is None
    assert parse_checks("known-answer, seed") == ["known-answer", "seed"]
    with pytest.raises(CookbookError, match="--checks"):
        parse_checks("seed,,min-p")
    assert hardware_from("four Gaudi 2 cards") == Hardware(kind="gaudi2", description="four Gaudi 2 cards")
    assert hardware_from("8x Gaudi3").kind == "gaudi3"  # type: ignore[union-attr]
    assert hardware_from("some box").kind == "unknown"  # type: ignore[union-attr]
    with pytest.raises(CookbookError, match="--hardware"):
        hardware_from(" ")


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--base-url", "http://127.0.0.1:9", "--checks", "no-such-check"], "--checks"),
        (["--base-url", "http://127.0.0.1:9", "--timeout", "0"], "--timeout"),
        (["--recipe", "no/such-recipe", "--base-url", "http://127.0.0.1:9"], "no/such-recipe"),
        (["--recipe", CPU_RECIPE], "--base-url"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert err[-1].startswith("error: ") and flag in err[-1]


def test_server_down_at_the_start_still_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quick by construction: no check function is even called against a server that is down at the start."""
    from cookbook.checks.registry import CHECKS

    ran: list[str] = []
    for name, spec in list(CHECKS.items()):
        monkeypatch.setitem(CHECKS, name, dataclasses.replace(spec, fn=lambda ctx, s=spec: ran.append(s.name) or s.fn(ctx)))
    out = tmp_path / "verify.json"
    code = main(["verify", "--base-url", f"http://127.0.0.1:{free_port()}", "--recipe", CPU_RECIPE, "--json", str(out)])
    assert code == 1 and ran == []
    results = read_results(out)
    assert {c.status for c in results.checks} == {"not run"}
    assert "not run: server down" in capsys.readouterr().out


@pytest.mark.integration
def test_verify_a_few_checks(cpu_server: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "verify.json"
    code = main([
        "verify", "--base-url", cpu_server.base_url, "--recipe", CPU_RECIPE, "--checks", "known-answer,logit-bias,server-health",
        "--json", str(out), "--hardware", "2 vCPU test box",
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| Known-answer prompts (arithmetic, facts, translation), temperature 0 | 8/8 |" in printed
    assert "| `logit_bias` +100 on one token | takes effect |" in printed
    assert "KV pool at start-up: " in printed
    results = read_results(out)
    assert [c.name for c in results.checks] == ["known-answer", "logit-bias", "server-health"]
    assert results.hardware.description == "2 vCPU test box"


@pytest.mark.integration
def test_known_limitation_is_shown_measured_and_does_not_fail_the_run(cpu_server: Endpoint, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--base-url", cpu_server.base_url, "--recipe", CPU_RECIPE, "--checks", "tool-call-auto"])
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| Tool call"))
    assert "valid `get_weather` calls with the right argument" in row
    assert code == 0 and ("known limitation" in row or "5/5" in row)


@pytest.mark.integration
def test_server_dying_mid_run(cpu_server: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The proxy refuses connections after the first check's requests: the rest are 'not run: server down',
    the JSON is written and the command exits non-zero within a minute."""
    out = tmp_path / "verify.json"
    with FaultProxy(cpu_server.base_url, KillAfter(after=8)) as proxy:  # --budget: the command's own bound
        code = main(["verify", "--base-url", proxy.base_url, "--recipe", CPU_RECIPE, "--json", str(out), "--budget", "60"])
    assert code == 1
    results = read_results(out)
    assert results.checks[0].status == "pass"
    assert {c.result for c in results.checks[1:]} == {"not run: server down"}
    # ended by the refused connection, not by the budget, and no request waited out its deadline
    assert results.stopped == "server down during known-answer-concurrent", results.stopped
    assert not any(c.details.get("ran_out_of_deadline") for c in results.checks)
    assert "not run: server down" in capsys.readouterr().out


def test_params_parse_numbers_and_lists() -> None:
    from cookbook.cli.verify import parse_params

    assert parse_params(["needle_lengths=2000,4000", "needle_depths=0.5", "seed=7"]) == {
        "needle_lengths": [2000, 4000],
        "needle_depths": [0.5],
        "seed": 7,
    }
    with pytest.raises(CookbookError, match="--param: expected KEY=VALUE"):
        parse_params(["needle_lengths"])
