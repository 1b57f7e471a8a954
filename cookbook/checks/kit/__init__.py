"""The probe kit: what every probe that compares two runs shares.

- `client`: sending the one request shape (cookbook.completions) alone, together or staggered, and the gate.
- `tolerances`: every tolerance, with where it came from (a parameter, the calibration, the recipe, a default).
- `referee`: the model's reference for a probe's own prompts.
- `departure`: the one rule for two runs that part, and for their shared tokens' logprobs.
- `compare`: a run against its baseline, judged by that rule.
"""
from .compare import RunComparison, compare_traces, tally
from .departure import Departure, Drift, first_departure, judge_departure, judge_drift
from .referee import Referee
from .tolerances import Tolerance, Tolerances, tolerances, too_noisy

__all__ = [
    "Departure",
    "Drift",
    "Referee",
    "RunComparison",
    "Tolerance",
    "Tolerances",
    "compare_traces",
    "first_departure",
    "judge_departure",
    "judge_drift",
    "tally",
    "tolerances",
    "too_noisy",
]
