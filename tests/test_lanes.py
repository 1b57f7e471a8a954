"""tests/lanes.py: a run split in lanes never starts one server in two lanes, and each process computes the same split."""
from __future__ import annotations

import pytest

from lanes import assign, lane_limits, parse_lane, server_groups

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
    lanes = assign(TESTS, 3)
    where: dict[str, set[int]] = {}
    for test, _, servers in TESTS:
        for name in servers:
            where.setdefault(name, set()).add(lanes[test])
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
