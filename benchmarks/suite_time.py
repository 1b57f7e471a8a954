"""Where the test suite's time goes: one full run (or any pytest selection), timed per test and per server.

    scripts/in-env.sh python benchmarks/suite_time.py                  # the whole suite, as `make test` runs it (lanes)
    scripts/in-env.sh python benchmarks/suite_time.py -- -m "not integration"
    scripts/in-env.sh python benchmarks/suite_time.py --from times.jsonl   # print the table of an earlier run
    scripts/in-env.sh python benchmarks/suite_time.py --from times.jsonl --weights tests/lane_weights.json \
        --measured "2026-12-06, make test, 2-vCPU Xeon with AMX, warm cache"

The run writes COOKBOOK_TEST_TIMES (tests/conftest.py: one JSON line per test phase; tests/servers.py: one per
server, with when it was asked for, when it answered /health, when it stopped, and how long tests waited for it)
and prints: the wall time and machine load, the split (unit, shared-server, own-server, browser, notebooks), every
server's start-up and life, and the slowest tests. `--weights FILE` also writes each server test's seconds and each
server's start-up as the lanes' weights (tests/lanes.py balances `make test`'s lanes with them); take them from a run
on a warm cache, so that no one-off build weighs in."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SESSION_SERVERS = {"smol", "hybrid"}
NOTEBOOK_MODULES = {"tests/test_notebooks.py", "tests/test_batch.py", "tests/test_fleet.py"}
BROWSER_MODULES = {"tests/test_browser.py"}


def category(test: dict[str, Any]) -> str:
    module = test["test"].split("::", 1)[0]
    if module in BROWSER_MODULES:
        return "browser"
    if test.get("sim_image"):
        return "sim-image"
    if not test["integration"]:
        return "unit"
    if module in NOTEBOOK_MODULES:
        return "notebooks"
    if set(test["servers"]) - SESSION_SERVERS:
        return "own-server"
    return "shared-server"


def read(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    tests: dict[str, dict[str, Any]] = {}
    servers: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "server" in record:
            servers.append(record)
            continue
        test = tests.setdefault(record["test"], {"test": record["test"], "integration": record["integration"],
                                                 "sim_image": record.get("sim_image", False),
                                                 "servers": record["servers"], "total": 0.0, "outcome": "passed",
                                                 "server_cpu": {}})
        test["total"] += record["duration"]
        for name, spent in (record.get("server_cpu_s") or {}).items():
            test["server_cpu"][name] = test["server_cpu"].get(name, 0.0) + spent
        test[record["phase"]] = record["duration"]
        if record["outcome"] != "passed":
            test["outcome"] = record["outcome"]
    return tests, servers


def table(path: Path, wall_s: float | None = None, load: str = "") -> str:
    tests, servers = read(path)
    lines: list[str] = []
    if wall_s is not None:
        lines.append(f"wall time {wall_s / 60:.1f} min ({wall_s:.0f} s); load average before/after: {load}")
    split: dict[str, list[float]] = defaultdict(list)
    for test in tests.values():
        split[category(test)].append(test["total"])
    total = sum(sum(v) for v in split.values())
    lines += ["", f"{'part':<14} {'tests':>6} {'time (s)':>9} {'share':>6}"]
    for name in ("unit", "shared-server", "own-server", "sim-image", "browser", "notebooks"):
        times = split.get(name, [])
        lines.append(f"{name:<14} {len(times):>6} {sum(times):>9.0f} {sum(times) / total:>6.0%}" if total else name)
    lines.append(f"{'all':<14} {len(tests):>6} {total:>9.0f}  (tests' own time: server start-ups in the background "
                 "are not in it unless a test waited)")
    if servers:
        lines += ["", f"{'server':<22} {'start-up (s)':>12} {'life (s)':>9} {'waited (s)':>10}  how"]
        first = min(s.get("requested", time.time()) for s in servers)
        for s in sorted(servers, key=lambda s: s.get("requested", 0)):
            start = s.get("ready", s.get("requested", 0)) - s.get("requested", 0) if "ready" in s else float("nan")
            life = s["stopped"] - s["ready"] if "stopped" in s and "ready" in s else float("nan")
            how = "ahead, in the background" if s.get("background") else "when a test asked"
            how += f"; asked at +{s.get('requested', first) - first:.0f} s"
            if "failed" in s:
                how += f"; FAILED: {s['failed'][:80]}"
            lines.append(f"{s['server']:<22} {start:>12.1f} {life:>9.0f} {s.get('waited_s', 0.0):>10.1f}  {how}")
    slow = sorted(tests.values(), key=lambda t: -t["total"])[:20]
    lines += ["", "slowest tests (setup + call + teardown, s):"]
    for test in slow:
        parts = "/".join(f"{test.get(p, 0):.0f}" for p in ("setup", "call", "teardown"))
        lines.append(f"  {test['total']:>6.1f}  ({parts})  {test['test'][:110]}")
    lines += server_cpu_lines(tests)
    failed = [t["test"] for t in tests.values() if t["outcome"] == "failed"]
    if failed:
        lines += ["", f"{len(failed)} failed: " + ", ".join(failed[:10])]
    return "\n".join(lines)


def server_cpu_lines(tests: dict[str, dict[str, Any]], top: int = 20) -> list[str]:
    """Each server's CPU-seconds over the run, and the tests that kept the servers busiest (the time log's
    server_cpu_s: on a saturated machine, wall time falls only where this work does)."""
    by_server: dict[str, float] = defaultdict(float)
    for test in tests.values():
        for name, spent in test["server_cpu"].items():
            by_server[name] += spent
    if not by_server:
        return []
    lines = ["", f"{'server':<22} {'CPU-s during tests':>18}"]
    lines += [f"{name:<22} {spent:>18.0f}" for name, spent in sorted(by_server.items(), key=lambda kv: -kv[1])]
    busiest = sorted(tests.values(), key=lambda t: -sum(t["server_cpu"].values()))[:top]
    lines += ["", "tests that kept servers busiest (server CPU-s, by server):"]
    for test in busiest:
        spent = ", ".join(f"{name} {cpu:.0f}" for name, cpu in sorted(test["server_cpu"].items(), key=lambda kv: -kv[1]))
        lines.append(f"  {sum(test['server_cpu'].values()):>6.1f}  {test['test'][:90]}  ({spent})")
    return lines


def lane_weights(path: Path, measured: str) -> dict[str, Any]:
    """The lanes' weights from a time log: each server-run test's seconds (setup + call + teardown) and each
    server's start-up (asked for to /health), rounded; the unit run's tests are not in the lanes and are left out."""
    tests, servers = read(path)
    starts = {s["server"]: round(s["ready"] - s["requested"], 1) for s in servers if "ready" in s and "requested" in s}
    lane_tests = {t["test"]: round(t["total"], 1) for t in tests.values() if t["integration"] or t["sim_image"]}
    return {"measured": measured, "starts": dict(sorted(starts.items())), "tests": dict(sorted(lane_tests.items()))}


# What `make test` runs (the Makefile): the unit run and the server tests' two lanes, at once.
MAKE_TEST = [str(REPO / "scripts" / "test-all.sh"), "2"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="print the table of an earlier run's times file")
    parser.add_argument("--times", type=Path, help="where to write this run's times (default a temporary file)")
    parser.add_argument("--weights", type=Path, help="also write the lanes' weights (tests/lane_weights.json) from the run")
    parser.add_argument("--measured", default="", help="with --weights (and needed by it): what the weights were measured "
                        "on, e.g. '2026-12-06, make test, 2-vCPU Xeon, warm cache'")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the whole suite, as `make test` runs it)")
    args = parser.parse_args()
    if args.weights and not args.measured:
        parser.error("--weights: give --measured too (the date and machine the weights come from)")
    if args.source:
        if not args.source.is_file():
            parser.error(f"--from: {args.source}: no such file")
        print(table(args.source))
        if args.weights:
            write_weights(args.weights, lane_weights(args.source, args.measured))
        return 0
    times = args.times or Path(tempfile.mkstemp(prefix="suite-times-", suffix=".jsonl")[1])
    times.write_text("")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.monotonic()
    env = {**os.environ, "COOKBOOK_TEST_TIMES": str(times)}
    command = [sys.executable, "-m", "pytest", "-q", *args.pytest_args] if args.pytest_args else MAKE_TEST
    code = subprocess.call(command, cwd=REPO, env=env)
    wall = time.monotonic() - started
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(table(times, wall, f"{load_before} / {load_after}"))
    print(f"\ntimes: {times}")
    if args.weights:
        write_weights(args.weights, lane_weights(times, args.measured))
    return code


def write_weights(path: Path, weights: dict[str, Any]) -> None:
    path.write_text(json.dumps(weights, indent=1) + "\n")
    print(f"lane weights: {len(weights['tests'])} tests, {len(weights['starts'])} servers -> {path}")


if __name__ == "__main__":
    sys.exit(main())
