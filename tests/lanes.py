"""Lanes: one pytest selection split into N processes that run at once (`pytest --lane K/N`, scripts/test-lanes.sh).

A server belongs to exactly one lane, so no two processes ever start the same server or send requests to one server
at once (the probes read server-wide counters). Servers that some test needs together form one group (union-find
over each test's servers); lane 1 takes the group holding the session's servers (SmolLM2 and the hybrid), and the
other groups go round-robin to the other lanes, in the order they are first used. A test with no registry server
goes to the lane of its module's first test that has one (its module's fixtures then set up in one lane), and a
module with no server test at all to the lanes after the first, round-robin by module: the first lane already has
the longest share. Every process collects the same tests, so each computes the same split.

With measured weights (`tests/lane_weights.json`, written by `benchmarks/suite_time.py --weights` from a run's time
log), the split balances the lanes' work instead: the session's group stays in lane 1, and every other unit (a server
group with its servers' start-ups, or one module's tests that need no registry server, the simulated image's
reproducers counting as one module since they share one fork server) goes, heaviest first, to the lane with the least
work so far. The lanes share the machine's cores, so a lane that ends early leaves work undone only if the longest
one cannot use the freed core.

Each lane binds the workers of its servers that run vLLM's own layout to its own core (the others run their engine
in one process, which vLLM does not bind: tests/servers.py) and holds fewer servers at once (`lane_limits`), since
the lanes share the machine's cores and memory.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SESSION_GROUP = ("smol", "hybrid")
FIRST_LANE_ALIVE = 3  # the session's two servers and one module's own
OTHER_LANE_ALIVE = 1
WEIGHTS_FILE = Path(__file__).resolve().parent / "lane_weights.json"
UNKNOWN_TEST_S = 5.0  # a test the weights have not measured yet (most server tests take a few seconds)
UNKNOWN_START_S = 45.0  # a server whose start-up they have not measured (a SmolLM2 start beside the other lane)


@dataclass(frozen=True)
class Weights:
    """Measured seconds per test id and per server start-up, from one run's time log."""

    tests: Mapping[str, float] = field(default_factory=dict)
    starts: Mapping[str, float] = field(default_factory=dict)
    measured: str = ""

    def test(self, test_id: str) -> float:
        return self.tests.get(test_id, UNKNOWN_TEST_S)

    def start(self, server: str) -> float:
        return self.starts.get(server, UNKNOWN_START_S)


def read_weights(path: Path = WEIGHTS_FILE) -> Weights | None:
    """The committed weights, or None where there are none (the split is then the unweighted one)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return Weights({k: float(v) for k, v in data["tests"].items()},
                       {k: float(v) for k, v in data["starts"].items()}, str(data.get("measured", "")))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a lane weights file ({exc})") from None


def parse_lane(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N), 1 <= K <= N; ValueError naming the option otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--lane {text!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise ValueError(f"--lane {text!r}: K must be between 1 and N")
    return k, n


def server_groups(needs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Servers needed together by some test, merged; each group in first-use order, the groups too."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    order: list[str] = []
    for names in needs:
        for name in names:
            if name not in parent:
                parent[name] = name
                order.append(name)
        for other in names[1:]:
            a, b = root(names[0]), root(other)
            if a != b:
                parent[b] = a
    groups: dict[str, list[str]] = {}
    for name in order:
        groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def assign(tests: Sequence[tuple[str, str, Sequence[str]]], lanes: int, weights: Weights | None = None) -> dict[str, int]:
    """Each test id -> its lane, 1-based. `tests` are (test id, module, servers it needs), in run order."""
    if lanes == 1:
        return {test: 1 for test, _, _ in tests}
    if weights is not None:
        return _balanced(tests, lanes, weights)
    groups = server_groups([servers for _, _, servers in tests])
    lane_of_server: dict[str, int] = {}
    others = 0
    for group in groups:
        if any(name in SESSION_GROUP for name in group):
            lane = 1
        else:
            lane = 2 + others % (lanes - 1)
            others += 1
        for name in group:
            lane_of_server[name] = lane
    module_lane: dict[str, int] = {}
    for _, module, servers in tests:
        if servers and module not in module_lane:
            module_lane[module] = lane_of_server[servers[0]]
    serverless_modules = 0
    out: dict[str, int] = {}
    for test, module, servers in tests:
        if servers:
            out[test] = lane_of_server[servers[0]]
            continue
        if module not in module_lane:
            module_lane[module] = 2 + serverless_modules % (lanes - 1)
            serverless_modules += 1
        out[test] = module_lane[module]
    return out


def _balanced(tests: Sequence[tuple[str, str, Sequence[str]]], lanes: int, weights: Weights) -> dict[str, int]:
    """The weighted split: the session's group in lane 1, then each unit, heaviest first, to the least loaded lane."""
    groups = server_groups([servers for _, _, servers in tests])
    group_of = {name: i for i, group in enumerate(groups) for name in group}
    units: dict[str, list[str]] = {}  # unit key -> its test ids, in run order
    for test, module, servers in tests:
        key = f"servers:{group_of[servers[0]]}" if servers else f"module:{module}"
        units.setdefault(key, []).append(test)
    work = {key: sum(weights.test(t) for t in members) for key, members in units.items()}
    for i, group in enumerate(groups):
        if f"servers:{i}" in work:
            work[f"servers:{i}"] += sum(weights.start(name) for name in group)
    load = [0.0] * (lanes + 1)  # index 0 unused
    lane_of: dict[str, int] = {}
    for i, group in enumerate(groups):
        if any(name in SESSION_GROUP for name in group) and f"servers:{i}" in work:
            lane_of[f"servers:{i}"] = 1
            load[1] += work[f"servers:{i}"]
    first_seen = {key: n for n, key in enumerate(units)}
    for key in sorted((k for k in units if k not in lane_of), key=lambda k: (-work[k], first_seen[k])):
        lane = min(range(1, lanes + 1), key=lambda k: (load[k], k))
        lane_of[key] = lane
        load[lane] += work[key]
    return {test: lane_of[key] for key, members in units.items() for test in members}


def lane_limits(lane: int, lanes: int, cores: Sequence[int]) -> tuple[int, list[int]]:
    """(servers up at once, the cores its servers bind to) for one lane of `lanes`."""
    alive = FIRST_LANE_ALIVE if lane == 1 else OTHER_LANE_ALIVE
    if lanes == 1 or not cores:
        return 4, list(cores)
    return alive, [sorted(cores)[(lane - 1) % len(cores)]]

