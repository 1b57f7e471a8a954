"""`chunked-prompt-logprobs` (the `prompt-logprobs` fix): `prompt_logprobs` over a prompt of several prefill chunks.

Checked at every position for shape, against the sampler's own next-token logprobs at each chunk boundary, against
another server of a different chunking when one is given, and against the model's fp32 reference; the server's
memory is sampled during the request and its health after. Where two computation paths differ by more than the
served-vs-served tolerance, the reference says whether that is the dtype's noise (both near it) or a wrong path.
"""
from __future__ import annotations

import math
import time
from typing import Any

from pydantic import BaseModel, Field

from ...completions import completion_body, excerpt, new_salt
from ...endpoint import Endpoint
from ...haystack import format_tokens
from ...reference import RefScore
from ...results import Evidence
from ..kit import Referee, Tolerances, tolerances, too_noisy
from ..kit.tolerances import MEAN_Z, PROMPT_LOGPROBS_MAX_DIFF, mean_bound
from ..kit.client import PromptSource, complete, timeout_for
from ..kit.memory import MemorySample, MemoryWatch
from ..params import Param
from ..registry import CheckContext, CheckInconclusive, CheckOutcome, check
from ._common import GROUP, LAYOUT_PARAMS, engine_layout, param_int

TOP_K = 5


class ChunkedReport(BaseModel):
    prompt_tokens: int
    chunk_tokens: int
    boundaries: list[int] = Field(description="Prompt positions where a new prefill chunk starts")
    positions_checked: int
    shape_problems: list[str]
    boundary_checks: list[dict[str, Any]] = Field(description="Per checked position: prompt-logprobs top-k vs the "
                                                              "sampler's next-token top-k of the prompt cut there")
    boundary_max_diff: float | None
    reference: dict[str, Any] | None = Field(None, description="Against another server of a different chunking, if given")
    oracle: dict[str, Any] | None = Field(None, description="Against the model's fp32 reference, if any")
    memory: MemorySample
    seconds: float
    healthy_after: bool


def prompt_shape_problems(prompt: list[int], entries: list[dict[int, float] | None] | None) -> list[str]:
    """prompt_logprobs must have one entry per prompt token, the first None, each holding its own token with a
    logprob <= 0 and finite."""
    if entries is None:
        return ["the response has no prompt_logprobs"]
    problems: list[str] = []
    if len(entries) != len(prompt):
        problems.append(f"prompt_logprobs has {len(entries)} entries for a {len(prompt)}-token prompt")
    if entries and entries[0] is not None:
        problems.append("the first prompt_logprobs entry is not null")
    missing = [i for i, (tok, entry) in enumerate(zip(prompt, entries)) if i > 0 and (entry is None or tok not in entry)]
    if missing:
        problems.append(f"{len(missing)} positions do not hold their own prompt token, first at position {missing[0]}")
    bad = [i for i, entry in enumerate(entries) if entry and any(not math.isfinite(v) or v > 1e-6 for v in entry.values())]
    if bad:
        problems.append(f"{len(bad)} positions hold a logprob that is not finite or above 0, first at position {bad[0]}")
    return problems


def chunk_boundaries(prompt_tokens: int, chunk: int) -> list[int]:
    return list(range(chunk, prompt_tokens, chunk))


def _top_k(entry: dict[int, float]) -> dict[str, float]:
    return {str(k): round(v, 5) for k, v in sorted(entry.items(), key=lambda kv: -kv[1])[: TOP_K + 1]}


def _argmax(entry: dict[int, float]) -> int | None:
    return max(entry, key=lambda t: entry[t]) if entry else None


def _boundaries(ctx: CheckContext, prompt: list[int], entries: list[dict[int, float] | None] | None, salt: str,
                boundaries: list[int], tol: Tolerances, problems: list[str]) -> tuple[list[dict[str, Any]], float | None, int]:
    """The sampler's next-token distribution of the prompt cut at p must match prompt_logprobs at position p (same
    salt, so the cut prompt reuses the cached blocks and only its tail is recomputed)."""
    endpoint = ctx.endpoint
    positions = sorted({p for b in boundaries for p in (b - 1, b, b + 1) if 0 < p < len(prompt)} | {len(prompt) - 1})
    checks: list[dict[str, Any]] = []
    worst: float | None = None
    allowed = tol.prompt_drift
    for number, position in enumerate(positions, 1):
        ctx.report(f"position {number}/{len(positions)} ({position:,})")
        cut = complete(endpoint, completion_body(endpoint.model, prompt[:position], 1, salt), timeout_for(ctx, position))
        mine = (entries[position] if entries and position < len(entries) else None) or {}
        sampler = cut.top[0] if cut.top else {}
        shared = set(mine) & set(sampler)
        diff = max((abs(mine[t] - sampler[t]) for t in shared), default=None)
        own = prompt[position]
        checks.append({"position": position, "own_token": own, "own_logprob": mine.get(own), "shared_top": len(shared),
                       "max_diff": None if diff is None else round(diff, 6), "prompt_logprobs_top": _top_k(mine),
                       "sampler_top": _top_k(sampler)})
        if diff is None:
            problems.append(f"position {position}: prompt_logprobs and the sampler's top-{TOP_K} share no token")
            continue
        worst = diff if worst is None else max(worst, diff)
        top_prompt, top_sampler = _argmax(mine), _argmax(sampler)
        if diff > allowed.value:
            problems.append(f"position {position}: prompt_logprobs differ from the sampler's next-token logprobs by "
                            f"{diff:.3g} (allowed {allowed.value:g}, {allowed.source})")
        elif top_prompt is not None and top_prompt != top_sampler:
            gap = mine[top_prompt] - mine.get(top_sampler, -math.inf) if top_sampler is not None else math.inf
            if gap > tol.runs_tie.value:
                problems.append(f"position {position}: most likely token {top_prompt} in prompt_logprobs, {top_sampler} "
                                f"for the sampler ({gap:.3g} apart, tie margin {tol.runs_tie.value:g})")
    return checks, worst, len(positions)


def _other_chunking(ctx: CheckContext, prompt: list[int], entries: list[dict[int, float] | None], tol: Tolerances,
                    scored: RefScore | None, why_none: str, problems: list[str]) -> dict[str, Any] | None:
    """The same prompt's prompt_logprobs from another server (`chunk_reference_url`: e.g. one with a larger chunk),
    compared at every position on the prompt's own token; differences beyond the tolerance judged by the reference."""
    url = ctx.params.get("chunk_reference_url")
    if not url or not entries:
        return None
    other = Endpoint(str(url), ctx.endpoint.model)
    try:
        theirs = complete(other, completion_body(other.model, prompt, 1, new_salt("chunk-ref"), prompt_logprobs=TOP_K),
                          timeout_for(ctx, len(prompt) * 2)).prompt_logprobs or []
    finally:
        other.close()
    diffs = []
    for i, tok in enumerate(prompt):
        mine, other_entry = (entries[i] if i < len(entries) else None), (theirs[i] if i < len(theirs) else None)
        if i == 0 or not mine or not other_entry:
            continue
        if tok not in mine or tok not in other_entry:
            problems.append(f"position {i}: the prompt's own token missing from one server's prompt_logprobs")
            break
        diffs.append((i, abs(mine[tok] - other_entry[tok])))
    worst = max(diffs, key=lambda d: d[1]) if diffs else None
    allowed = tol.prompt_drift
    judged = _judge_chunkings(prompt, entries, theirs, [i for i, d in diffs if d > allowed.value], tol, scored, why_none)
    if worst is not None and worst[1] > allowed.value and judged["failed"] is not False:
        where = f"; {judged['note']}" if judged["note"] else ""
        problems.append(f"position {worst[0]}: prompt logprob differs from {url} (another chunking) by {worst[1]:.3g} "
                        f"(allowed {allowed.value:g}){where}")
    return {"what": f"against {url} (another chunking) at {len(diffs)} positions",
            "max_diff": None if worst is None else round(worst[1], 6),
            "worst_position": None if worst is None else worst[0],
            "mean_diff": round(sum(d for _, d in diffs) / len(diffs), 6) if diffs else None, "allowed": allowed.value,
            "judged_by_reference": judged}


def _judge_chunkings(prompt: list[int], mine: list[dict[int, float] | None], theirs: list[dict[int, float] | None],
                     positions: list[int], tol: Tolerances, scored: RefScore | None, why_none: str) -> dict[str, Any]:
    """Both chunkings within the reference tolerance of the reference at every such position: the dtype's noise
    (both right); else one chunking is wrong. `failed`: None when no reference could judge."""
    if not positions:
        return {"failed": None, "note": "", "positions": []}
    if scored is None:
        return {"failed": None, "note": f"no reference to judge it ({why_none})", "positions": positions}
    limit = tol.reference.max_abs_delta
    rows, failed = [], False
    for i in positions:
        ref = scored.prompt[i] if i < len(scored.prompt) else None
        a, b = (mine[i] or {}).get(prompt[i]), (theirs[i] or {}).get(prompt[i])
        if ref is None or a is None or b is None:
            return {"failed": None, "note": f"the reference has no logprob at position {i}", "positions": positions}
        off = max(abs(a - ref.logprob), abs(b - ref.logprob))
        failed = failed or off > limit
        rows.append({"position": i, "this": round(a, 5), "other": round(b, 5), "reference": round(ref.logprob, 5),
                     "worst_from_reference": round(off, 5)})
    worst = max(rows, key=lambda r: r["worst_from_reference"])
    note = (f"the reference ({scored.source}) at position {worst['position']}: this {worst['this']:.3f}, the other "
            f"{worst['other']:.3f}, the reference {worst['reference']:.3f}; {'one chunking is' if failed else 'both are'} "
            f"{'more than' if failed else 'within'} {limit:g} of it ({tol.reference_from})")
    return {"failed": failed, "note": note, "positions": rows}


def against_reference(prompt: list[int], entries: list[dict[int, float] | None] | None, boundaries: list[int],
                      tol: Tolerances, scored: RefScore | None, why_none: str, problems: list[str]) -> dict[str, Any] | None:
    """The served prompt logprobs of the prompt's own tokens against the reference's at every position, with the
    worst position near a chunk boundary reported apart."""
    if scored is None:
        return {"what": f"no reference ({why_none})", "max_diff": None}
    if not entries:
        return None
    diffs: list[tuple[int, float]] = []
    for i, tok in enumerate(prompt):
        mine = entries[i] if i < len(entries) else None
        theirs = scored.prompt[i] if i < len(scored.prompt) else None
        if i == 0 or not mine or theirs is None or tok not in mine:
            continue
        diffs.append((i, abs(mine[tok] - theirs.logprob)))
    if not diffs:
        return {"what": f"the reference ({scored.source}) scored no position", "max_diff": None}
    worst = max(diffs, key=lambda d: d[1])
    mean = sum(d for _, d in diffs) / len(diffs)
    near = [d for d in diffs if any(abs(d[0] - b) <= 2 for b in boundaries)]
    near_worst = max((d for _, d in near), default=None)
    ref_tol = tol.reference
    if worst[1] > ref_tol.max_abs_delta:
        problems.append(f"position {worst[0]}: prompt logprob {worst[1]:.3g} from the reference's "
                        f"(allowed {ref_tol.max_abs_delta:g}, {tol.reference_from})")
    mean_allowed = mean_bound(ref_tol.mean_abs_delta, [d for _, d in diffs])
    if mean > mean_allowed:
        problems.append(f"prompt logprobs {mean:.3g} from the reference's on average (allowed {mean_allowed:.3g}: "
                        f"{ref_tol.mean_abs_delta:g}, {tol.reference_from}, plus {MEAN_Z:g} standard errors over "
                        f"{len(diffs)} positions)")
    return {"what": f"against the reference ({scored.source}) at {len(diffs)} positions", "max_diff": round(worst[1], 6),
            "worst_position": worst[0], "mean_diff": round(mean, 6),
            "near_boundaries_max_diff": None if near_worst is None else round(near_worst, 6),
            "allowed": ref_tol.max_abs_delta, "allowed_mean": round(mean_allowed, 6), "tolerances": tol.reference_from}


CHUNKED_PARAMS = (
    *LAYOUT_PARAMS,
    Param("chunked_prompt_tokens", "int", "three and a half prefill chunks, capped to the context",
          "prompt length in the model's tokens", low=1, high=100_000_000),
    Param("chunk_reference_url", "text", "none", "another server (e.g. one with a larger chunk) whose prompt_logprobs "
          "the same prompt is compared with"),
    PROMPT_LOGPROBS_MAX_DIFF,
)


@check(
    "chunked-prompt-logprobs",
    "Chunked prefill: `prompt_logprobs` over a prompt of several prefill chunks; memory during it; healthy after",
    group=GROUP,
    params=CHUNKED_PARAMS,
)
def chunked_prompt_logprobs(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    tol = tolerances(ctx.recipe, ctx.params)
    details: dict[str, Any] = {"layout": layout.model_dump(), "tolerances": tol.model_dump()}
    chunk = layout.max_num_batched_tokens
    if not chunk:
        raise CheckInconclusive("the server's --max-num-batched-tokens (its prefill chunk) is unknown: pass it as the "
                                "check parameter max_num_batched_tokens", details=details)
    longest = layout.max_model_len - 1
    wanted = param_int(ctx, "chunked_prompt_tokens") or min(longest, 3 * chunk + chunk // 2)
    prompt_len = min(wanted, longest)
    if prompt_len <= chunk:
        raise CheckInconclusive(f"the longest prompt this server takes ({format_tokens(longest)} tokens) fits in one "
                                f"prefill chunk of {chunk:,} tokens: no chunk boundary to cross", details=details)
    noisy = too_noisy(tol.prompt_drift)
    if noisy:
        raise CheckInconclusive(noisy, details={"tolerances": tol.model_dump()})
    endpoint = ctx.endpoint
    prompt = PromptSource(endpoint, ctx.params.get("seed") or 0).tokens("chunked-prompt", prompt_len)
    salt = new_salt("chunked")
    body = completion_body(endpoint.model, prompt, 1, salt, prompt_logprobs=TOP_K)
    started = time.monotonic()
    with MemoryWatch(endpoint) as watch:
        full = complete(endpoint, body, timeout_for(ctx, prompt_len * 2))
    seconds = time.monotonic() - started
    memory = watch.sample()
    entries = full.prompt_logprobs
    problems = prompt_shape_problems(prompt, entries)
    boundaries = chunk_boundaries(prompt_len, chunk)
    checks, worst, checked = _boundaries(ctx, prompt, entries, salt, boundaries, tol, problems)
    referee = Referee(ctx)
    ctx.report("the reference's prompt logprobs")
    scored = referee.score(prompt)
    reference = _other_chunking(ctx, prompt, entries or [], tol, scored, referee.why_none, problems)
    oracle = against_reference(prompt, entries, boundaries, tol, scored, referee.why_none, problems)
    healthy = endpoint.healthy()
    if not healthy:
        problems.append("the server was unhealthy after the prompt_logprobs request (/health not 200)")
    report = ChunkedReport(prompt_tokens=prompt_len, chunk_tokens=chunk, boundaries=boundaries, positions_checked=checked,
                           shape_problems=prompt_shape_problems(prompt, entries), boundary_checks=checks,
                           boundary_max_diff=None if worst is None else round(worst, 6), reference=reference,
                           oracle=oracle, memory=memory, seconds=round(seconds, 2), healthy_after=healthy)
    details.update(report.model_dump())
    details.update(referee.details())
    details["noise"] = {"prompt_logprobs.max_diff": report.boundary_max_diff,
                        "reference.max_abs_delta": (oracle or {}).get("max_diff"),
                        "reference.mean_abs_delta": (oracle or {}).get("mean_diff")}
    evidence = [Evidence(request=excerpt(body), note=p) for p in problems[:6]]
    memory_text = (f"server memory {memory.before_mib:,.0f} MiB before, peak {memory.peak_mib:,.0f} MiB during "
                   f"({memory.source})" if memory.peak_mib is not None and memory.before_mib is not None
                   else "server memory not measured")
    compared = "; ".join(
        f"{r['what']}: max diff {r['max_diff']:.2g}, mean {r['mean_diff']:.2g}" for r in (oracle, reference)
        if r and r.get("max_diff") is not None
    ) or f"not compared with another chunking or the reference ({(oracle or {}).get('what', 'no chunk_reference_url')})"
    result = (f"{format_tokens(prompt_len)}-token prompt in {len(boundaries) + 1} chunks of {chunk:,}: "
              f"{len(entries or [])} prompt_logprobs entries, each holding its own token; at {checked} positions "
              f"around the chunk boundaries within {worst if worst is not None else float('nan'):.2g} of the sampler's "
              f"next-token logprobs; {compared}; {memory_text}; {'healthy after' if healthy else 'unhealthy after'}")
    return CheckOutcome(not problems, result, evidence, details)
