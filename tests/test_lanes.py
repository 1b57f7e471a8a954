"""tests/lanes.py: a run split in lanes never starts one server in two lanes, and each process computes the same split."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lanes import UNKNOWN_START_S, UNKNOWN_TEST_S, Weights, assign, lane_limits, parse_lane, read_weights, server_groups
from processes import alive

TESTS = [
    ("m1::a", "m1", []), ("m1::b", "m1", ["smol"]), ("m1::c", "m1", ["small-pool", "smol"]),
    ("m2::a", "m2", ["gemma"]), ("m2::b", "m2", []),
    ("m3::a", "m3", ["oracle-rope-theta"]), ("m3::b", "m3", ["hybrid"]), ("m3::c", "m3", ["hybrid", "smol"]),
    ("m4::a", "m4", []), ("m5::a", "m5", []), ("m6::a", "m6", ["too-long"]),
]


def test_servers_needed_together_are_one_group() -> None:
    assert server_groups([s for _, _, s in TESTS]) == [
        ["smol", "small-pool", "hybrid"], ["gemma"], ["oracle-rope-theta"], ["too-long"]]


def test_every_server_is_in_exactly_one_lane() -> None:
    where = _where(assign(TESTS, 3))
    assert all(len(found) == 1 for found in where.values()), where
    assert where["smol"] == where["hybrid"] == where["small-pool"] == {1}  # the session's group: the first lane
    assert [where[n] for n in ("gemma", "oracle-rope-theta", "too-long")] == [{2}, {3}, {2}]  # round-robin


def test_a_test_without_a_server_follows_its_module_and_serverless_modules_skip_the_first_lane() -> None:
    lanes = assign(TESTS, 2)
    assert lanes["m1::a"] == 1 and lanes["m2::b"] == 2  # their modules' first server test's lane
    assert lanes["m4::a"] == lanes["m5::a"] == 2
    assert lanes["m3::a"] == 2 and lanes["m3::b"] == 1  # a module's server tests go where their servers are


def test_one_lane_is_everything_and_the_split_is_the_same_every_time() -> None:
    assert set(assign(TESTS, 1).values()) == {1}
    assert assign(TESTS, 2) == assign(list(TESTS), 2)
    assert sorted(assign(TESTS, 2)) == sorted(t for t, _, _ in TESTS)


def test_each_lane_binds_to_its_own_core_and_holds_fewer_servers() -> None:
    assert lane_limits(1, 2, [0, 1]) == (3, [0])
    assert lane_limits(2, 2, [0, 1]) == (1, [1])
    assert lane_limits(3, 3, [0, 1]) == (1, [0])
    assert lane_limits(1, 1, [0, 1]) == (4, [0, 1])


@pytest.mark.parametrize("text", ["2", "0/2", "3/2", "a/b", "1/2/3"])
def test_a_bad_lane_names_the_option(text: str) -> None:
    with pytest.raises(ValueError, match=r"--lane"):
        parse_lane(text)


def test_weights_balance_the_lanes_and_keep_every_server_in_one_lane() -> None:
    weights = Weights(tests={"m1::b": 100, "m1::c": 100, "m2::a": 60, "m3::a": 50, "m3::b": 40, "m3::c": 40,
                             "m6::a": 30, "m1::a": 1, "m2::b": 80, "m4::a": 90, "m5::a": 2},
                      starts={"smol": 20, "small-pool": 20, "hybrid": 20, "gemma": 20, "oracle-rope-theta": 20,
                              "too-long": 20})
    lanes = assign(TESTS, 2, weights)
    assert {lanes[t] for t in ("m1::b", "m1::c", "m3::b", "m3::c")} == {1}  # the session's group stays in lane 1
    # Lane 1 starts with the session's group (340 s); the other units go, heaviest first, to the lighter lane.
    load = {1: 0.0, 2: 0.0}
    for test, _, servers in TESTS:
        load[lanes[test]] += weights.test(test)
    starts = {1: 0.0, 2: 0.0}
    for name, lane in _server_lanes(lanes).items():
        starts[lane] += weights.start(name)
    total = {k: load[k] + starts[k] for k in load}
    assert abs(total[1] - total[2]) <= max(weights.tests.values()) + max(weights.starts.values())
    assert all(len(found) == 1 for found in _where(lanes).values())


def test_a_module_s_serverless_tests_may_leave_its_server_tests_lane_but_stay_together() -> None:
    tests = [("a::s1", "a", ["smol"]), ("a::x", "a", []), ("a::y", "a", []), ("b::g", "b", ["gemma"])]
    weights = Weights(tests={"a::s1": 300, "a::x": 50, "a::y": 50, "b::g": 10}, starts={"smol": 30, "gemma": 30})
    lanes = assign(tests, 2, weights)
    assert lanes["a::s1"] == 1 and lanes["a::x"] == lanes["a::y"] == 2 and lanes["b::g"] == 2


def test_unmeasured_tests_and_servers_get_a_default_weight_and_the_split_is_stable() -> None:
    weights = Weights()
    assert weights.test("new::t") == UNKNOWN_TEST_S and weights.start("new-server") == UNKNOWN_START_S
    assert assign(TESTS, 3, weights) == assign(list(TESTS), 3, weights)
    assert sorted(assign(TESTS, 3, weights)) == sorted(t for t, _, _ in TESTS)


def test_the_weights_file_is_read_and_a_broken_one_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "w.json"
    good.write_text(json.dumps({"measured": "here", "tests": {"a::b": 3}, "starts": {"smol": 40}}))
    read = read_weights(good)
    assert read is not None and read.test("a::b") == 3 and read.start("smol") == 40 and read.measured == "here"
    assert read_weights(tmp_path / "absent.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"tests": 3}')
    with pytest.raises(ValueError, match=r"bad\.json: not a lane weights file"):
        read_weights(bad)


def test_the_committed_weights_are_readable_and_name_only_tests_that_exist() -> None:
    weights = read_weights()
    assert weights is not None and weights.measured
    test_files = {test.split("::", 1)[0] for test in weights.tests}
    root = Path(__file__).resolve().parent.parent
    assert all((root / name).is_file() for name in test_files), sorted(n for n in test_files if not (root / n).is_file())


def _where(lanes: dict[str, int]) -> dict[str, set[int]]:
    where: dict[str, set[int]] = {}
    for test, _, servers in TESTS:
        for name in servers:
            where.setdefault(name, set()).add(lanes[test])
    return where


def _server_lanes(lanes: dict[str, int]) -> dict[str, int]:
    return {name: next(iter(found)) for name, found in _where(lanes).items()}


STUB_PYTHON = """#!/usr/bin/env bash
# Stands in for `python -m pytest ...`: says which run it is and exits as the test asks, or (STUB_PIDS set) writes
# its pid there and sleeps, for a test to stop it.
args="$*"
if [ -n "${STUB_PIDS:-}" ]; then echo "$$" >>"$STUB_PIDS"; exec sleep 120; fi
case "$args" in
  *--lane*) lane="${args##*--lane }"; echo "lane ${lane%%/*} ran"; exit "${LANE_EXIT:-0}" ;;
  *) sleep 0.5; echo "unit ran"; exit "${UNIT_EXIT:-0}" ;;
esac
"""


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _stub_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """The environment with the stand-in python first on PATH."""
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **env}


def _test_all(tmp_path: Path, lanes: str, **exits: str) -> subprocess.CompletedProcess[str]:
    """scripts/test-all.sh LANES with the stand-in python, exiting as `exits` say."""
    return subprocess.run(["bash", str(SCRIPTS / "test-all.sh"), lanes], capture_output=True, text=True,
                          env=_stub_env(tmp_path, **exits), timeout=60)


@pytest.mark.parametrize(("unit", "lanes", "status"), [(0, 0, 0), (1, 0, 1), (0, 3, 3), (2, 3, 2)])
def test_make_tests_script_runs_both_prints_the_unit_run_first_and_exits_with_the_first_failure(
        tmp_path: Path, unit: int, lanes: int, status: int) -> None:
    """scripts/test-all.sh (what `make test` runs): the unit run and the lanes at once, each one's output whole."""
    done = _test_all(tmp_path, "2", UNIT_EXIT=str(unit), LANE_EXIT=str(lanes))
    lines = [line for line in done.stdout.splitlines() if "ran" in line]
    assert lines[0] == "unit ran" and "lane 1 ran" in lines and "lane 2 ran" in lines, done.stdout
    assert done.returncode == status, (done.stdout, done.stderr)


def test_zero_lanes_is_the_unit_run_alone(tmp_path: Path) -> None:
    """`make unit` is scripts/test-all.sh 0: the same unit run as `make test`'s, and no lane."""
    done = _test_all(tmp_path, "0", UNIT_EXIT="4")
    assert [line for line in done.stdout.splitlines() if "ran" in line] == ["unit ran"] and done.returncode == 4


@pytest.mark.parametrize(("script", "runs"), [("test-all.sh", 3), ("test-lanes.sh", 2)])
def test_sigterm_stops_every_run_at_once(tmp_path: Path, script: str, runs: int) -> None:
    """A CI runner's timeout sends SIGTERM: the script stops its unit run and every lane then, not after its
    foreground run would have ended (bash defers a trap until its foreground command returns)."""
    pids = tmp_path / "pids"
    proc = subprocess.Popen(["bash", str(SCRIPTS / script), "2"], env=_stub_env(tmp_path, STUB_PIDS=str(pids)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(pids.read_text().split() if pids.exists() else []) < runs:
            assert time.monotonic() < deadline and proc.poll() is None, "the runs did not start"
            time.sleep(0.05)
        time.sleep(0.2)  # the script is waiting now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 130  # the runs sleep for 120 s: only the trap ends them this soon
        started = [int(pid) for pid in pids.read_text().split()]
        assert len(started) == runs and not [pid for pid in started if alive(pid)], started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in pids.read_text().split() if pids.exists() else []:
            if alive(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
