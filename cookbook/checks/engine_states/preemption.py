"""`preemption` (the `resumed-prefill-logits` and `async-discard-counter` fixes): a load larger than the KV pool.

More requests than the pool holds, each prompt ending just before a block boundary, so decoding needs blocks nobody
has; the engine preempts and resumes. `vllm:num_preemptions_total` must move, else the probe is inconclusive.
Every output is compared with its solo run by the kit's one rule.
"""
from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from ...completions import completion_body, new_salt
from ...haystack import format_tokens
from ...results import Evidence
from ..kit import RunComparison, compare_traces, tolerances
from ..kit.client import PromptSource, in_parallel, sender, solo, timeout_for
from ..params import Param
from ..registry import CheckContext, CheckInconclusive, CheckOutcome, check
from ._common import (
    LAYOUT_PARAMS,
    GROUP,
    HITS_METRIC,
    PREEMPTIONS_METRIC,
    EngineLayout,
    comparison_evidence,
    engine_layout,
    equality_phrase,
    metric,
    noise_seen,
    param_int,
    settled_delta,
    solo_run_referee,
)


class PreemptionPlan(BaseModel):
    requests: int
    prompt_tokens: int
    max_tokens: int
    blocks_per_request: int = Field(description="Blocks each request holds by its last token")
    pool_blocks: int
    offered_blocks: int


def plan_preemption(layout: EngineLayout, max_tokens: int = 32) -> PreemptionPlan | str:
    """The load that must preempt: `max_num_seqs` requests whose prompts end 8 tokens before a block boundary, so
    that decoding needs one block more each, with the pool short of their total by at least a fifth. A reason
    string when no load the server accepts can exceed its pool."""
    if not layout.block_size or not layout.kv_pool_tokens:
        return "the server's /metrics has no block size or KV pool (vllm:cache_config_info), so the load cannot be sized"
    block = layout.block_size
    pool_blocks = layout.kv_pool_tokens // block
    n = layout.max_num_seqs
    for blocks in range(1, layout.max_model_len // block + 1):
        prompt = blocks * block - 8
        per_request = -(-(prompt + max_tokens) // block)
        if prompt + max_tokens > layout.max_model_len:
            break
        if n * per_request >= pool_blocks * 1.2 and n * blocks <= pool_blocks * 4:
            return PreemptionPlan(requests=n, prompt_tokens=prompt, max_tokens=max_tokens, blocks_per_request=per_request,
                                  pool_blocks=pool_blocks, offered_blocks=n * per_request)
    return (f"the KV pool ({layout.kv_pool_tokens:,} tokens, {pool_blocks} blocks of {block}) holds {n} requests "
            f"(--max-num-seqs) of up to {format_tokens(layout.max_model_len)} tokens (the server's context): no load it "
            "accepts can make it preempt; start a server with a small pool (e.g. `cookbook verify RECIPE "
            "--launch --launch-profile engine-states`)")


class PreemptionReport(BaseModel):
    plan: PreemptionPlan
    preemptions_delta: float | None = Field(description=f"{PREEMPTIONS_METRIC} moved by this much during the load")
    hits_delta: float | None = Field(description=f"{HITS_METRIC} during the load (resumed requests may hit their own blocks)")
    seconds: float
    comparisons: list[RunComparison]
    healthy_after: bool


PREEMPTION_PARAMS = (
    *LAYOUT_PARAMS,
    Param("preemption_max_tokens", "int", "32", "tokens each request of the over-full load generates", low=1,
          high=100_000),
)


@check(
    "preemption",
    "Preemption and resumption: a load larger than the KV pool, every output vs its solo run",
    group=GROUP,
    params=PREEMPTION_PARAMS,
)
def preemption(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    tol = tolerances(ctx.recipe, ctx.params)
    plan = plan_preemption(layout, param_int(ctx, "preemption_max_tokens") or 32)
    details: dict[str, Any] = {"layout": layout.model_dump(), "tolerances": tol.model_dump()}
    if isinstance(plan, str):
        raise CheckInconclusive(plan, details=details)
    referee = solo_run_referee(ctx, tol)
    endpoint = ctx.endpoint
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    prompts = [source.tokens(f"preemption-{i}", plan.prompt_tokens) for i in range(plan.requests)]
    timeout = timeout_for(ctx, (plan.prompt_tokens + plan.max_tokens) * plan.requests)
    ctx.report(f"{plan.requests} solo runs")
    solos = [solo(endpoint, p, plan.max_tokens, timeout) for p in prompts]
    if metric(endpoint, PREEMPTIONS_METRIC) is None:
        raise CheckInconclusive(f"the server's /metrics has no {PREEMPTIONS_METRIC}: a preemption cannot be shown",
                                details=details)
    bodies = [completion_body(endpoint.model, p, plan.max_tokens, new_salt("load")) for p in prompts]
    before = metric(endpoint, PREEMPTIONS_METRIC)
    hits_before = metric(endpoint, HITS_METRIC)
    started = time.monotonic()
    ctx.report(f"{plan.requests} requests at once (to preempt)")
    runs = in_parallel([sender(endpoint, b, timeout) for b in bodies])
    seconds = time.monotonic() - started
    preempted = settled_delta(endpoint, PREEMPTIONS_METRIC, before, 1)
    hits = settled_delta(endpoint, HITS_METRIC, hits_before, 0)
    ctx.report("comparing with the solo runs")
    comparisons = [compare_traces(f"request {i + 1}", solos[i], runs[i], prompts[i], referee, tol)
                   for i in range(len(runs))]
    healthy = endpoint.healthy()
    report = PreemptionReport(plan=plan, preemptions_delta=preempted, hits_delta=hits, seconds=round(seconds, 2),
                              comparisons=comparisons, healthy_after=healthy)
    details.update(report.model_dump())
    details.update(referee.details())
    details["noise"] = noise_seen(comparisons)
    evidence = [comparison_evidence(c, bodies[i], solos[i], runs[i]) for i, c in enumerate(comparisons) if c.problems]
    if not healthy:
        evidence.append(Evidence(note="the server was unhealthy after the preempting load (/health not 200)"))
    equality = equality_phrase(comparisons, tol)
    load = (f"{plan.requests} requests of {plan.prompt_tokens} + {plan.max_tokens} tokens ({plan.offered_blocks} blocks) "
            f"on a {plan.pool_blocks}-block pool")
    if not evidence and not preempted:
        why = f"{load}, but {PREEMPTIONS_METRIC} did not move: the engine never preempted"
        return CheckOutcome(False, f"inconclusive: {why}; {equality}", evidence, details, inconclusive=why)
    count = preempted or 0.0
    result = f"{load}: {count:g} preemption{'s' if count != 1 else ''}; {equality}; healthy after"
    if not healthy:
        result = f"{load}: {count:g} preemptions; {equality}; server unhealthy after"
    return CheckOutcome(not evidence, result, evidence, details)
