"""Statistics of a benchmark: mean and percentiles the way `vllm bench serve` computes them."""
from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel, Field


class Summary(BaseModel):
    """Mean and percentiles of one latency over the requests of a figure (None when there is no sample)."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's and vllm bench's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(count=0)
    return Summary(
        count=len(values),
        mean=sum(values) / len(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
    )


# A sample is an outlier when it lies above the upper fence: Q3 + OUTLIER_IQR x IQR (Tukey's "far out" fence),
# and at least OUTLIER_MEDIAN x the median, so that a very tight distribution (IQR near 0) does not call a 10 % wobble
# an outlier. A graph recompile or a stall lands far above both. Fewer than OUTLIER_MIN_SAMPLES samples: no fence.
OUTLIER_IQR = 3.0
OUTLIER_MEDIAN = 2.0
OUTLIER_MIN_SAMPLES = 4
OUTLIER_RULE = f"above Q3 + {OUTLIER_IQR:g} x IQR and above {OUTLIER_MEDIAN:g} x the median"


class Outliers(BaseModel):
    """The outliers of one set of samples by OUTLIER_RULE: the fence, how many lie above it, and which."""

    rule: str = OUTLIER_RULE
    count: int = 0
    fence: float | None = Field(None, description="Samples above this value are outliers (None: too few samples)")
    indices: list[int] = Field(default_factory=list, description="Positions of the outliers in the samples")


def outliers(values: Sequence[float]) -> Outliers:
    """Samples far above the rest (OUTLIER_RULE): a recompile or a stall, counted rather than averaged away."""
    if len(values) < OUTLIER_MIN_SAMPLES:
        return Outliers()
    q1, median, q3 = percentile(values, 25), percentile(values, 50), percentile(values, 75)
    fence = max(q3 + OUTLIER_IQR * (q3 - q1), OUTLIER_MEDIAN * median)
    indices = [i for i, v in enumerate(values) if v > fence]
    return Outliers(count=len(indices), fence=fence, indices=indices)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
