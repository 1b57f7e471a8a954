"""`batch-composition`: the same greedy prompts alone and in batches of 2, 4 and `--max-num-seqs`.

Batch shape changes the kernels, so a prompt's tokens may change on a near-tie: each run is compared with its solo
run by the kit's one rule, and a departure the reference does not call a near-tie fails.
"""
from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from ...completions import completion_body, new_salt
from ...results import Evidence
from ..kit import RunComparison, compare_traces, tolerances
from ..kit.client import PromptSource, in_parallel, sender, solo, timeout_for
from ..params import Param
from ..registry import CheckContext, CheckInconclusive, CheckOutcome, check
from ._common import (
    LAYOUT_PARAMS,
    GROUP,
    EngineLayout,
    comparison_evidence,
    engine_layout,
    equality_phrase,
    noise_seen,
    param_int,
    solo_run_referee,
)


class BatchRound(BaseModel):
    size: int
    batches: int
    overlapped: bool = Field(description="Every batch's requests were all in flight at the same time")
    changed: list[str] = Field(description="Prompts whose tokens differ from their solo run (ties included)")
    comparisons: list[RunComparison]


def batch_sizes(ctx: CheckContext, layout: EngineLayout) -> list[int]:
    wanted = ctx.params.get("batch_sizes") or [2, 4, layout.max_num_seqs]
    if isinstance(wanted, int):
        wanted = [wanted]
    sizes: list[int] = []
    for size in wanted:
        size = min(int(size), layout.max_num_seqs)
        if size >= 2 and size not in sizes:
            sizes.append(size)
    return sorted(sizes)


BATCH_PARAMS = (
    *LAYOUT_PARAMS,
    Param("batch_sizes", "int list", "2, 4 and --max-num-seqs", "batch sizes besides 1 (capped to --max-num-seqs)",
          low=1, high=65536),
    Param("batch_prompt_tokens", "int", "96", "prompt length in the model's tokens", low=1, high=100_000_000),
    Param("batch_max_tokens", "int", "the recipe's max_tokens, at most 24", "tokens each request generates", low=1,
          high=100_000),
)


@check(
    "batch-composition",
    "Batch composition: the same greedy prompts alone and in batches of 2, 4 and --max-num-seqs",
    group=GROUP,
    params=BATCH_PARAMS,
)
def batch_composition(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    tol = tolerances(ctx.recipe, ctx.params)
    sizes = batch_sizes(ctx, layout)
    details: dict[str, Any] = {"layout": layout.model_dump(), "tolerances": tol.model_dump()}
    if not sizes:
        raise CheckInconclusive(f"--max-num-seqs is {layout.max_num_seqs}: the server never batches requests", details=details)
    referee = solo_run_referee(ctx, tol)
    endpoint = ctx.endpoint
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    count = max(sizes)
    prompt_len = param_int(ctx, "batch_prompt_tokens") or 96
    max_tokens = param_int(ctx, "batch_max_tokens") or min(ctx.max_tokens, 24)
    prompts = [source.tokens(f"batch-{i}", prompt_len) for i in range(count)]
    timeout = timeout_for(ctx, (prompt_len + max_tokens) * count)
    ctx.report(f"{count} solo runs")
    solos = [solo(endpoint, p, max_tokens, timeout) for p in prompts]
    rounds: list[BatchRound] = []
    evidence: list[Evidence] = []
    for size in sizes:
        ctx.report(f"batches of {size}")
        comparisons: list[RunComparison] = []
        overlapped = True
        batches = 0
        for start in range(0, count, size):
            group = list(range(start, min(start + size, count)))
            bodies = {i: completion_body(endpoint.model, prompts[i], max_tokens, new_salt("batch")) for i in group}
            clock = time.monotonic()
            runs = in_parallel([sender(endpoint, bodies[i], timeout, clock) for i in group])
            batches += 1
            if len(group) > 1 and max(r.sent_s for r in runs) >= min(r.done_s for r in runs):
                overlapped = False
            for i, run in zip(group, runs):
                comparison = compare_traces(f"prompt {i + 1} in a batch of {size}", solos[i], run, prompts[i], referee, tol)
                comparisons.append(comparison)
                if comparison.problems:
                    evidence.append(comparison_evidence(comparison, bodies[i], solos[i], run))
        rounds.append(BatchRound(size=size, batches=batches, overlapped=overlapped, comparisons=comparisons,
                                 changed=[c.name for c in comparisons if not c.tokens_identical]))
    details["prompt_tokens"] = prompt_len
    details["max_tokens"] = max_tokens
    details["rounds"] = [r.model_dump() for r in rounds]
    details.update(referee.details())
    all_comparisons = [c for r in rounds for c in r.comparisons]
    details["noise"] = noise_seen(all_comparisons)
    equality = equality_phrase(all_comparisons, tol)
    changed = [f"{r.size}: {', '.join(c.split(' in ')[0] for c in r.changed)}" for r in rounds if r.changed]
    where = "; changed at batch size " + "; ".join(changed) if changed else ""
    not_together = [r.size for r in rounds if not r.overlapped]
    head = f"{count} prompts alone and in batches of {', '.join(str(s) for s in sizes)}"
    if not_together and not evidence:
        why = f"the requests of the batches of {not_together} were not all in flight at once: no batch was formed"
        return CheckOutcome(False, f"inconclusive: {why}", evidence, details, inconclusive=why)
    return CheckOutcome(not evidence, f"{head}: {equality}{where}", evidence, details)
