"""Every tolerance a probe judges by, in one place, each with where it came from.

Two kinds of noise matter. A served run against the model's fp32 reference (the numerics oracle's tolerances:
how far a chosen token's logprob may sit from the reference's, and the margin within which the reference's two
candidates are a tie that the dtype's rounding can flip). And two served runs against each other (a request batched
or resumed against its solo run, a prefix-cache hit against its cold run, two prefill chunkings), used where no
reference can judge. Each value comes, first found, from: a check parameter, the recipe's calibration
(calibration.yaml, measured on clean runs by `cookbook calibrate`), the recipe's own verification values, the
cookbook's default for the served dtype.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from ...errors import CookbookError
from ...recipes import OracleTolerance, Recipe
from ..params import Param

# The names calibration.yaml uses (cookbook.calibrate writes them; Calibration.values is keyed by them).
REFERENCE_MAX = "reference.max_abs_delta"
REFERENCE_MEAN = "reference.mean_abs_delta"
REFERENCE_TOPK = "reference.max_topk_divergence"
REFERENCE_TIE = "reference.tie_margin"
RUN_DRIFT = "runs.max_logprob_diff"
RUN_TIE = "runs.tie_margin"
PROMPT_DRIFT = "prompt_logprobs.max_diff"
HIT_DRIFT = "prefix_cache.max_logprob_diff"
NAMES = (REFERENCE_MAX, REFERENCE_MEAN, REFERENCE_TOPK, REFERENCE_TIE, RUN_DRIFT, RUN_TIE, PROMPT_DRIFT, HIT_DRIFT)

# The check parameters that override a tolerance (`_pick`), each first before calibration and the recipe.
_FROM = "the recipe's calibration, else its verification, else the dtype's default"
MAX_LOGPROB_DIFF = Param("max_logprob_diff", "float", _FROM, "largest logprob gap allowed between two served runs",
                         low=0)
TIE_MARGIN = Param("tie_margin", "float", _FROM, "logprob margin within which two served runs' top tokens are a tie",
                   low=0)
PROMPT_LOGPROBS_MAX_DIFF = Param("prompt_logprobs_max_diff", "float", _FROM,
                                 "largest prompt-logprob gap allowed between two prefill chunkings", low=0)
PREFIX_CACHE_MAX_LOGPROB_DIFF = Param("prefix_cache_max_logprob_diff", "float", _FROM,
                                      "largest logprob gap allowed between a prefix-cache hit and its cold run", low=0)

# The served dtype's defaults for a recipe that says nothing. Reference: bf16 measured on the clean CPU server
# (SmolLM2-135M bf16 against the fp32 reference; docs/checks.md), with a margin; the others scaled from it by the
# dtype's rounding (fp16 has 3 more mantissa bits than bf16, fp8 e4m3 4 fewer): starting points, not measurements.
REFERENCE_DEFAULTS: dict[str, OracleTolerance] = {
    "bf16": OracleTolerance(
        max_abs_delta=0.6, mean_abs_delta=0.06, max_topk_divergence=0.15, tie_margin=0.5, min_top1_agreement=0.97,
        measured="cookbook default for bf16 (SmolLM2-135M on the CPU server, docs/checks.md)",
    ),
    "fp16": OracleTolerance(
        max_abs_delta=0.3, mean_abs_delta=0.02, max_topk_divergence=0.08, tie_margin=0.25, min_top1_agreement=0.98,
        measured="cookbook default for fp16 (scaled from the bf16 measurement, not measured)",
    ),
    "fp32": OracleTolerance(
        max_abs_delta=0.05, mean_abs_delta=0.005, max_topk_divergence=0.02, tie_margin=0.05, min_top1_agreement=0.99,
        measured="cookbook default for fp32 (kernel-order noise only, not measured)",
    ),
    "fp8": OracleTolerance(
        max_abs_delta=1.5, mean_abs_delta=0.2, max_topk_divergence=0.3, tie_margin=1.0, min_top1_agreement=0.9,
        measured="cookbook default for fp8 (scaled from the bf16 measurement, not measured)",
    ),
}
# Two served runs of the same request through different kernel shapes (a batch, a hit, a resumed prefill): bf16
# SmolLM2-135M measured 0.063 to 0.11 on the CPU server, the tiny Gemma 3 0.008 at 3,900 tokens.
RUNS_DEFAULTS: dict[str, float] = {"fp32": 1e-3, "fp16": 0.05, "bf16": 0.15, "fp8": 0.3}
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16", "float": "fp32"}

# The smallest fault each served-vs-served tolerance exists to catch: a tolerance calibrated above it cannot tell
# that fault from noise, and a check judged by it says so instead of passing (the fault proxy's shifted logprobs
# move a token by 0.5 nats; a position shifted across a chunk boundary moves prompt logprobs by nats).
FAULT_FLOOR: dict[str, float] = {RUN_DRIFT: 1.0, HIT_DRIFT: 1.0, PROMPT_DRIFT: 2.0, RUN_TIE: 2.0, REFERENCE_TIE: 2.0}


# A mean |served - reference| is a statistic of the positions it is taken over: its clean allowance is calibrated over
# the oracle's whole prompt set (hundreds of positions), where the sample barely moves it; over a handful (the short
# prompts alone, a short context) the same clean server's mean moves by its standard error (measured: SmolLM2 bf16 on
# an AMX host, 62 short-prompt positions, mean 0.041 against 0.026 over all 805). A run fails the mean only when it
# sits this many standard errors of its own sample above the clean allowance.
MEAN_Z = 3.0


def mean_bound(allowed_mean: float, deltas: Sequence[float]) -> float:
    """The mean these per-position deltas may reach: the clean allowance plus MEAN_Z standard errors of their mean
    (their own spread over the square root of their count), so a small sample is not held to a large sample's bar."""
    if len(deltas) < 2:
        return allowed_mean
    return allowed_mean + MEAN_Z * statistics.stdev(deltas) / math.sqrt(len(deltas))


def dtype_name(value: Any) -> str:
    text = str(value or "").lower()
    return DTYPE_ALIASES.get(text, text)


class Tolerance(BaseModel):
    """One tolerance and its provenance."""

    name: str
    value: float
    source: str = Field(description="Where it came from: a check parameter, the calibration, the recipe, a default")

    @property
    def too_noisy(self) -> str | None:
        """Why a check judged by it cannot tell its fault from the noise, or None."""
        floor = FAULT_FLOOR.get(self.name)
        if floor is not None and self.value >= floor:
            return (f"{self.name} is {self.value:g} ({self.source}), not below the {floor:g} a fault of this kind moves: "
                    "the noise is as large as the fault this check exists for")
        return None


class Tolerances(BaseModel):
    """What a run may differ by, for the served dtype."""

    dtype: str
    reference: OracleTolerance = Field(description="A served run against the fp32 reference")
    reference_from: str
    runs_drift: Tolerance = Field(description="Max |run - baseline| of a shared chosen token's logprob, two served runs")
    runs_tie: Tolerance = Field(description="Without a reference: two tokens within this in both runs' top-k are a tie")
    prompt_drift: Tolerance = Field(description="Max |difference| of prompt logprobs between two computation paths")
    hit_drift: Tolerance = Field(description="Max |hit - cold| of a chosen token's logprob in the prefix-cache probe")

    @property
    def flip_noise(self) -> Tolerance:
        """The margin within which the reference's two candidates at a departure are a tie."""
        source = "calibration" if "calibration" in self.reference_from else self.reference_from
        return Tolerance(name=REFERENCE_TIE, value=self.reference.tie_margin, source=source)


def _calibrated(recipe: Recipe | None, name: str, params: dict[str, Any] | None = None) -> float | None:
    """The calibrated value, when the server under test is the one calibrated: a server started with launch
    overrides (a small KV pool, other prefill chunks) has noise of its own, so the recipe's values judge it."""
    calibration = recipe.calibration if recipe is not None else None
    if calibration is None or (params or {}).get("launch_overrides"):
        return None
    value = calibration.values.get(name)
    return value.allowed if value is not None else None


def _calibration_source(recipe: Recipe) -> str:
    calibration = recipe.calibration
    assert calibration is not None
    return f"calibration ({calibration.runs} clean runs, {calibration.when}, {calibration.on})"


def reference_tolerance(recipe: Recipe | None, params: dict[str, Any] | None = None) -> tuple[OracleTolerance, str]:
    """The oracle's tolerance for the served dtype: the recipe's (with calibrated values on top), else the default."""
    params = params or {}
    dtype = dtype_name(recipe.precision.dtype if recipe else params.get("dtype", "bf16"))
    spec = recipe.verification.oracle if recipe else None
    if spec and dtype in spec.tolerances:
        base, source = spec.tolerances[dtype], f"the recipe's {dtype} tolerances"
    elif dtype in REFERENCE_DEFAULTS:
        base, source = REFERENCE_DEFAULTS[dtype], f"the cookbook's default {dtype} tolerances"
    else:
        raise CookbookError(f"verification.oracle.tolerances: no tolerance for dtype {dtype!r}")
    fields = {REFERENCE_MAX: "max_abs_delta", REFERENCE_MEAN: "mean_abs_delta", REFERENCE_TOPK: "max_topk_divergence",
              REFERENCE_TIE: "tie_margin"}
    calibrated = {attr: _calibrated(recipe, name, params) for name, attr in fields.items()}
    calibrated = {attr: value for attr, value in calibrated.items() if value is not None}
    if calibrated and recipe is not None:
        base = base.model_copy(update=calibrated)
        source = f"{_calibration_source(recipe)}, over {source}"
    return base, source


def _pick(name: str, param: str, recipe: Recipe | None, params: dict[str, Any], recipe_value: float | None,
          dtype: str) -> Tolerance:
    if params.get(param) is not None:
        return Tolerance(name=name, value=float(params[param]), source=f"check parameter {param}")
    calibrated = _calibrated(recipe, name, params)
    if calibrated is not None and recipe is not None:
        return Tolerance(name=name, value=calibrated, source=_calibration_source(recipe))
    if recipe_value is not None:
        return Tolerance(name=name, value=float(recipe_value), source="the recipe's verification")
    default = RUNS_DEFAULTS.get(dtype, RUNS_DEFAULTS["bf16"])
    return Tolerance(name=name, value=default, source=f"the cookbook's {dtype} default")


def tolerances(recipe: Recipe | None, params: dict[str, Any] | None = None, served_dtype: str | None = None) -> Tolerances:
    """Every tolerance for this recipe (or, without one, the served dtype's defaults)."""
    params = params or {}
    dtype = dtype_name(recipe.precision.dtype if recipe else (served_dtype or params.get("dtype") or "bf16"))
    reference, reference_from = reference_tolerance(recipe, {**params, "dtype": dtype})
    states = recipe.verification.engine_states if recipe else None
    cache = recipe.verification.prefix_cache if recipe else None
    hit_value = cache.max_logprob_diff if cache is not None and cache.logprobs == "close" and cache.max_logprob_diff else None
    return Tolerances(
        dtype=dtype,
        reference=reference,
        reference_from=reference_from,
        runs_drift=_pick(RUN_DRIFT, "max_logprob_diff", recipe, params, states.max_logprob_diff if states else None, dtype),
        runs_tie=_pick(RUN_TIE, "tie_margin", recipe, params, states.tie_margin if states else None, dtype),
        prompt_drift=_pick(PROMPT_DRIFT, "prompt_logprobs_max_diff", recipe, params,
                           states.prompt_logprobs_max_diff if states else None, dtype),
        hit_drift=_pick(HIT_DRIFT, "prefix_cache_max_logprob_diff", recipe, params, hit_value, dtype),
    )


def too_noisy(*judged_by: Tolerance) -> str | None:
    """Why a check judged by these tolerances cannot tell its fault from the noise (the first reason), or None: the
    check then says so (inconclusive) instead of passing or failing."""
    return next((reason for reason in (t.too_noisy for t in judged_by) if reason), None)
