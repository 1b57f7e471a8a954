"""cookbook.haystack: deterministic filler and needles (unit), token-exact haystacks on the real servers."""
from __future__ import annotations

import re

import pytest

from cookbook.endpoint import Endpoint
from cookbook.haystack import (
    _sentence_boundary,
    build_haystack,
    filler_text,
    fit_lengths,
    format_tokens,
    join_words,
    make_needle,
)


def test_filler_is_deterministic_and_has_no_digits() -> None:
    assert filler_text(7, 200) == filler_text(7, 200)
    assert filler_text(7, 200) != filler_text(8, 200)
    text = filler_text("any seed", 2000)
    assert not re.search(r"\d", text)
    assert text.endswith(".")


def test_needles_are_seeded_and_differ_per_cell() -> None:
    assert make_needle("0:needle:1000:0.1") == make_needle("0:needle:1000:0.1")
    values = {make_needle(f"0:needle:1000:{d}").value for d in (0.1, 0.5, 0.9)}
    assert len(values) == 3
    assert make_needle("x").value == "9247215"  # seven digits by default, the same values as before the setting
    short = make_needle("x", digits=5)
    assert len(short.value) == 5 and short.key == make_needle("x").key and short.found_in(f"It is {short.value}.")
    assert not short.found_in(f"It is {short.value}9.") and not short.found_in(short.value[:-1])
    with pytest.raises(ValueError, match="at least 4 digits"):
        make_needle("x", digits=3)
    needle = make_needle(3)
    assert re.fullmatch(r"[1-9]\d{6}", needle.value)
    assert needle.value in needle.sentence and needle.key in needle.question


def test_exact_match_is_strict() -> None:
    needle = make_needle(1)
    value = needle.value
    assert needle.found_in(value)
    assert needle.found_in(f"The special magic number for {needle.key} is {value}.")
    assert not needle.found_in(value[:-1])  # one digit short
    assert not needle.found_in(f"1{value}")  # inside a longer number
    assert not needle.found_in(f"{value[:3]} {value[3:]}")  # split
    assert not needle.found_in("")
    assert not needle.found_in(None)


def test_sentence_boundary_moves_the_needle_to_a_full_stop_nearby() -> None:
    full_stop = 30
    tokens = [1, 2, 3, full_stop, 4, 5, 6, 7, 8, full_stop, 9] * 20
    # Position 6 of a 220-token budget: the window is 11 tokens, the nearest sentence end is after index 3.
    assert _sentence_boundary(tokens, 6, 220, full_stop) == 4
    assert _sentence_boundary(tokens, 0, 220, full_stop) == 0
    assert _sentence_boundary(tokens, 500, 220, full_stop) <= 220  # never past the budget
    assert _sentence_boundary(tokens, 6, 220, None) == 6
    assert _sentence_boundary(tokens, 6, 10, full_stop) == 6  # too small a budget to move it


def test_lengths_fit_the_context_and_are_written_like_the_seeds() -> None:
    assert fit_lengths([65000, 131000, 244000, 300000], 262144, 2048) == [65000, 131000, 244000, 260096]
    assert fit_lengths([7000, 9000, 10000], 8192, 48) == [7000, 8144]
    assert [format_tokens(n) for n in (120, 1000, 1500, 7600, 65000, 131072, 244000)] == [
        "120", "1K", "1.5K", "7.6K", "65K", "131K", "244K",
    ]
    assert join_words(["65K", "131K", "244K"]) == "65K, 131K and 244K"
    assert join_words(["1K"]) == "1K"


@pytest.mark.integration
@pytest.mark.parametrize("length,depth", [(200, 0.0), (1000, 0.5), (3000, 0.9), (7600, 1.0)])
def test_haystacks_are_token_exact_on_smollm2(cpu_server: Endpoint, length: int, depth: float) -> None:
    needle = make_needle(f"test:{length}:{depth}")
    haystack = build_haystack(cpu_server, length, depth, needle, seed=f"test:{length}:{depth}")
    assert haystack.prompt_tokens == length
    content = haystack.messages[-1]["content"]
    assert content.count(needle.value) == 1 and needle.question in content
    assert abs(haystack.actual_depth - depth) <= 0.06
    again = build_haystack(cpu_server, length, depth, needle, seed=f"test:{length}:{depth}")
    assert again.messages == haystack.messages


@pytest.mark.integration
def test_haystacks_are_token_exact_on_the_hybrid(hybrid_server: Endpoint) -> None:
    for length in (300, 2467):
        haystack = build_haystack(hybrid_server, length, 0.5, make_needle(length), seed=length)
        assert haystack.prompt_tokens == length


@pytest.mark.integration
def test_a_haystack_shorter_than_its_frame_is_refused(cpu_server: Endpoint) -> None:
    from cookbook.errors import CookbookError

    with pytest.raises(CookbookError, match="shorter than its own prompt frame"):
        build_haystack(cpu_server, 20, 0.5, make_needle(0), seed=0)


def test_a_long_requests_deadline_follows_the_servers_measured_prefill_pace() -> None:
    from cookbook.endpoint import PACE_MIN_TOKENS, parse_metrics, prefill_pace_from_metrics
    from cookbook.haystack import PACE_HEADROOM, SECONDS_PER_PROMPT_TOKEN, request_timeout

    def metrics(seconds: float, tokens: int) -> list:
        return parse_metrics(f'vllm:request_prefill_time_seconds_sum{{engine="0"}} {seconds}\n'
                             f'vllm:request_prefill_kv_computed_tokens_sum{{engine="0"}} {tokens}\n')

    slow = prefill_pace_from_metrics(metrics(65.8, 2691))  # measured: bf16 emulated on an AVX2-only host
    assert slow == pytest.approx(65.8 / 2691)
    assert request_timeout(60, 7600, slow) == pytest.approx(60 + 7600 * PACE_HEADROOM * slow)  # 804 s, not 136 s
    fast = prefill_pace_from_metrics(metrics(1.0, 3500))
    assert request_timeout(60, 7600, fast) == request_timeout(60, 7600) == 60 + 7600 * SECONDS_PER_PROMPT_TOKEN
    assert prefill_pace_from_metrics(metrics(5.0, PACE_MIN_TOKENS - 1)) is None  # too little said yet
    assert prefill_pace_from_metrics(parse_metrics("vllm:prompt_tokens_total 5000\n")) is None


def test_the_run_takes_the_pace_from_the_servers_metrics_at_its_start() -> None:
    from cookbook.checks import CheckContext
    from cookbook.checks.registry import RunStart
    from cookbook.endpoint import Endpoint

    ctx = CheckContext(Endpoint("http://127.0.0.1:9", "m"), request_timeout_s=60)
    assert ctx.prompt_timeout(1000) == pytest.approx(70.0)  # no run start: the fixed allowance
    ctx.run_start = RunStart(True, prefill_s_per_token=0.025)
    assert ctx.prompt_timeout(1000) == pytest.approx(160.0) and ctx.prefill_pace == 0.025
