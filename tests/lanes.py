"""Lanes: one pytest selection split into N processes that run at once (`pytest --lane K/N`, scripts/test-lanes.sh).

A server belongs to exactly one lane, so no two processes ever start the same server or send requests to one server
at once (the probes read server-wide counters). Servers that some test needs together form one group (union-find
over each test's servers); lane 1 takes the group holding the session's servers (SmolLM2 and the hybrid), and the
other groups go round-robin to the other lanes, in the order they are first used. A test with no registry server
goes to the lane of its module's first test that has one (its module's fixtures then set up in one lane), and a
module with no server test at all to the lanes after the first, round-robin by module: the first lane already has
the longest share. Every process collects the same tests, so each computes the same split.

Each lane binds its servers' workers to its own core and holds fewer servers at once (`lane_limits`), since the
lanes share the machine's cores and memory.
"""
from __future__ import annotations

from collections.abc import Sequence

SESSION_GROUP = ("smol", "hybrid")
FIRST_LANE_ALIVE = 3  # the session's two servers and one module's own
OTHER_LANE_ALIVE = 1


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


def assign(tests: Sequence[tuple[str, str, Sequence[str]]], lanes: int) -> dict[str, int]:
    """Each test id -> its lane, 1-based. `tests` are (test id, module, servers it needs), in run order."""
    if lanes == 1:
        return {test: 1 for test, _, _ in tests}
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


def lane_limits(lane: int, lanes: int, cores: Sequence[int]) -> tuple[int, list[int]]:
    """(servers up at once, the cores its servers bind to) for one lane of `lanes`."""
    alive = FIRST_LANE_ALIVE if lane == 1 else OTHER_LANE_ALIVE
    if lanes == 1 or not cores:
        return 4, list(cores)
    return alive, [sorted(cores)[(lane - 1) % len(cores)]]

