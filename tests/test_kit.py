"""The probe kit: the one departure rule, the drift rule, the tolerances and the referee (no server)."""
from __future__ import annotations

import pytest

from cookbook.checks import CheckContext
from cookbook.checks.kit import Referee, compare_traces, first_departure, tolerances
from cookbook.checks.kit.departure import rank_by_reference
from cookbook.checks.kit.tolerances import MEAN_Z, Tolerance, mean_bound
from cookbook.completions import Completion, Trace, completion_body, maybe_token_id, parse_completion, token_id
from cookbook.endpoint import Endpoint
from cookbook.errors import ServerError
from cookbook.recipes import Calibration, CalibratedValue, EngineStatesExpectation, load_recipe
from cookbook.reference import RefPosition, RefScore

ENDPOINT = Endpoint("http://127.0.0.1:9", "m")


def _trace(ids: list[int], tops: list[dict[int, float]] | None = None, lps: list[float] | None = None) -> Trace:
    tops = tops or [{i: -0.1} for i in ids]
    return Trace(token_ids=ids, logprobs=lps or [tops[n].get(i, -0.1) for n, i in enumerate(ids)], top=tops)


class FakeReference:
    """Scores any prompt with the positions given per prompt length: what a computed reference returns."""

    source = "computed here (test)"

    def __init__(self, at: dict[int, RefPosition]) -> None:
        self.at = at
        self.calls: list[list[int]] = []

    def can_score(self, prompt_ids: list[int]) -> bool:
        return True

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        self.calls.append(list(prompt_ids))
        positions = [self.at.get(i) for i in range(len(prompt_ids))]
        return RefScore(self.source, positions, [RefPosition(0, -0.1, {0: -0.1})])


def _referee(reference: FakeReference | None, why: str = "no reference recorded for this image") -> Referee:
    referee = Referee(CheckContext(ENDPOINT, None))
    referee._looked = True  # the lookup is cookbook.reference's job; these tests hand it the reference
    referee._reference = reference  # type: ignore[assignment]
    referee.why_none = "" if reference is not None else why
    return referee


TOL = tolerances(None, {"max_logprob_diff": 0.25, "tie_margin": 0.1})
PROMPT = [100, 101, 102]  # the departure at generated step 1 is prompt position 3 + 1 = 4 of the scored ids


# -- the request shape ---------------------------------------------------------------------------------------------


def test_the_one_parser_of_token_ids() -> None:
    assert token_id("token_id:42") == 42 and maybe_token_id("token_id:-1") == -1
    assert maybe_token_id(" the") is None and maybe_token_id(None) is None and maybe_token_id("token_id:x") is None
    with pytest.raises(ServerError, match="expected 'token_id:N' tokens"):
        token_id(" the")


def test_parse_completion_reads_token_ids_top_k_prompt_logprobs_and_ranks() -> None:
    data = {
        "choices": [{
            "text": " a b",
            "finish_reason": "length",
            "logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-0.5, -1.0],
                         "top_logprobs": [{"token_id:5": -0.5, "token_id:6": -1.5}, {"token_id:7": -1.0}]},
            "prompt_logprobs": [None, {"11": {"logprob": -2.0, "rank": 1}, "12": {"logprob": -3.0, "rank": 2}}],
        }],
        "usage": {"prompt_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}},
    }
    parsed = parse_completion(data)
    assert isinstance(parsed, Completion)
    assert parsed.token_ids == [5, 7] and parsed.logprobs == [-0.5, -1.0]
    assert parsed.top[0] == {5: -0.5, 6: -1.5}
    assert parsed.prompt_logprobs == [None, {11: -2.0, 12: -3.0}]
    assert parsed.prompt_ranks == [{}, {11: 1, 12: 2}]
    assert parsed.cached_tokens == 0 and parsed.prompt_tokens == 2
    body = completion_body("m", [1, 2], 4, "salt", prompt_logprobs=5)
    assert body["cache_salt"] == "salt" and body["return_tokens_as_token_ids"] and body["prompt_logprobs"] == 5
    assert completion_body("m", [1], 0)["cache_salt"].startswith("cookbook-probe-") and completion_body("m", [1], 0)["max_tokens"] == 1


# -- a departure without a reference: both runs' own top-k ----------------------------------------------------------


def test_without_a_reference_a_near_tie_in_both_runs_is_a_tie_and_a_clear_flip_fails() -> None:
    solo = _trace([1, 2, 3], [{1: -0.1}, {2: -0.70, 9: -0.72}, {3: -0.1}])
    tie = _trace([1, 9, 4], [{1: -0.1}, {9: -0.66, 2: -0.79}, {4: -0.1}])
    clear = _trace([1, 9, 4], [{1: -0.1}, {9: -0.1, 2: -3.0}, {4: -0.1}])
    assert first_departure(solo, tie) == 1
    found = compare_traces("p", solo, tie, PROMPT, _referee(None), TOL)
    assert found.problems == [] and found.departure is not None and found.departure.verdict == "tie"
    assert found.departure.baseline_margin == pytest.approx(0.02) and found.departure.run_margin == pytest.approx(0.13)
    assert "no reference (no reference recorded for this image)" in found.departure.judged_by
    bad = compare_traces("p", solo, clear, PROMPT, _referee(None), TOL)
    assert bad.departure is not None and bad.departure.verdict == "fail" and bad.problems
    assert "first differing token 1: the solo run took token 2, this run token 9" in bad.problems[0]
    # strict tolerances: no ties at all, and any logprob difference fails
    strict = tolerances(None, {"max_logprob_diff": 0, "tie_margin": 0})
    assert compare_traces("p", solo, tie, PROMPT, _referee(None), strict).problems


def test_a_token_missing_from_a_runs_top_k_is_never_a_near_tie_without_a_reference() -> None:
    solo = _trace([1, 2], [{1: -0.1}, {2: -0.70, 5: -0.71}])
    run = _trace([1, 9], [{1: -0.1}, {9: -0.66, 2: -0.70}])  # 9 is not in the solo run's top-k
    found = compare_traces("p", solo, run, PROMPT, _referee(None), TOL)
    assert found.departure is not None and found.departure.verdict == "fail"


def test_runs_of_different_length_are_a_departure_nobody_can_call_a_tie() -> None:
    solo, run = _trace([1, 2, 3]), _trace([1, 2])
    found = compare_traces("p", solo, run, PROMPT, _referee(None), TOL)
    assert found.departure is not None and found.departure.position == 2 and found.departure.failed
    assert "differ in length" in found.problems[0]


# -- a departure judged by the reference ------------------------------------------------------------------------------


def test_the_reference_calls_a_tie_that_the_runs_own_margins_would_fail() -> None:
    """The issue's case: a cold request in a burst took the other token; the solo run had them 0.25 apart (over a
    fixed 0.13 bar), while the fp32 reference puts them 0.1 apart: the batch's numerics, not a fault."""
    solo = _trace([1, 2, 3], [{1: -0.1}, {2: -1.45, 9: -1.70}, {3: -0.1}])
    burst = _trace([1, 9, 4], [{1: -0.1}, {9: -1.705, 2: -1.705}, {4: -0.1}])
    reference = FakeReference({3: RefPosition(1, -0.1, {1: -0.1}), 4: RefPosition(2, -1.5, {2: -1.5, 9: -1.6})})
    judged = compare_traces("request 3 (cold)", solo, burst, PROMPT, _referee(reference), TOL)
    assert judged.problems == []
    departure = judged.departure
    assert departure is not None and departure.verdict == "tie"
    assert departure.baseline_margin == pytest.approx(0.25) and departure.reference_margin == pytest.approx(0.1)
    assert "within 0.5" in departure.judged_by and "computed here (test)" in departure.judged_by
    # two forward passes: the prompt and the solo run up to the departure; after the tie, the run's own tokens
    assert reference.calls == [PROMPT + [1, 2], PROMPT + [1, 9, 4]]


def test_after_a_near_tie_the_reference_follows_the_run_and_fails_a_token_it_rules_out() -> None:
    """A defect whose first visible flip lands on a near-tie (a batch-only logit shift lifts the runner-up at every
    batched step): the baseline says nothing after the runs part, the reference scoring the run's own continuation
    does, and a later step it clearly rules out fails the run, naming both tokens."""
    solo = _trace([1, 2, 3, 5], [{1: -0.1}, {2: -1.45, 9: -1.70}, {3: -0.1}, {5: -0.1}])
    burst = _trace([1, 9, 4, 7], [{1: -0.1}, {9: -1.0, 2: -1.2}, {4: -0.3, 6: -2.0}, {7: -0.2, 8: -1.9}])
    reference = FakeReference({3: RefPosition(1, -0.1, {1: -0.1}), 4: RefPosition(2, -1.5, {2: -1.5, 9: -1.6}),
                               5: RefPosition(4, -0.2, {4: -0.2, 6: -2.2}), 6: RefPosition(8, -0.1, {8: -0.1, 7: -2.5})})
    judged = compare_traces("request 2 (batched)", solo, burst, PROMPT, _referee(reference), TOL)
    departure = judged.departure
    assert departure is not None and departure.verdict == "fail" and departure.failed
    assert departure.position == 3 and (departure.baseline_token, departure.run_token) == (8, 7)
    assert departure.reference_margin == pytest.approx(2.4) and departure.reference_margin > departure.tie_margin
    assert departure.after is not None and "near-tie at step 1 (tokens 2 and 9" in departure.after
    assert judged.problems and "step 3 of this run's own continuation, after the near-tie at step 1" in judged.problems[0]
    assert "took token 8, this run token 7" in judged.problems[0]
    # the same run with no reference able to score its own tokens: the near-tie stands, nothing more is claimed
    golden_only = _referee(None)
    assert compare_traces("request 2 (batched)", solo, burst, PROMPT, golden_only, TOL).departure.after is None  # type: ignore[union-attr]


def test_the_reference_fails_a_run_that_lost_the_token_it_clearly_prefers() -> None:
    solo = _trace([1, 2], [{1: -0.1}, {2: -0.70, 9: -0.72}])
    run = _trace([1, 9], [{1: -0.1}, {9: -0.66, 2: -0.79}])  # a near-tie in both runs...
    reference = FakeReference({4: RefPosition(2, -0.2, {2: -0.2, 9: -2.2})})  # ...but not in the model
    judged = compare_traces("p", solo, run, PROMPT, _referee(reference), TOL)
    assert judged.departure is not None and judged.departure.verdict == "fail"
    assert judged.departure.reference_margin == pytest.approx(2.0)
    assert "this run lost the right token" in judged.problems[0]


def test_where_the_reference_prefers_the_runs_token_the_baseline_was_the_one_off() -> None:
    solo = _trace([1, 2], [{1: -0.1}, {2: -0.5, 9: -1.5}])
    run = _trace([1, 9], [{1: -0.1}, {9: -0.5, 2: -1.5}])
    reference = FakeReference({4: RefPosition(2, -2.0, {9: -0.2, 2: -2.0})})
    judged = compare_traces("p", solo, run, PROMPT, _referee(reference), TOL)
    assert judged.departure is not None and judged.departure.verdict == "baseline-off" and judged.problems == []


def test_a_run_token_outside_the_reference_top_k_fails_when_the_floor_is_clear() -> None:
    ref = RefPosition(2, -0.1, {2: -0.1, 5: -3.0})
    ranking = rank_by_reference(ref, 2, 9, 0.5)
    assert ranking is not None and ranking.verdict == "fail" and ranking.bound == "at least"
    assert ranking.margin == pytest.approx(2.9) and "more than 2.900" in ranking.note
    flat = RefPosition(2, -1.0, {2: -1.0, 5: -1.2})
    close = rank_by_reference(flat, 2, 9, 0.5)
    assert close is not None and close.verdict == "tie"
    assert rank_by_reference(RefPosition(1, -0.1, {1: -0.1}), 7, 9, 0.5) is None  # neither listed: cannot rank
    off = rank_by_reference(RefPosition(9, -0.1, {9: -0.1, 5: -3.0}), 2, 9, 0.5)
    assert off is not None and off.verdict == "baseline-off" and off.bound == "at most"


# -- the shared tokens' logprobs ---------------------------------------------------------------------------------------


def test_drift_beyond_the_tolerance_fails_without_a_reference_and_is_measured() -> None:
    solo, run = _trace([1, 2], lps=[-0.1, -0.2]), _trace([1, 2], lps=[-0.1, -0.6])
    result = compare_traces("p", solo, run, PROMPT, _referee(None), TOL)
    assert result.tokens_identical and result.max_logprob_diff == pytest.approx(0.4)
    assert result.drift is not None and result.drift.verdict == "fail"
    assert "differ from the solo run by 0.4" in result.problems[0] and "no reference" in result.problems[0]


def test_drift_beyond_the_tolerance_is_noise_when_both_runs_sit_near_the_reference() -> None:
    ids = list(range(1, 9))
    solo = _trace(ids, lps=[-0.1] * 5 + [-0.2] + [-0.1] * 2)
    run = _trace(ids, lps=[-0.1] * 5 + [-0.6] + [-0.1] * 2)  # 0.4 apart at step 5, over the 0.25 allowed

    def reference_at(step5: float) -> FakeReference:
        return FakeReference({3 + i: RefPosition(t, step5 if i == 5 else -0.1, {t: step5 if i == 5 else -0.1})
                              for i, t in enumerate(ids)})

    result = compare_traces("p", solo, run, PROMPT, _referee(reference_at(-0.4)), TOL)
    assert result.problems == [] and result.drift is not None and result.drift.verdict == "noise"
    assert "both within 0.6 of it" in result.drift.note
    result = compare_traces("p", solo, run, PROMPT, _referee(reference_at(-1.5)), TOL)
    assert result.drift is not None and result.drift.verdict == "fail" and "more than 0.6 from it" in result.problems[0]
    # a recipe that claims bit-identity admits no noise, reference or not
    exact = compare_traces("p", solo, run, PROMPT, _referee(reference_at(-0.4)), TOL, strict_logprobs=True)
    assert exact.drift is not None and exact.drift.verdict == "fail" and "bit-identity" in exact.problems[0]


def test_identical_runs_ask_the_reference_nothing() -> None:
    reference = FakeReference({})
    same = compare_traces("p", _trace([1, 2]), _trace([1, 2]), PROMPT, _referee(reference), TOL)
    assert same.problems == [] and same.departure is None and reference.calls == []


# -- tolerances: where each comes from -----------------------------------------------------------------------------


def test_tolerances_come_from_a_parameter_the_calibration_the_recipe_else_the_dtype() -> None:
    gemma = load_recipe("cookbook/tiny-gemma3")
    assert gemma.verification.engine_states is None and gemma.precision.dtype == "bf16"
    plain = tolerances(gemma)
    assert (plain.runs_drift.value, plain.runs_tie.value, plain.prompt_drift.value) == (0.15, 0.15, 0.15)
    assert plain.runs_drift.source == "the cookbook's bf16 default"
    calibrated_smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert calibrated_smol.calibration is not None  # recipes/.../calibration.yaml, written by `cookbook calibrate`
    assert tolerances(calibrated_smol).runs_drift.source.startswith("calibration (")
    # a server started with launch overrides is not the one calibrated: the recipe's own values judge it
    small_pool = tolerances(calibrated_smol, {"launch_overrides": {"num-gpu-blocks-override": 17}})
    assert small_pool.runs_drift.source == "the recipe's verification" and small_pool.reference.tie_margin == 0.5
    smol = calibrated_smol.model_copy(update={"calibration": None})
    own = tolerances(smol, {"tie_margin": 0})
    assert (own.runs_drift.value, own.runs_tie.value, own.prompt_drift.value) == (0.25, 0.0, 0.5)
    assert own.runs_tie.source == "check parameter tie_margin" and own.runs_drift.source == "the recipe's verification"
    assert own.hit_drift.value == 0.15 and own.reference.tie_margin == 0.5
    verification = gemma.verification.model_copy(update={"engine_states": EngineStatesExpectation(max_logprob_diff=0)})
    partial = tolerances(gemma.model_copy(update={"verification": verification}))
    assert (partial.runs_drift.value, partial.runs_tie.value) == (0.0, 0.15)
    calibrated = smol.model_copy(update={"calibration": Calibration(
        when="2026-12-01T00:00:00+00:00", on="test", runs=3, margin="x1.5",
        values={"runs.max_logprob_diff": CalibratedValue(measured=0.1, allowed=0.15, runs_seen=3),
                "reference.tie_margin": CalibratedValue(measured=0.3, allowed=0.45, runs_seen=3)})})
    measured = tolerances(calibrated)
    assert measured.runs_drift.value == 0.15 and measured.runs_drift.source.startswith("calibration (3 clean runs")
    assert measured.reference.tie_margin == 0.45 and measured.flip_noise.source == "calibration"
    assert measured.reference.max_abs_delta == 0.8  # not calibrated: the recipe's own
    assert tolerances(calibrated, {"max_logprob_diff": 0.3}).runs_drift.source == "check parameter max_logprob_diff"


def test_a_tolerance_as_large_as_the_fault_says_it_cannot_tell_them_apart() -> None:
    assert Tolerance(name="runs.max_logprob_diff", value=0.25, source="x").too_noisy is None
    noisy = Tolerance(name="runs.max_logprob_diff", value=1.2, source="calibration").too_noisy
    assert noisy is not None and "as large as the fault" in noisy


def test_a_shift_of_every_logprob_is_a_fault_even_when_each_step_is_near_the_reference() -> None:
    """The fault proxy's hit-shifted-logprobs: every chosen token 0.5 lower, each step within the 0.6 a clean run
    may sit from the reference, but on average far past the 0.06 it does."""
    ids = list(range(1, 9))
    reference = FakeReference({3 + i: RefPosition(t, -0.3, {t: -0.3}) for i, t in enumerate(ids)})
    solo, shifted = _trace(ids, lps=[-0.3] * 8), _trace(ids, lps=[-0.8] * 8)
    result = compare_traces("p", solo, shifted, PROMPT, _referee(reference), TOL)
    assert result.drift is not None and result.drift.verdict == "fail"
    assert "on average over 8 shared steps" in result.problems[0]


def test_a_check_whose_tolerance_is_as_large_as_its_fault_is_inconclusive_not_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cookbook.checks.engine_states.batch as batch
    from cookbook.checks import CHECKS
    from cookbook.checks.engine_states import EngineLayout
    from cookbook.checks.registry import CheckInconclusive

    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    noisy = recipe.model_copy(update={"calibration": Calibration(
        when="2026-12-01T00:00:00+00:00", on="test", runs=3, margin="x1.5",
        values={"runs.max_logprob_diff": CalibratedValue(measured=0.9, allowed=1.35, runs_seen=3)})})
    layout = EngineLayout(block_size=128, kv_pool_tokens=93_184, prefix_caching=True, max_model_len=8192,
                          max_num_seqs=8, max_num_batched_tokens=2048)
    monkeypatch.setattr(batch, "engine_layout", lambda _ctx: layout)  # no server: the check stops before any request
    with pytest.raises(CheckInconclusive, match=r"runs.max_logprob_diff is 1.35 .*as large as the fault"):
        CHECKS["batch-composition"].fn(CheckContext(ENDPOINT, noisy))


def test_the_oracle_whose_tie_margin_is_as_large_as_a_fault_is_inconclusive() -> None:
    from cookbook.checks import CHECKS
    from cookbook.checks.registry import CheckInconclusive

    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    noisy = recipe.model_copy(update={"calibration": Calibration(
        when="2026-12-01T00:00:00+00:00", on="test", runs=3, margin="x1.5",
        values={"reference.tie_margin": CalibratedValue(measured=1.5, allowed=2.25, runs_seen=3)})})
    with pytest.raises(CheckInconclusive, match=r"reference.tie_margin is 2.25 .*as large as the fault"):
        CHECKS["oracle"].fn(CheckContext(ENDPOINT, noisy))


# -- a mean is judged with its sample's size -----------------------------------------------------------------------


def test_a_mean_over_few_noisy_positions_gets_its_standard_error_and_many_barely_move_it() -> None:
    # the clean SmolLM2 server's short prompts: a handful of positions with a few large deltas sit above the mean
    # that the whole prompt set was calibrated at, and are still clean
    few = [0.0] * 50 + [0.2] * 12
    assert sum(few) / len(few) > 0.0386 and sum(few) / len(few) < mean_bound(0.0386, few)
    many = few * 13
    assert mean_bound(0.0386, many) - 0.0386 < (mean_bound(0.0386, few) - 0.0386) / 3
    assert mean_bound(0.0386, few) == pytest.approx(0.0386 + MEAN_Z * 0.0797 / 62 ** 0.5, rel=0.01)


def test_a_systematic_drift_fails_the_mean_whatever_the_sample_size() -> None:
    # every position moved by the same small amount (no single one past the max): no spread, so no allowance
    for n in (5, 60, 800):
        drift = [0.1] * n
        assert mean_bound(0.0386, drift) == pytest.approx(0.0386)
        assert sum(drift) / n > mean_bound(0.0386, drift)
    assert mean_bound(0.05, [0.3]) == 0.05  # one position: no spread to measure, the clean allowance alone
