"""`same-step-prefix` (the `prompt-order` fix): requests hitting prefix blocks written in their own scheduler step.

K requests sharing a prefix of several blocks are queued while a long "gate" prefill runs, so the scheduler takes
them in one step; the first of a salt writes the prefix blocks and the others of that salt hit them in the very
step they are written; one request of another fresh salt stays cold. Each is compared with its solo run by the
kit's one rule: a departure the reference calls a near-tie is the batch's numerics, not a wrong cache state.
"""
from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from ...completions import completion_body, new_salt
from ...haystack import format_tokens
from ...results import Evidence
from ..kit import Referee, RunComparison, Tolerances, compare_traces, tolerances
from ..kit.client import Gate, PromptSource, sender, solo, staggered, timeout_for
from ..params import Param
from ..registry import CheckContext, CheckInconclusive, CheckOutcome, check
from ._common import (
    LAYOUT_PARAMS,
    CPU_DEFAULT_BATCHED_TOKENS,
    GROUP,
    HITS_METRIC,
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

GATE_LEAD_S = 0.3  # how long the gate request runs alone before the burst is released
STAGGER_S = 0.05  # between burst requests queued behind the gate: they arrive in order, all within its prefill
Role = Literal["writer", "hit", "cold"]


class BurstRequest(BaseModel):
    name: str
    role: Role = Field(description="writes the shared blocks / should hit them / other salt")
    salt_group: int
    prompt_tokens: int
    cached_tokens: int | None
    sent_s: float
    done_s: float


class SameStepReport(BaseModel):
    prefix_tokens: int
    suffix_tokens: int
    gate_tokens: int
    gate_sent_s: float
    gate_first_token_s: float | None
    last_sent_s: float
    queued_margin_s: float | None = Field(description="Gate's first token minus the last burst request's send time: "
                                                      "positive means every request queued during the gate's prefill")
    step_tokens_needed: int = Field(description="Uncached tokens of the burst plus the gate's decode token")
    requests: list[BurstRequest]
    comparisons: list[RunComparison]
    hits_delta: float | None
    reached: bool
    why_not: str | None = None


def roles_as_scheduled(roles: list[Role], groups: list[int], cached: list[int | None]) -> list[Role]:
    """The writer of a salt is whichever of its requests the engine took first, which need not be the first sent
    (the API server may hand a later one to the engine earlier): when exactly one request of the writer's salt read
    nothing from the cache, it is the writer and the others of that salt are hits. Otherwise the roles stay as sent,
    so a salt whose every request read cached blocks still shows a writer that read blocks nobody had written."""
    writer_group = groups[roles.index("writer")]
    uncached = [i for i, g in enumerate(groups) if g == writer_group and not cached[i]]
    if len(uncached) != 1:
        return roles
    return [role if groups[i] != writer_group else ("writer" if i == uncached[0] else "hit")
            for i, role in enumerate(roles)]


def probe_same_step(
    ctx: CheckContext, layout: EngineLayout, tol: Tolerances, referee: Referee | None
) -> tuple[SameStepReport, list[Evidence]]:
    endpoint = ctx.endpoint
    block = layout.block_size or 16
    budget = layout.max_num_batched_tokens or CPU_DEFAULT_BATCHED_TOKENS
    suffix = 8
    # writer + two hits on salt A, one cold request on salt B, within one step's budget: 2 x (prefix + suffix) +
    # 2 x suffix (+ the hits' partial last block) + the gate's decode token.
    blocks = max(2, min(4, (budget - 4 * suffix - 1) // (2 * block)))
    prefix_tokens = blocks * block
    need = 2 * (prefix_tokens + suffix) + 2 * suffix + 1
    k = 4
    if need > budget or k + 1 > layout.max_num_seqs:
        raise CheckInconclusive(
            f"one scheduler step ({budget:,} tokens, {layout.max_num_seqs} sequences) cannot take {k} requests sharing "
            f"a prefix of at least 2 blocks of {block} ({need} tokens needed)",
            details={"layout": layout.model_dump()},
        )
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    prefix = source.tokens("same-step-prefix", prefix_tokens)
    prompts = [prefix + source.tokens(f"same-step-suffix-{i}", suffix) for i in range(k)]
    roles: list[Role] = ["writer", "hit", "cold", "hit"]
    groups = [0, 0, 1, 0]
    max_tokens = min(ctx.max_tokens, 24)
    timeout = timeout_for(ctx, prefix_tokens * k)
    ctx.report(f"{k} solo runs")
    solos = [solo(endpoint, p, max_tokens, timeout) for p in prompts]
    # The gate fills whole steps (no budget left beside it, so a burst arriving during any of them waits for the
    # step after): one by default, more with the parameter gate_steps for a server whose one-step prefill is
    # over before the burst is sent (the result says so).
    steps = max(1, param_int(ctx, "gate_steps") or 1)
    gate_tokens = min(steps * budget, (layout.max_model_len - 8) // budget * budget or layout.max_model_len - 8)
    salts = [new_salt("burst-a"), new_salt("burst-b")]
    bodies = [completion_body(endpoint.model, p, max_tokens, salts[g]) for p, g in zip(prompts, groups)]
    hits_before = metric(endpoint, HITS_METRIC)
    clock = time.monotonic()
    gate = Gate(endpoint, source.tokens("same-step-gate", gate_tokens), timeout_for(ctx, gate_tokens), clock).start()
    time.sleep(GATE_LEAD_S)
    ctx.report(f"{k} requests in one step behind a {gate_tokens:,}-token gate")
    runs = staggered([sender(endpoint, b, timeout, clock) for b in bodies], STAGGER_S)
    gate.join()
    expected_hits = sum(prefix_tokens for role in roles if role == "hit")
    hits_delta = settled_delta(endpoint, HITS_METRIC, hits_before, expected_hits)
    last_sent = max(r.sent_s for r in runs)
    first = gate.first_s
    margin = None if first is None else round(first - last_sent, 4)
    roles = roles_as_scheduled(roles, groups, [r.cached_tokens for r in runs])
    requests = [
        BurstRequest(name=f"request {i + 1}", role=roles[i], salt_group=groups[i], prompt_tokens=len(prompts[i]),
                     cached_tokens=runs[i].cached_tokens, sent_s=runs[i].sent_s, done_s=runs[i].done_s)
        for i in range(k)
    ]
    ctx.report("comparing with the solo runs")
    comparisons = [compare_traces(f"request {i + 1} ({roles[i]})", solos[i], runs[i], prompts[i], referee, tol)
                   for i in range(k)]
    why_not = None
    if margin is None:
        why_not = "the gate request's first token never came, so the burst's step cannot be told"
        if gate.error:
            why_not += f" ({gate.error})"
    elif margin <= 0:
        why_not = (f"the gate's prefill ended {-margin:.2f} s before the last burst request was sent: the burst may "
                   "have been split across steps (a faster server needs a longer gate: parameter gate_steps)")
    hits = [r for r in requests if r.role == "hit"]
    if why_not is None and not all(r.cached_tokens for r in hits):
        why_not = ("the requests meant to hit blocks written in their own step reported cached_tokens "
                   f"{[r.cached_tokens for r in hits]}: the engine did not let them read those blocks")
    report = SameStepReport(
        prefix_tokens=prefix_tokens, suffix_tokens=suffix, gate_tokens=gate_tokens,
        gate_sent_s=round(gate.sent_s or 0.0, 4), gate_first_token_s=first, last_sent_s=last_sent,
        queued_margin_s=margin, step_tokens_needed=need, requests=requests, comparisons=comparisons,
        hits_delta=hits_delta, reached=why_not is None, why_not=why_not,
    )
    evidence: list[Evidence] = []
    for i, comparison in enumerate(comparisons):
        if comparison.problems:
            evidence.append(comparison_evidence(comparison, bodies[i], solos[i], runs[i]))
    for r in requests:
        if r.role in ("writer", "cold") and r.cached_tokens:
            evidence.append(Evidence(note=f"{r.name} ({r.role}, fresh salt) reported {r.cached_tokens} cached tokens"))
        elif r.role == "hit" and r.cached_tokens and r.cached_tokens % block:
            evidence.append(Evidence(note=f"{r.name}: {r.cached_tokens} cached tokens is not a multiple of the {block}-token block"))
    return report, evidence


def _steps(gate_tokens: int, layout: EngineLayout) -> str:
    steps = max(1, gate_tokens // (layout.max_num_batched_tokens or gate_tokens))
    return "one full step" if steps == 1 else f"{steps} full steps"


SAME_STEP_PARAMS = (
    *LAYOUT_PARAMS,
    Param("gate_steps", "int", "1", "scheduler steps the gated requests are held apart", low=1, high=1000),
)


@check(
    "same-step-prefix",
    "Same-step shared prefixes: requests hitting blocks written in their own scheduler step vs solo runs",
    group=GROUP,
    params=SAME_STEP_PARAMS,
    applies=lambda ctx: "prefix caching is off in the recipe: no request can hit a block another writes"
    if ctx.recipe is not None and not ctx.recipe.prefix_caching.enabled else None,
)
def same_step_prefix(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    tol = tolerances(ctx.recipe, ctx.params)
    if layout.prefix_caching is False:
        raise CheckInconclusive("the server reports prefix caching off: no request can hit a block another writes")
    referee = solo_run_referee(ctx, tol)
    report, evidence = probe_same_step(ctx, layout, tol, referee)
    details = {"layout": layout.model_dump(), "tolerances": tol.model_dump(), **referee.details(),
               **report.model_dump()}
    details["noise"] = noise_seen(report.comparisons)
    hits = [r.cached_tokens for r in report.requests if r.role == "hit"]
    head = (f"{len(report.requests)} requests sharing a {format_tokens(report.prefix_tokens)}-token prefix, queued "
            f"behind a {format_tokens(report.gate_tokens)}-token prefill ({_steps(report.gate_tokens, layout)}) and scheduled "
            "together")
    equality = equality_phrase(report.comparisons, tol)
    failed = bool(evidence)
    if not report.reached and not failed:
        return CheckOutcome(False, f"inconclusive: {report.why_not}; {equality}", evidence, details,
                            inconclusive=report.why_not)
    result = (f"{head}: {equality}; cached tokens {[r.cached_tokens for r in report.requests]} (hits {hits} on blocks "
              f"written in that step; the other salt stayed cold); queued {report.queued_margin_s:.2f} s before the "
              "step" if report.queued_margin_s is not None else f"{head}: {equality}")
    return CheckOutcome(not failed, result, evidence, details)

