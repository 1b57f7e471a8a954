"""What the engine-states probes share: the layout of the server under test, its counters, and the wording."""
from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from ...completions import Completion, excerpt
from ...endpoint import Endpoint, kv_pool_from_metrics, metric_value
from ...errors import CookbookError, ServerDown
from ...haystack import server_max_model_len
from ...results import Evidence
from ..kit import Referee, RunComparison, Tolerances, tally, too_noisy
from ..prefix_cache import server_cache_config
from ..kit.referee import REFERENCE_PARAMS
from ..kit.tolerances import MAX_LOGPROB_DIFF, TIE_MARGIN
from ..params import CONCURRENCY, DTYPE, SEED, Param
from ..registry import CheckContext, CheckInconclusive

GROUP = "engine-states"
# What every engine-states probe reads: the scheduler limits vLLM does not export, the seed, the runs' tolerances.
LAYOUT_PARAMS = (
    Param("max_num_seqs", "int", "a launch override, else the recipe's --max-num-seqs, else the run's concurrency",
          "requests the server's scheduler runs at once", low=1, high=65536),
    Param("max_num_batched_tokens", "int", "a launch override, else the recipe's flag, else vLLM's CPU default",
          "tokens per scheduler step (the prefill chunk)", low=1, high=100_000_000),
    CONCURRENCY, SEED, DTYPE, MAX_LOGPROB_DIFF, TIE_MARGIN, *REFERENCE_PARAMS,
)
PREEMPTIONS_METRIC = "vllm:num_preemptions_total"
HITS_METRIC = "vllm:prefix_cache_hits_total"
# vLLM 0.32's default --max-num-batched-tokens for the OpenAI server on CPU (vllm/engine/arg_utils.py); a recipe's
# or a launch override's flag wins.
CPU_DEFAULT_BATCHED_TOKENS = 2048
METRIC_SETTLE_S = 3.0


class EngineLayout(BaseModel):
    """What the probes size their load from, and where each figure came from."""

    block_size: int | None = Field(description="Tokens per KV block (vllm:cache_config_info)")
    kv_pool_tokens: int | None = Field(description="KV pool in tokens (vllm:cache_config_info)")
    prefix_caching: bool | None = Field(description="enable_prefix_caching from vllm:cache_config_info")
    max_model_len: int = Field(description="The server's context, from /tokenize")
    max_num_seqs: int = Field(description="Requests the scheduler runs at once")
    max_num_batched_tokens: int | None = Field(description="Tokens per scheduler step: the prefill chunk")
    sources: dict[str, str] = Field(default_factory=dict, description="figure -> where it came from")


def _flag(ctx: CheckContext, name: str) -> tuple[Any, str] | None:
    """A `vllm serve` flag as the server under test was started: a launch override, else the recipe's."""
    overrides = ctx.params.get("launch_overrides") or {}
    if name in overrides:
        return overrides[name], "launch override"
    if ctx.recipe is not None and name in ctx.recipe.serve.flags:
        return ctx.recipe.serve.flags[name], "recipe flag"
    return None


def param_int(ctx: CheckContext, key: str) -> int | None:
    """An integer check parameter (`--param` gives it typed; a notebook may pass a list of one)."""
    value = ctx.params.get(key)
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return int(value) if value is not None else None


def engine_layout(ctx: CheckContext) -> EngineLayout:
    """Block size, pool and caching from the server's /metrics; context from /tokenize; scheduler limits from
    check parameters, launch overrides or the recipe (vLLM does not export them)."""
    sources: dict[str, str] = {}
    config = server_cache_config(ctx.endpoint) or {}
    block = config.get("block_size", "")
    block_size = int(block) if block.isdigit() else None
    if block_size is None and ctx.recipe is not None:
        block_size = ctx.recipe.prefix_caching.block_size
        sources["block_size"] = "recipe"
    elif block_size is not None:
        sources["block_size"] = "server /metrics"
    pool = kv_pool_from_metrics(ctx.endpoint.metrics())
    sources["kv_pool_tokens"] = "server /metrics" if pool is not None else "unknown"
    caching = {"True": True, "False": False}.get(config.get("enable_prefix_caching", ""))
    seqs = param_int(ctx, "max_num_seqs")
    if seqs is not None:
        sources["max_num_seqs"] = "check parameter"
    else:
        found = _flag(ctx, "max-num-seqs")
        seqs, sources["max_num_seqs"] = (int(found[0]), found[1]) if found else (ctx.concurrency, "default")
    batched = param_int(ctx, "max_num_batched_tokens")
    if batched is not None:
        sources["max_num_batched_tokens"] = "check parameter"
    else:
        found = _flag(ctx, "max-num-batched-tokens")
        if found:
            batched, sources["max_num_batched_tokens"] = int(found[0]), found[1]
        elif ctx.recipe is not None and ctx.recipe.image.kind == "vllm-cpu":
            batched, sources["max_num_batched_tokens"] = CPU_DEFAULT_BATCHED_TOKENS, "vLLM 0.32's CPU default"
        else:
            sources["max_num_batched_tokens"] = "unknown"
    return EngineLayout(
        block_size=block_size,
        kv_pool_tokens=pool,
        prefix_caching=caching,
        max_model_len=server_max_model_len(ctx.endpoint),
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        sources=sources,
    )


def metric(endpoint: Endpoint, name: str) -> float | None:
    try:
        metrics = endpoint.metrics()
    except ServerDown:
        raise
    except CookbookError:
        return None
    value = metric_value(metrics, name, model_name=endpoint.model)
    return value if value is not None else metric_value(metrics, name)


def settled_delta(endpoint: Endpoint, name: str, before: float | None, at_least: float) -> float | None:
    """How far a counter moved since `before`, waiting briefly for it to reach `at_least`."""
    if before is None:
        return None
    deadline = time.monotonic() + METRIC_SETTLE_S
    while True:
        after = metric(endpoint, name)
        if after is None:
            return None
        if after - before >= at_least or time.monotonic() >= deadline:
            return after - before
        time.sleep(0.2)


def comparison_evidence(comparison: RunComparison, body: dict[str, Any], solo: Completion, run: Completion) -> Evidence:
    return Evidence(
        request=excerpt(body),
        response={"solo_text": solo.text, "run_text": run.text, "solo_tokens": solo.token_ids[:24],
                  "run_tokens": run.token_ids[:24], "cached_tokens": run.cached_tokens,
                  "departure": comparison.departure.model_dump() if comparison.departure else None},
        note="; ".join(comparison.problems),
    )


def equality_phrase(comparisons: list[RunComparison], tol: Tolerances) -> str:
    """'tokens identical to the solo runs 7/8 (1 departure on a near-tie, judged by the reference), max logprob
    diff 0.11 (allowed 0.25)'."""
    n = len(comparisons)
    identical, ties, worst = tally(comparisons)
    phrase = f"tokens identical to the solo runs {identical}/{n}"
    if ties:
        judged = {c.departure.reference_source is not None for c in comparisons if c.tie and c.departure}
        by = "the reference" if judged == {True} else ("both runs' own top-k" if judged == {False} else "the reference where it could")
        phrase += (f" ({ties} departure{'s' if ties > 1 else ''} on a near-tie or where the solo run was the one off, "
                   f"judged by {by})")
    noise = [c for c in comparisons if c.drift is not None and c.drift.verdict == "noise"]
    if worst is not None:
        phrase += f", max logprob diff {worst:.2g} (allowed {tol.runs_drift.value:g}"
        phrase += f"; {len(noise)} beyond it within the reference's noise)" if noise else ")"
    return phrase


def noise_seen(comparisons: list[RunComparison]) -> dict[str, float | None]:
    """What a run of these comparisons measured, for `cookbook calibrate` (on a clean server every departure is
    noise, whatever today's tolerance calls it): the worst logprob difference over shared tokens, the largest
    reference margin at a departure, and without a reference the largest of the runs' own margins there."""
    diffs = [c.max_logprob_diff for c in comparisons if c.max_logprob_diff is not None]
    departures = [c.departure for c in comparisons if c.departure is not None]
    by_reference = [abs(d.reference_margin) for d in departures if d.reference_margin is not None]
    own = [max(d.baseline_margin or 0.0, d.run_margin or 0.0) for d in departures
           if d.reference_margin is None and d.baseline_margin is not None]
    return {"runs.max_logprob_diff": max(diffs) if diffs else None,
            "reference.tie_margin": max(by_reference) if by_reference else None,
            "runs.tie_margin": max(own) if own else None}


def solo_run_referee(ctx: CheckContext, tol: Tolerances) -> Referee:
    """The reference that judges a probe's runs against their solo runs, once the tolerances it judges by can tell a
    fault from noise; else the probe is inconclusive, with why (the served-vs-served drift or the flip noise as large
    as the fault)."""
    noisy = too_noisy(tol.runs_drift, tol.flip_noise)
    if noisy:
        raise CheckInconclusive(noisy, details={"tolerances": tol.model_dump()})
    return Referee(ctx)
