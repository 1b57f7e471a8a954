"""A run against its baseline, token by token, judged by the one rule (`departure`) with the model's reference."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ...completions import Trace
from ...reference import RefPosition
from .departure import Departure, Drift, first_departure, judge_continuation, judge_departure, judge_drift
from .referee import Referee
from .tolerances import Tolerances


class RunComparison(BaseModel):
    """One request's run in a state (batched, in a burst, resumed, a cache hit) against its baseline (a solo or
    cold run of the same request)."""

    name: str
    tokens_identical: bool
    compared_tokens: int = Field(description="Leading tokens both runs share; their logprobs were compared")
    max_logprob_diff: float | None
    departure: Departure | None = Field(None, description="Where the run first took another token, and the verdict; "
                                        "after a near-tie, the first step of the run's own continuation that the "
                                        "reference rules out, when one is")
    drift: Drift | None = Field(None, description="The shared tokens' logprobs: within, noise or fail")
    problems: list[str] = Field(default_factory=list)

    @property
    def tie(self) -> bool:
        return self.departure is not None and not self.departure.failed


def _shared(baseline: Trace, run: Trace) -> int:
    shared = 0
    for a, b in zip(baseline.token_ids, run.token_ids):
        if a != b:
            break
        shared += 1
    return shared


def compare_traces(
    name: str,
    baseline: Trace,
    run: Trace,
    prompt: list[int] | None,
    referee: Referee | None,
    tolerances: Tolerances,
    drift_allowed: Literal["runs", "hit"] = "runs",
    strict_logprobs: bool = False,
    baseline_name: str = "the solo run",
) -> RunComparison:
    """Find where `run` parts from `baseline`, ask the reference at that step (one forward pass of the prompt and
    the shared tokens), and judge the departure and the shared tokens' logprobs by the one rule. `drift_allowed`:
    which served-vs-served tolerance bounds the logprobs ('runs' or 'hit'); `strict_logprobs`: every difference
    fails (a recipe that claims bit-identity)."""
    shared = _shared(baseline, run)
    comparison = RunComparison(
        name=name,
        tokens_identical=bool(baseline.token_ids) and baseline.token_ids == run.token_ids,
        compared_tokens=shared,
        max_logprob_diff=None,
    )
    if not baseline.token_ids or not run.token_ids:
        comparison.problems.append(
            f"{name}: no generated tokens to compare (baseline {len(baseline.token_ids)}, run {len(run.token_ids)})"
        )
        return comparison
    position = first_departure(baseline, run)
    allowed = tolerances.hit_drift if drift_allowed == "hit" else tolerances.runs_drift
    needs_reference = position is not None
    path: list[RefPosition | None] | None = None

    def reference_path() -> list[RefPosition | None] | None:
        nonlocal path
        if path is None and referee is not None and prompt is not None:
            upto = position + 1 if position is not None and position < len(baseline.token_ids) else shared
            path = referee.path(prompt, baseline.token_ids[:upto])
        return path

    if needs_reference or _beyond(baseline, run, shared, allowed.value):
        reference_path()
    if strict_logprobs:
        allowed = allowed.model_copy(update={"value": 0.0, "source": "the recipe's claim of bit-identical logprobs"})
    comparison.drift = judge_drift(baseline, run, shared, allowed, None if strict_logprobs else path,
                                   tolerances.reference.max_abs_delta, referee.source if referee else None,
                                   tolerances.reference.mean_abs_delta)
    if strict_logprobs and comparison.drift.verdict == "fail":
        comparison.drift.note = "bit-identity admits no noise"
    comparison.max_logprob_diff = comparison.drift.max_diff
    if position is not None:
        at = path[position] if path is not None and position < len(path) else None
        why = referee.why_none if referee is not None else "no reference asked"
        comparison.departure = judge_departure(baseline, run, position, at, referee.source if referee else None,
                                               tolerances.flip_noise, tolerances.runs_tie, why,
                                               tolerances.runs_drift.value, baseline_name)
        if not comparison.departure.failed and referee is not None and prompt is not None:
            later = judge_continuation(run, comparison.departure, referee.path(prompt, run.token_ids),
                                       referee.source, tolerances.flip_noise)
            comparison.departure = later or comparison.departure
        if comparison.departure.failed:
            comparison.problems.append(f"{name}: {comparison.departure.describe()}")
    if comparison.drift.verdict == "fail":
        diff = comparison.drift.max_diff or 0.0
        comparison.problems.append(
            f"{name}: logprobs differ from {baseline_name} by {diff:.3g} over the {shared} shared tokens (allowed "
            f"{allowed.value:g}, {allowed.source}){'; ' + comparison.drift.note if comparison.drift.note else ''}"
        )
    return comparison


def _beyond(baseline: Trace, run: Trace, shared: int, allowed: float) -> bool:
    return any(abs(x - y) > allowed for x, y in zip(baseline.logprobs[:shared], run.logprobs[:shared]))


def tally(comparisons: list[RunComparison]) -> tuple[int, int, float | None]:
    """(identical, departures judged ties or baseline-off, worst logprob difference)."""
    identical = sum(c.tokens_identical for c in comparisons)
    ties = sum(1 for c in comparisons if c.tie)
    diffs = [c.max_logprob_diff for c in comparisons if c.max_logprob_diff is not None]
    return identical, ties, max(diffs) if diffs else None
