"""Statistics of a benchmark: mean and percentiles the way `vllm bench serve` computes them."""
from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel


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


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
