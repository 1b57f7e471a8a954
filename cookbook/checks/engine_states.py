"""Probes that drive the engine into the states behind the v0.26.0 fixes, and compare what comes out with a solo
cold run of the same request (group `engine-states`).

The rest of the suite sends its requests one after another or merely together; several fixes of the v0.26.0 profile
exist for states that only a deliberate load reaches:

- `same-step-prefix` (`prompt-order`): K requests sharing a prefix of several blocks are queued while a long "gate"
  prefill runs, so the scheduler takes them in one step; the first of a salt writes the prefix blocks and the
  others of that salt hit them in the very step they are written; one request of another fresh salt stays cold.
- `preemption` (`resumed-prefill-logits`, `async-discard-counter`): more requests than the KV pool holds, each
  prompt ending just before a block boundary, so decoding needs blocks nobody has; the engine preempts and resumes.
  `vllm:num_preemptions_total` must move, else the probe is inconclusive.
- `chunked-prompt-logprobs` (`prompt-logprobs`): `prompt_logprobs` over a prompt spanning several prefill chunks
  (`--max-num-batched-tokens`), checked at every position, against the sampler's own next-token logprobs at each
  chunk boundary, against another server of a different chunking when one is given, with the server's memory
  sampled during the request and its health after.
- `batch-composition`: the same greedy prompts in batches of 1, 2, 4 and `--max-num-seqs`; batch shape changes the
  kernels, so a prompt whose tokens change is reported at its first differing token with both runs' top-k.

Every comparison is token by token on `/v1/completions` with token-id prompts (so lengths and shared prefixes are
exact), greedy, `logprobs: 5`. A first differing token is a tie (not a fail) only when both candidates are within
the recipe's `tie_margin` of each other in both runs; with a reference (the oracle) where one is available, the
reference judges instead. A probe that could not bring the engine into its state says "inconclusive" with why.
"""
from __future__ import annotations

import math
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Literal

import httpx2
from pydantic import BaseModel, Field

from ..endpoint import Endpoint, kv_pool_from_metrics, metric_value
from ..errors import CookbookError, RequestFailed, ServerDown, ServerError
from ..haystack import filler_text, format_tokens, server_max_model_len
from ..results import Evidence
from .prefix_cache import DEFAULT_TOLERANCE, DTYPE_TOLERANCE, server_cache_config
from .registry import CheckContext, CheckFailed, CheckInconclusive, CheckOutcome, check

GROUP = "engine-states"
TOP_K = 5
PREEMPTIONS_METRIC = "vllm:num_preemptions_total"
HITS_METRIC = "vllm:prefix_cache_hits_total"
# vLLM 0.32's default --max-num-batched-tokens for the OpenAI server on CPU (vllm/engine/arg_utils.py); a recipe's
# or a launch override's flag wins.
CPU_DEFAULT_BATCHED_TOKENS = 2048
DEFAULT_TIE_MARGIN = 0.0
DEFAULT_MAX_LOGPROB_DIFF = 0.0
GATE_LEAD_S = 0.3  # how long the gate request runs alone before the burst is released
STAGGER_S = 0.05  # between burst requests queued behind the gate: they arrive in order, all within its prefill
METRIC_SETTLE_S = 3.0


# -- the layout of the server under test ---------------------------------------------------------------------------


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
    seqs: Any = ctx.params.get("max_num_seqs")
    if seqs is not None:
        sources["max_num_seqs"] = "check parameter"
    else:
        found = _flag(ctx, "max-num-seqs")
        seqs, sources["max_num_seqs"] = found if found else (ctx.concurrency, "default")
    batched: Any = ctx.params.get("max_num_batched_tokens")
    if batched is not None:
        sources["max_num_batched_tokens"] = "check parameter"
    else:
        found = _flag(ctx, "max-num-batched-tokens")
        if found:
            batched, sources["max_num_batched_tokens"] = found
        elif ctx.recipe is not None and ctx.recipe.image.kind == "vllm-cpu":
            batched, sources["max_num_batched_tokens"] = CPU_DEFAULT_BATCHED_TOKENS, "vLLM 0.32's CPU default"
        else:
            sources["max_num_batched_tokens"] = "unknown"
    return EngineLayout(
        block_size=block_size,
        kv_pool_tokens=pool,
        prefix_caching=caching,
        max_model_len=server_max_model_len(ctx.endpoint),
        max_num_seqs=int(seqs),
        max_num_batched_tokens=int(batched) if batched is not None else None,
        sources=sources,
    )


class Expectation(BaseModel):
    """How far a run may sit from its solo run: the recipe's verification.engine_states, else the served dtype's."""

    max_logprob_diff: float = DEFAULT_MAX_LOGPROB_DIFF
    tie_margin: float = DEFAULT_TIE_MARGIN
    prompt_logprobs_max_diff: float = DEFAULT_MAX_LOGPROB_DIFF
    source: str = "strict (bit-identical, no ties)"


def expectation(ctx: CheckContext) -> Expectation:
    """A recipe that says nothing gets its dtype's tolerance for all three, as the prefix-cache probe does: batch
    shape, a resumed prefill and a chunk boundary change the kernels, so bit-identity is a claim a recipe opts into
    (a fresh recipe for the tiny Gemma 3 failed three probes on the clean server by 1e-6 to 0.0078 under strict
    defaults). A recipe's value, then a check parameter, wins per field."""
    settings = getattr(ctx.recipe.verification, "engine_states", None) if ctx.recipe else None
    dtype = str(ctx.recipe.precision.dtype).lower() if ctx.recipe else "unknown"
    fallback = DTYPE_TOLERANCE.get(dtype, DEFAULT_TOLERANCE)
    keys = ("max_logprob_diff", "tie_margin", "prompt_logprobs_max_diff")
    values: dict[str, Any] = {key: fallback for key in keys}
    sources = {key: f"{dtype} default" for key in keys}
    for key in keys:
        recipe_value = getattr(settings, key, None) if settings is not None else None
        if recipe_value is not None:
            values[key], sources[key] = float(recipe_value), "recipe verification.engine_states"
        if ctx.params.get(key) is not None:
            values[key], sources[key] = float(ctx.params[key]), "check parameter"
    distinct = sorted(set(sources.values()))
    source = distinct[0] if len(distinct) == 1 else ", ".join(f"{k} from {sources[k]}" for k in keys)
    if source == f"{dtype} default":
        source = f"no tolerances in the recipe: the {dtype} default {fallback:g} (as the prefix-cache probe's)"
    return Expectation(**values, source=source)


# -- one request ---------------------------------------------------------------------------------------------------


class Completion(BaseModel):
    """One greedy /v1/completions answer, token by token."""

    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list, description="The chosen token's logprob at each step")
    top: list[dict[int, float]] = Field(default_factory=list, description="Top-k token id -> logprob at each step")
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = Field(
        None, description="Per prompt position: its own token and the top-k (first None), when asked for"
    )
    sent_s: float = Field(0.0, description="When it was sent, seconds from the probe's clock start")
    done_s: float = Field(0.0, description="When the whole answer was back, same clock")


def _token_id(text: str) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) as 123."""
    head, _, number = str(text).partition(":")
    if head != "token_id" or not number.lstrip("-").isdigit():
        raise ServerError(f"/v1/completions: expected 'token_id:N' tokens (return_tokens_as_token_ids), got {text!r}")
    return int(number)


def completion_body(
    endpoint: Endpoint,
    prompt_ids: list[int],
    salt: str,
    max_tokens: int,
    prompt_logprobs: int | None = None,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": endpoint.model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": TOP_K,
        "cache_salt": salt,
        "return_tokens_as_token_ids": True,
        "ignore_eos": ignore_eos,
    }
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return body


def parse_completion(data: dict[str, Any]) -> Completion:
    choice = (data.get("choices") or [{}])[0]
    lp = choice.get("logprobs") or {}
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt_lp = choice.get("prompt_logprobs", data.get("prompt_logprobs"))
    parsed_prompt: list[dict[int, float] | None] | None = None
    if prompt_lp is not None:
        parsed_prompt = []
        for entry in prompt_lp:
            if entry is None:
                parsed_prompt.append(None)
                continue
            parsed_prompt.append({_prompt_key(k): float(v["logprob"] if isinstance(v, dict) else v) for k, v in entry.items()})
    return Completion(
        token_ids=[_token_id(t) for t in lp.get("tokens") or []],
        logprobs=[float(x) if x is not None else -math.inf for x in lp.get("token_logprobs") or []],
        top=[{_token_id(k): float(v) for k, v in (step or {}).items()} for step in lp.get("top_logprobs") or []],
        text=choice.get("text") or "",
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        finish_reason=choice.get("finish_reason"),
        prompt_logprobs=parsed_prompt,
    )


def _prompt_key(key: str) -> int:
    return _token_id(key) if str(key).startswith("token_id:") else int(key)


def complete(endpoint: Endpoint, body: dict[str, Any], timeout_s: float, clock: float | None = None) -> Completion:
    """Send one non-streamed completion; times are seconds since `clock` (monotonic) when given."""
    origin = clock if clock is not None else time.monotonic()
    sent = time.monotonic() - origin
    try:
        data = endpoint.post("/v1/completions", body, timeout_s)
    except RequestFailed as exc:
        if exc.status_code is None:
            raise
        raise CheckFailed(
            f"HTTP {exc.status_code} from /v1/completions",
            [Evidence(request=_excerpt(body), response={"status": exc.status_code, "body": exc.body[:300]},
                      note=f"HTTP {exc.status_code}: {exc.body[:200]}")],
        ) from None
    result = parse_completion(data)
    result.sent_s = round(sent, 4)
    result.done_s = round(time.monotonic() - origin, 4)
    return result


def _excerpt(body: dict[str, Any]) -> dict[str, Any]:
    """A request as evidence: a token-id prompt shown as its length and ends."""
    shown = dict(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 16:
        shown["prompt"] = f"[{len(prompt)} token ids: {prompt[:6]} ... {prompt[-6:]}]"
    return shown


def in_parallel(calls: list[Callable[[], Completion]]) -> list[Completion]:
    """Run the calls on threads released together; the first error is raised after all have ended."""
    results: list[Completion | None] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls)) if calls else None

    def run(index: int) -> None:
        try:
            assert start is not None
            start.wait(timeout=30)
            results[index] = calls[index]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def staggered(calls: list[Callable[[], Completion]], gap_s: float) -> list[Completion]:
    """Like `in_parallel`, but started `gap_s` apart, so the server receives them in this order."""
    delayed = [lambda call=call, i=i: (time.sleep(i * gap_s), call())[1] for i, call in enumerate(calls)]
    return in_parallel(delayed)


def new_salt(tag: str = "states") -> str:
    return f"cookbook-{tag}-{uuid.uuid4().hex}"


class PromptSource:
    """Token-id prompts from the project's generated filler, tokenized once by the server under test; prompt `n`
    of a seed is the same for the same server."""

    def __init__(self, endpoint: Endpoint, seed: int | str = 0) -> None:
        self.endpoint = endpoint
        self.seed = seed
        self._cache: dict[str, list[int]] = {}

    def tokens(self, name: str, count: int) -> list[int]:
        key = f"{self.seed}:{name}"
        ids = self._cache.get(key, [])
        sentences = max(16, count // 8)
        while len(ids) < count:
            ids = self.endpoint.tokenize(filler_text(f"engine-states:{key}", sentences))
            sentences *= 2
        self._cache[key] = ids
        return ids[:count]


# -- comparing a run with its solo run -----------------------------------------------------------------------------


class Divergence(BaseModel):
    """The first token where a run left its solo run, with both runs' top-k there."""

    position: int = Field(description="0-based index in the generated tokens")
    solo_token: int
    run_token: int
    solo_top: dict[int, float]
    run_top: dict[int, float]
    margin: float | None = Field(description="|logprob(solo token) - logprob(run token)| in the solo run; None if "
                                             "the run's token is not in the solo's top-k")
    verdict: Literal["tie", "fail"]
    judged_by: str = Field(description="The recipe's tie margin, or the reference that judged it")


class RunComparison(BaseModel):
    """One request's run in a state against its solo cold run."""

    name: str
    tokens_identical: bool
    compared_tokens: int = Field(description="Leading tokens both runs share; their logprobs were compared")
    max_logprob_diff: float | None
    divergence: Divergence | None = None
    problems: list[str] = Field(default_factory=list)


Judge = Callable[[list[int], int, int], tuple[Literal["tie", "fail"], str] | None]


def first_divergence(
    solo: Completion,
    run: Completion,
    tie_margin: float,
    judge: Judge | None = None,
    prompt: list[int] | None = None,
    drift: float = 0.0,
    judge_margin: float = math.inf,
) -> Divergence | None:
    """Where `run` first took another token than `solo`; a tie when both candidates were within `tie_margin` of
    each other in the solo run's top-k and at most `tie_margin + drift` apart in the run's (or when `judge`, the
    reference, says so: it is asked only when the solo run had the two within `judge_margin`; a flip to a token
    further below in the solo run's own top-k, or outside it, fails without it)."""
    for index, (a, b) in enumerate(zip(solo.token_ids, run.token_ids)):
        if a == b:
            continue
        solo_top = solo.top[index] if index < len(solo.top) else {}
        run_top = run.top[index] if index < len(run.top) else {}
        margin = abs(solo_top[a] - solo_top[b]) if a in solo_top and b in solo_top else None
        run_margin = abs(run_top[a] - run_top[b]) if a in run_top and b in run_top else None
        # A tie: the solo run had the two within the margin, and the run moved them by no more than the allowed
        # logprob drift on top of it.
        verdict: Literal["tie", "fail"] = (
            "tie" if margin is not None and run_margin is not None and margin <= tie_margin
            and run_margin <= tie_margin + drift else "fail"
        )
        judged_by = f"tie margin {tie_margin:g} in the solo run's top-{TOP_K}"
        if judge is not None and prompt is not None and margin is not None and margin <= judge_margin:
            judged = judge(prompt + solo.token_ids[:index], a, b)
            if judged is not None:
                verdict, judged_by = judged
        return Divergence(position=index, solo_token=a, run_token=b, solo_top=solo_top, run_top=run_top,
                          margin=None if margin is None else round(margin, 5), verdict=verdict, judged_by=judged_by)
    return None


def compare_runs(
    name: str,
    solo: Completion,
    run: Completion,
    expect: Expectation,
    judge: Judge | None = None,
    prompt: list[int] | None = None,
) -> RunComparison:
    shared = 0
    for a, b in zip(solo.token_ids, run.token_ids):
        if a != b:
            break
        shared += 1
    diffs = [abs(x - y) for x, y in zip(solo.logprobs[:shared], run.logprobs[:shared])]
    worst = max(diffs) if diffs else None
    comparison = RunComparison(
        name=name,
        tokens_identical=bool(solo.token_ids) and solo.token_ids == run.token_ids,
        compared_tokens=shared,
        max_logprob_diff=None if worst is None else round(worst, 6),
    )
    if not solo.token_ids or not run.token_ids:
        comparison.problems.append(f"{name}: no generated tokens to compare (solo {len(solo.token_ids)}, run {len(run.token_ids)})")
        return comparison
    if len(solo.token_ids) != len(run.token_ids) and shared == min(len(solo.token_ids), len(run.token_ids)):
        comparison.problems.append(
            f"{name}: {len(run.token_ids)} tokens generated, the solo run {len(solo.token_ids)} (same max_tokens, ignore_eos)"
        )
    divergence = first_divergence(solo, run, expect.tie_margin, judge, prompt, expect.max_logprob_diff,
                                  getattr(judge, "margin", math.inf))
    comparison.divergence = divergence
    if divergence is not None and divergence.verdict == "fail":
        margin = f"{divergence.margin:.3g}" if divergence.margin is not None else "not in the solo's top-k"
        comparison.problems.append(
            f"{name}: token {divergence.position} is {divergence.run_token}, the solo run's {divergence.solo_token} "
            f"(margin in the solo run {margin}; {divergence.judged_by}); solo top-{TOP_K} {_top(divergence.solo_top)}, "
            f"run top-{TOP_K} {_top(divergence.run_top)}"
        )
    if worst is not None and worst > expect.max_logprob_diff:
        comparison.problems.append(
            f"{name}: logprobs differ from the solo run by {worst:.3g} over the {shared} shared tokens "
            f"(allowed {expect.max_logprob_diff:g})"
        )
    return comparison


def _top(top: dict[int, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(top.items(), key=lambda kv: -kv[1])) + "}"


def _comparison_evidence(comparison: RunComparison, body: dict[str, Any], solo: Completion, run: Completion) -> Evidence:
    return Evidence(
        request=_excerpt(body),
        response={"solo_text": solo.text, "run_text": run.text, "solo_tokens": solo.token_ids[:24],
                  "run_tokens": run.token_ids[:24], "cached_tokens": run.cached_tokens},
        note="; ".join(comparison.problems),
    )


def _tally(comparisons: list[RunComparison]) -> tuple[int, int, float | None]:
    identical = sum(c.tokens_identical for c in comparisons)
    ties = sum(1 for c in comparisons if c.divergence is not None and c.divergence.verdict == "tie")
    diffs = [c.max_logprob_diff for c in comparisons if c.max_logprob_diff is not None]
    return identical, ties, max(diffs) if diffs else None


def _equality_phrase(comparisons: list[RunComparison], expect: Expectation) -> str:
    n = len(comparisons)
    identical, ties, worst = _tally(comparisons)
    phrase = f"tokens identical to the solo runs {identical}/{n}"
    if ties:
        phrase += f" ({ties} near-tie flip{'s' if ties > 1 else ''} within {expect.tie_margin:g})"
    if worst is not None:
        phrase += f", max logprob diff {worst:.2g} (allowed {expect.max_logprob_diff:g})"
    return phrase


def _metric(endpoint: Endpoint, name: str) -> float | None:
    try:
        metrics = endpoint.metrics()
    except ServerDown:
        raise
    except CookbookError:
        return None
    value = metric_value(metrics, name, model_name=endpoint.model)
    return value if value is not None else metric_value(metrics, name)


def _settled_delta(endpoint: Endpoint, name: str, before: float | None, at_least: float) -> float | None:
    """How far a counter moved since `before`, waiting briefly for it to reach `at_least`."""
    if before is None:
        return None
    deadline = time.monotonic() + METRIC_SETTLE_S
    while True:
        after = _metric(endpoint, name)
        if after is None:
            return None
        if after - before >= at_least or time.monotonic() >= deadline:
            return after - before
        time.sleep(0.2)


def _param_int(ctx: CheckContext, key: str) -> int | None:
    """An integer check parameter; `--param` turns a plural-looking key into a one-element list."""
    value = ctx.params.get(key)
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return int(value) if value is not None else None


def _timeout(ctx: CheckContext, tokens: int) -> float:
    return ctx.request_timeout_s + tokens * 0.02


# -- 1. same-step shared prefixes ----------------------------------------------------------------------------------


class BurstRequest(BaseModel):
    name: str
    role: Literal["writer", "hit", "cold"] = Field(description="writes the shared blocks / should hit them / other salt")
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


def _gate(endpoint: Endpoint, prompt: list[int], timeout_s: float, clock: float, out: dict[str, float | None]) -> None:
    """A streamed cold request whose long prefill holds the engine while the burst queues; records when it was
    sent and when its first token came (the end of its prefill step)."""
    body = completion_body(endpoint, prompt, new_salt("gate"), 2)
    body["stream"] = True
    out["sent"] = time.monotonic() - clock
    out["first"] = None
    try:
        with endpoint.http().stream("POST", "/v1/completions", json=body, timeout=timeout_s) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and out["first"] is None:
                    out["first"] = time.monotonic() - clock
    except httpx2.HTTPError:  # the gate only holds the engine; its own answer does not matter
        out["first"] = None


def probe_same_step(
    ctx: CheckContext, layout: EngineLayout, expect: Expectation, judge: Judge | None = None
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
    tails = [source.tokens(f"same-step-suffix-{i}", suffix) for i in range(k)]
    prompts = [prefix + tail for tail in tails]
    roles: list[Literal["writer", "hit", "cold"]] = ["writer", "hit", "cold", "hit"]
    groups = [0, 0, 1, 0]
    max_tokens = min(ctx.max_tokens, 24)
    timeout = _timeout(ctx, prefix_tokens * k)
    ctx.report(f"{k} solo runs")
    solos = [complete(endpoint, completion_body(endpoint, p, new_salt("solo"), max_tokens), timeout) for p in prompts]
    # The gate fills whole steps (no budget left beside it, so a burst arriving during any of them waits for the
    # step after): one by default, more with the parameter gate_steps for a server whose one-step prefill is
    # over before the burst is sent (the result says so).
    steps = max(1, _param_int(ctx, "gate_steps") or 1)
    gate_tokens = min(steps * budget, (layout.max_model_len - 8) // budget * budget or layout.max_model_len - 8)
    gate_prompt = source.tokens("same-step-gate", gate_tokens)
    salts = [new_salt("burst-a"), new_salt("burst-b")]
    bodies = [completion_body(endpoint, p, salts[g], max_tokens) for p, g in zip(prompts, groups)]
    hits_before = _metric(endpoint, HITS_METRIC)
    clock = time.monotonic()
    gate: dict[str, float | None] = {}
    gate_thread = threading.Thread(target=_gate, args=(endpoint, gate_prompt, _timeout(ctx, gate_tokens), clock, gate),
                                   daemon=True)
    gate_thread.start()
    time.sleep(GATE_LEAD_S)
    ctx.report(f"{k} requests in one step behind a {gate_tokens:,}-token gate")
    runs = staggered([lambda b=b: complete(endpoint, b, timeout, clock) for b in bodies], STAGGER_S)
    gate_thread.join(timeout=_timeout(ctx, gate_tokens))
    expected_hits = sum(prefix_tokens for role in roles if role == "hit")
    hits_delta = _settled_delta(endpoint, HITS_METRIC, hits_before, expected_hits)
    last_sent = max(r.sent_s for r in runs)
    first = gate.get("first")
    margin = None if first is None else round(first - last_sent, 4)
    roles = _roles_as_scheduled(roles, groups, [r.cached_tokens for r in runs])
    requests = [
        BurstRequest(name=f"request {i + 1}", role=roles[i], salt_group=groups[i], prompt_tokens=len(prompts[i]),
                     cached_tokens=runs[i].cached_tokens, sent_s=runs[i].sent_s, done_s=runs[i].done_s)
        for i in range(k)
    ]
    comparisons = [
        compare_runs(f"request {i + 1} ({roles[i]})", solos[i], runs[i], expect, judge, prompts[i]) for i in range(k)
    ]
    why_not = None
    if margin is None:
        why_not = "the gate request's first token never came, so the burst's step cannot be told"
    elif margin <= 0:
        why_not = (f"the gate's prefill ended {-margin:.2f} s before the last burst request was sent: the burst may "
                   "have been split across steps (a faster server needs a longer gate: parameter gate_steps)")
    hits = [r for r in requests if r.role == "hit"]
    if why_not is None and not all(r.cached_tokens for r in hits):
        why_not = ("the requests meant to hit blocks written in their own step reported cached_tokens "
                   f"{[r.cached_tokens for r in hits]}: the engine did not let them read those blocks")
    report = SameStepReport(
        prefix_tokens=prefix_tokens, suffix_tokens=suffix, gate_tokens=gate_tokens,
        gate_sent_s=round(gate.get("sent") or 0.0, 4), gate_first_token_s=first, last_sent_s=last_sent,
        queued_margin_s=margin, step_tokens_needed=need, requests=requests, comparisons=comparisons,
        hits_delta=hits_delta, reached=why_not is None, why_not=why_not,
    )
    evidence: list[Evidence] = []
    for i, comparison in enumerate(comparisons):
        if comparison.problems:
            evidence.append(_comparison_evidence(comparison, bodies[i], solos[i], runs[i]))
    for r in requests:
        if r.role in ("writer", "cold") and r.cached_tokens:
            evidence.append(Evidence(note=f"{r.name} ({r.role}, fresh salt) reported {r.cached_tokens} cached tokens"))
        elif r.role == "hit" and r.cached_tokens and r.cached_tokens % block:
            evidence.append(Evidence(note=f"{r.name}: {r.cached_tokens} cached tokens is not a multiple of the {block}-token block"))
    return report, evidence


def _roles_as_scheduled(roles: list[Literal["writer", "hit", "cold"]], groups: list[int],
                        cached: list[int | None]) -> list[Literal["writer", "hit", "cold"]]:
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


def _steps(gate_tokens: int, layout: EngineLayout) -> str:
    steps = max(1, gate_tokens // (layout.max_num_batched_tokens or gate_tokens))
    return "one full step" if steps == 1 else f"{steps} full steps"


@check(
    "same-step-prefix",
    "Same-step shared prefixes: requests hitting blocks written in their own scheduler step vs solo runs",
    group=GROUP,
    applies=lambda ctx: "prefix caching is off in the recipe: no request can hit a block another writes"
    if ctx.recipe is not None and not ctx.recipe.prefix_caching.enabled else None,
)
def same_step_prefix(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    expect = expectation(ctx)
    if layout.prefix_caching is False:
        raise CheckInconclusive("the server reports prefix caching off: no request can hit a block another writes")
    judge, judge_source = reference_judge(ctx, expect)
    report, evidence = probe_same_step(ctx, layout, expect, judge)
    details = {"layout": layout.model_dump(), "expectation": expect.model_dump(), "judge": judge_source,
               **report.model_dump()}
    hits = [r.cached_tokens for r in report.requests if r.role == "hit"]
    head = (f"{len(report.requests)} requests sharing a {format_tokens(report.prefix_tokens)}-token prefix, queued "
            f"behind a {format_tokens(report.gate_tokens)}-token prefill ({_steps(report.gate_tokens, layout)}) and scheduled "
            "together")
    equality = _equality_phrase(report.comparisons, expect)
    failed = bool(evidence)
    if not report.reached and not failed:
        return CheckOutcome(False, f"inconclusive: {report.why_not}; {equality}", evidence, details,
                            inconclusive=report.why_not)
    result = (f"{head}: {equality}; cached tokens {[r.cached_tokens for r in report.requests]} (hits {hits} on blocks "
              f"written in that step; the other salt stayed cold); queued {report.queued_margin_s:.2f} s before the "
              "step" if report.queued_margin_s is not None else f"{head}: {equality}")
    return CheckOutcome(not failed, result, evidence, details)


# -- 2. preemption and resumption ----------------------------------------------------------------------------------


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


@check(
    "preemption",
    "Preemption and resumption: a load larger than the KV pool, every output vs its solo run",
    group=GROUP,
)
def preemption(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    expect = expectation(ctx)
    plan = plan_preemption(layout, _param_int(ctx, "preemption_max_tokens") or 32)
    details: dict[str, Any] = {"layout": layout.model_dump(), "expectation": expect.model_dump()}
    if isinstance(plan, str):
        raise CheckInconclusive(plan, details=details)
    judge, judge_source = reference_judge(ctx, expect)
    details["judge"] = judge_source
    endpoint = ctx.endpoint
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    prompts = [source.tokens(f"preemption-{i}", plan.prompt_tokens) for i in range(plan.requests)]
    timeout = _timeout(ctx, (plan.prompt_tokens + plan.max_tokens) * plan.requests)
    ctx.report(f"{plan.requests} solo runs")
    solos = [complete(endpoint, completion_body(endpoint, p, new_salt("solo"), plan.max_tokens), timeout) for p in prompts]
    if _metric(endpoint, PREEMPTIONS_METRIC) is None:
        raise CheckInconclusive(f"the server's /metrics has no {PREEMPTIONS_METRIC}: a preemption cannot be shown",
                                details=details)
    bodies = [completion_body(endpoint, p, new_salt("load"), plan.max_tokens) for p in prompts]
    before = _metric(endpoint, PREEMPTIONS_METRIC)
    hits_before = _metric(endpoint, HITS_METRIC)
    started = time.monotonic()
    ctx.report(f"{plan.requests} requests at once (to preempt)")
    runs = in_parallel([lambda b=b: complete(endpoint, b, timeout) for b in bodies])
    seconds = time.monotonic() - started
    preempted = _settled_delta(endpoint, PREEMPTIONS_METRIC, before, 1)
    hits = _settled_delta(endpoint, HITS_METRIC, hits_before, 0)
    comparisons = [compare_runs(f"request {i + 1}", solos[i], runs[i], expect, judge, prompts[i]) for i in range(len(runs))]
    healthy = endpoint.healthy()
    report = PreemptionReport(plan=plan, preemptions_delta=preempted, hits_delta=hits, seconds=round(seconds, 2),
                              comparisons=comparisons, healthy_after=healthy)
    details.update(report.model_dump())
    evidence = [_comparison_evidence(c, bodies[i], solos[i], runs[i]) for i, c in enumerate(comparisons) if c.problems]
    if not healthy:
        evidence.append(Evidence(note="the server was unhealthy after the preempting load (/health not 200)"))
    equality = _equality_phrase(comparisons, expect)
    load = (f"{plan.requests} requests of {plan.prompt_tokens} + {plan.max_tokens} tokens ({plan.offered_blocks} blocks) "
            f"on a {plan.pool_blocks}-block pool")
    if not evidence and not preempted:
        why = f"{load}, but {PREEMPTIONS_METRIC} did not move: the engine never preempted"
        return CheckOutcome(False, f"inconclusive: {why}; {equality}", evidence, details, inconclusive=why)
    result = f"{load}: {preempted:g} preemption{'s' if preempted != 1 else ''}; {equality}; healthy after"
    if not healthy:
        result = f"{load}: {preempted:g} preemptions; {equality}; server unhealthy after"
    return CheckOutcome(not evidence, result, evidence, details)


# -- 3. chunked prefill and long prompt_logprobs -------------------------------------------------------------------


class MemorySample(BaseModel):
    source: str = Field(description="'process tree RSS from /proc' (local server) or '/metrics process_resident_memory_bytes'")
    before_mib: float | None
    peak_mib: float | None
    after_mib: float | None
    samples: int


def _listening_inode(port: int) -> str | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return fields[9]
    return None


def server_pids(base_url: str) -> list[int]:
    """The processes of the session serving `base_url` when it listens on this machine (else [])."""
    from urllib.parse import urlparse

    from ..launch import session_pids

    parsed = urlparse(base_url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
        return []
    inode = _listening_inode(parsed.port)
    if inode is None:
        return []
    target = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if fd.readlink().as_posix() == target:
                    if int(entry.name) == os.getpid():  # a proxy in this process: its memory is not the server's
                        return []
                    stat = (entry / "stat").read_text()
                    sid = int(stat[stat.rfind(")") + 2 :].split()[3])
                    return session_pids(sid)
        except OSError:
            continue
    return []


def rss_bytes(pids: list[int]) -> int | None:
    total, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
        except OSError:
            continue
    return total if seen else None


class MemoryWatch:
    """Samples the server's memory every `interval_s` on a thread while a request runs."""

    def __init__(self, endpoint: Endpoint, interval_s: float = 0.25) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.pids = server_pids(endpoint.base_url)
        self.source = "process tree RSS from /proc" if self.pids else "/metrics process_resident_memory_bytes (API server process only)"
        self.values: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> int | None:
        if self.pids:
            return rss_bytes(self.pids)
        try:
            value = metric_value(self.endpoint.metrics(), "process_resident_memory_bytes")
        except CookbookError:
            return None
        return int(value) if value is not None else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self.read()
            if value is not None:
                self.values.append(value)

    def __enter__(self) -> "MemoryWatch":
        self.before = self.read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> MemorySample:
        after = self.read()
        mib = lambda v: None if v is None else round(v / 2**20, 1)  # noqa: E731
        peak = max(self.values + [v for v in (self.before, after) if v is not None], default=None)
        return MemorySample(source=self.source, before_mib=mib(self.before), peak_mib=mib(peak), after_mib=mib(after),
                            samples=len(self.values))


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
    oracle: dict[str, Any] | None = Field(None, description="Against the numerics oracle's fp32 prompt logprobs, if any")
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


@check(
    "chunked-prompt-logprobs",
    "Chunked prefill: `prompt_logprobs` over a prompt of several prefill chunks; memory during it; healthy after",
    group=GROUP,
)
def chunked_prompt_logprobs(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    expect = expectation(ctx)
    details: dict[str, Any] = {"layout": layout.model_dump(), "expectation": expect.model_dump()}
    chunk = layout.max_num_batched_tokens
    if not chunk:
        raise CheckInconclusive("the server's --max-num-batched-tokens (its prefill chunk) is unknown: pass it as the "
                                "check parameter max_num_batched_tokens", details=details)
    longest = layout.max_model_len - 1
    wanted = _param_int(ctx, "chunked_prompt_tokens") or min(longest, 3 * chunk + chunk // 2)
    prompt_len = min(wanted, longest)
    if prompt_len <= chunk:
        raise CheckInconclusive(f"the longest prompt this server takes ({format_tokens(longest)} tokens) fits in one "
                                f"prefill chunk of {chunk:,} tokens: no chunk boundary to cross", details=details)
    endpoint = ctx.endpoint
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    prompt = source.tokens("chunked-prompt", prompt_len)
    salt = new_salt("chunked")
    body = completion_body(endpoint, prompt, salt, 1, prompt_logprobs=TOP_K)
    timeout = _timeout(ctx, prompt_len * 2)
    started = time.monotonic()
    with MemoryWatch(endpoint) as watch:
        full = complete(endpoint, body, timeout)
    seconds = time.monotonic() - started
    memory = watch.sample()
    entries = full.prompt_logprobs
    problems = prompt_shape_problems(prompt, entries)
    boundaries = chunk_boundaries(prompt_len, chunk)
    # The sampler's next-token distribution of the prompt cut at p must match prompt_logprobs at position p (same
    # salt, so the cut prompt reuses the cached blocks and only its tail is recomputed).
    positions = sorted({p for b in boundaries for p in (b - 1, b, b + 1) if 0 < p < prompt_len} | {prompt_len - 1})
    checks: list[dict[str, Any]] = []
    worst: float | None = None
    for number, position in enumerate(positions, 1):
        ctx.report(f"position {number}/{len(positions)} ({position:,})")
        cut = complete(endpoint, completion_body(endpoint, prompt[:position], salt, 1), _timeout(ctx, position))
        mine = (entries[position] if entries and position < len(entries) else None) or {}
        sampler = cut.top[0] if cut.top else {}
        shared = set(mine) & set(sampler)
        diff = max((abs(mine[t] - sampler[t]) for t in shared), default=None)
        own = prompt[position]
        row = {"position": position, "own_token": own, "own_logprob": mine.get(own),
               "shared_top": len(shared), "max_diff": None if diff is None else round(diff, 6),
               "prompt_logprobs_top": _top_k(mine), "sampler_top": _top_k(sampler)}
        checks.append(row)
        top_prompt = max(mine, key=lambda t: mine[t]) if mine else None
        top_sampler = max(sampler, key=lambda t: sampler[t]) if sampler else None
        if diff is None:
            problems.append(f"position {position}: prompt_logprobs and the sampler's top-{TOP_K} share no token")
            continue
        worst = diff if worst is None else max(worst, diff)
        if diff > expect.prompt_logprobs_max_diff:
            problems.append(f"position {position}: prompt_logprobs differ from the sampler's next-token logprobs by "
                            f"{diff:.3g} (allowed {expect.prompt_logprobs_max_diff:g})")
        elif top_prompt != top_sampler and abs(mine[top_prompt] - mine.get(top_sampler, -math.inf)) > expect.tie_margin:
            problems.append(f"position {position}: most likely token {top_prompt} in prompt_logprobs, {top_sampler} "
                            "for the sampler")
    reference = _chunk_reference(ctx, prompt, entries, expect, problems)
    oracle = reference_prompt_check(ctx, prompt, entries, boundaries, problems)
    healthy = endpoint.healthy()
    if not healthy:
        problems.append("the server was unhealthy after the prompt_logprobs request (/health not 200)")
    report = ChunkedReport(prompt_tokens=prompt_len, chunk_tokens=chunk, boundaries=boundaries,
                           positions_checked=len(positions), shape_problems=prompt_shape_problems(prompt, entries),
                           boundary_checks=checks, boundary_max_diff=None if worst is None else round(worst, 6),
                           reference=reference, oracle=oracle, memory=memory, seconds=round(seconds, 2), healthy_after=healthy)
    details.update(report.model_dump())
    evidence = [Evidence(request=_excerpt(body), note=p) for p in problems[:6]]
    memory_text = (f"server memory {memory.before_mib:,.0f} MiB before, peak {memory.peak_mib:,.0f} MiB during "
                   f"({memory.source})" if memory.peak_mib is not None and memory.before_mib is not None
                   else "server memory not measured")
    compared = "; ".join(
        f"{r['what']}: max diff {r['max_diff']:.2g}, mean {r['mean_diff']:.2g}" for r in (oracle, reference)
        if r and r.get("max_diff") is not None
    ) or f"not compared with another chunking or the oracle ({(oracle or {}).get('what', 'no chunk_reference_url')})"
    result = (f"{format_tokens(prompt_len)}-token prompt in {len(boundaries) + 1} chunks of {chunk:,}: "
              f"{len(entries or [])} prompt_logprobs entries, each holding its own token; at {len(positions)} positions "
              f"around the chunk boundaries within {worst if worst is not None else float('nan'):.2g} of the sampler's "
              f"next-token logprobs; {compared}; {memory_text}; {'healthy after' if healthy else 'unhealthy after'}")
    return CheckOutcome(not problems, result, evidence, details)


def _top_k(entry: dict[int, float]) -> dict[str, float]:
    return {str(k): round(v, 5) for k, v in sorted(entry.items(), key=lambda kv: -kv[1])[: TOP_K + 1]}


def _chunk_reference(
    ctx: CheckContext, prompt: list[int], entries: list[dict[int, float] | None] | None, expect: Expectation,
    problems: list[str],
) -> dict[str, Any] | None:
    """The same prompt's prompt_logprobs from another server (`chunk_reference_url`: e.g. one with a larger chunk),
    compared at every position on the prompt's own token."""
    url = ctx.params.get("chunk_reference_url")
    if not url or not entries:
        return None
    other = Endpoint(str(url), ctx.endpoint.model)
    try:
        theirs = complete(other, completion_body(other, prompt, new_salt("chunk-ref"), 1, prompt_logprobs=TOP_K),
                          _timeout(ctx, len(prompt) * 2)).prompt_logprobs or []
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
    allowed = expect.prompt_logprobs_max_diff
    judged = _judge_chunkings(ctx, prompt, entries, theirs, [i for i, d in diffs if d > allowed])
    if worst is not None and worst[1] > allowed and judged["failed"] is not False:
        where = f"; {judged['note']}" if judged["note"] else ""
        problems.append(f"position {worst[0]}: prompt logprob differs from {url} (another chunking) by {worst[1]:.3g} "
                        f"(allowed {allowed:g}){where}")
    return {"what": f"against {url} (another chunking) at {len(diffs)} positions",
            "max_diff": None if worst is None else round(worst[1], 6),
            "worst_position": None if worst is None else worst[0],
            "mean_diff": round(sum(d for _, d in diffs) / len(diffs), 6) if diffs else None, "allowed": allowed,
            "judged_by_reference": judged}


def _judge_chunkings(
    ctx: CheckContext, prompt: list[int], mine: list[dict[int, float] | None], theirs: list[dict[int, float] | None],
    positions: list[int],
) -> dict[str, Any]:
    """Where two chunkings' prompt logprobs differ by more than the recipe allows, the truth is the model's fp32
    reference: if both sit within the dtype's tolerance of it at every such position, the difference is the dtype's
    noise (both right), else one chunking is wrong. `failed`: None when no reference could judge."""
    if not positions:
        return {"failed": None, "note": "", "positions": []}
    from .oracle import tolerance_for

    ref, why = _reference(ctx, any_prompt=True)
    if ref is None:
        return {"failed": None, "note": f"no reference to judge it ({why})", "positions": positions}
    try:
        if not ref.can_score(prompt):
            return {"failed": None, "note": "the reference cannot score this prompt", "positions": positions}
        score = ref.score(prompt, 1, top_k=TOP_K)
    except CookbookError as exc:
        return {"failed": None, "note": f"the reference failed: {exc}", "positions": positions}
    tolerance, tolerance_from = tolerance_for(ctx)
    rows, failed = [], False
    for i in positions:
        theirs_ref = score.prompt[i] if i < len(score.prompt) else None
        a, b = (mine[i] or {}).get(prompt[i]), (theirs[i] or {}).get(prompt[i])
        if theirs_ref is None or a is None or b is None:
            return {"failed": None, "note": f"the reference has no logprob at position {i}", "positions": positions}
        off = max(abs(a - theirs_ref.logprob), abs(b - theirs_ref.logprob))
        failed = failed or off > tolerance.max_abs_delta
        rows.append({"position": i, "this": round(a, 5), "other": round(b, 5), "reference": round(theirs_ref.logprob, 5),
                     "worst_from_reference": round(off, 5)})
    worst = max(rows, key=lambda r: r["worst_from_reference"])
    note = (f"the reference ({ref.source}) at position {worst['position']}: this {worst['this']:.3f}, the other "
            f"{worst['other']:.3f}, the reference {worst['reference']:.3f}; {'one chunking is' if failed else 'both are'} "
            f"{'more than' if failed else 'within'} {tolerance.max_abs_delta:g} of it ({tolerance_from})")
    return {"failed": failed, "note": note, "positions": rows}


# -- 4. batch composition ------------------------------------------------------------------------------------------


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


@check(
    "batch-composition",
    "Batch composition: the same greedy prompts alone and in batches of 2, 4 and --max-num-seqs",
    group=GROUP,
)
def batch_composition(ctx: CheckContext) -> CheckOutcome:
    layout = engine_layout(ctx)
    expect = expectation(ctx)
    sizes = batch_sizes(ctx, layout)
    details: dict[str, Any] = {"layout": layout.model_dump(), "expectation": expect.model_dump()}
    if not sizes:
        raise CheckInconclusive(f"--max-num-seqs is {layout.max_num_seqs}: the server never batches requests", details=details)
    judge, details["judge"] = reference_judge(ctx, expect)
    endpoint = ctx.endpoint
    source = PromptSource(endpoint, ctx.params.get("seed") or 0)
    count = max(sizes)
    prompt_len = _param_int(ctx, "batch_prompt_tokens") or 96
    max_tokens = _param_int(ctx, "batch_max_tokens") or min(ctx.max_tokens, 24)
    prompts = [source.tokens(f"batch-{i}", prompt_len) for i in range(count)]
    timeout = _timeout(ctx, (prompt_len + max_tokens) * count)
    ctx.report(f"{count} solo runs")
    solos = [complete(endpoint, completion_body(endpoint, p, new_salt("solo"), max_tokens), timeout) for p in prompts]
    rounds: list[BatchRound] = []
    evidence: list[Evidence] = []
    for size in sizes:
        ctx.report(f"batches of {size}")
        comparisons: list[RunComparison | None] = [None] * count
        overlapped = True
        batches = 0
        for start in range(0, count, size):
            group = list(range(start, min(start + size, count)))
            bodies = {i: completion_body(endpoint, prompts[i], new_salt("batch"), max_tokens) for i in group}
            clock = time.monotonic()
            runs = in_parallel([lambda b=bodies[i]: complete(endpoint, b, timeout, clock) for i in group])
            batches += 1
            if len(group) > 1 and max(r.sent_s for r in runs) >= min(r.done_s for r in runs):
                overlapped = False
            for i, run in zip(group, runs):
                comparison = compare_runs(f"prompt {i + 1} in a batch of {size}", solos[i], run, expect, judge, prompts[i])
                comparisons[i] = comparison
                if comparison.problems:
                    evidence.append(_comparison_evidence(comparison, bodies[i], solos[i], run))
        done = [c for c in comparisons if c is not None]
        rounds.append(BatchRound(size=size, batches=batches, overlapped=overlapped, comparisons=done,
                                 changed=[c.name for c in done if not c.tokens_identical]))
    details["prompt_tokens"] = prompt_len
    details["max_tokens"] = max_tokens
    details["rounds"] = [r.model_dump() for r in rounds]
    all_comparisons = [c for r in rounds for c in r.comparisons]
    equality = _equality_phrase(all_comparisons, expect)
    changed = [f"{r.size}: {', '.join(c.split(' in ')[0] for c in r.changed)}" for r in rounds if r.changed]
    where = "; changed at batch size " + "; ".join(changed) if changed else ""
    not_together = [r.size for r in rounds if not r.overlapped]
    head = f"{count} prompts alone and in batches of {', '.join(str(s) for s in sizes)}"
    if not_together and not evidence:
        why = f"the requests of the batches of {not_together} were not all in flight at once: no batch was formed"
        return CheckOutcome(False, f"inconclusive: {why}", evidence, details, inconclusive=why)
    return CheckOutcome(not evidence, f"{head}: {equality}{where}", evidence, details)


# -- the oracle, where one is available ----------------------------------------------------------------------------


def _reference(ctx: CheckContext, any_prompt: bool = False) -> tuple[Any, str]:
    """The numerics oracle's reference for this recipe (cookbook.reference.reference_for), or None and why; with
    `any_prompt`, one that also scores the probe's own prompts (the golden file, else a forward pass computed here:
    reference_for_any_prompt). A check parameter `use_reference: false` turns it off."""
    if ctx.params.get("use_reference") is False:
        return None, "turned off by a check parameter"
    from .. import reference as reference_mod

    try:
        if any_prompt:
            return reference_mod.reference_for_any_prompt(ctx)
        return reference_mod.reference_for(ctx)
    except CookbookError as exc:
        return None, str(exc)


def reference_judge(ctx: CheckContext, expect: Expectation) -> tuple[Judge | None, str]:
    """A judge for first differing tokens from the numerics oracle where it can score the prompt (the solo run's
    token against the run's, by the reference's fp32 distribution and the recipe's oracle tie margin for its dtype);
    otherwise None and why (the recipe's engine_states tie margin judges)."""
    from .. import reference as reference_mod
    from .oracle import tolerance_for

    ref, why = _reference(ctx, any_prompt=True)  # a departure is judged at the probe's own prefix
    if ref is None:
        return None, f"the recipe's tie margin {expect.tie_margin:g} (no reference: {why})"
    tolerance, tolerance_from = tolerance_for(ctx)

    def judge(prefix: list[int], solo_token: int, run_token: int) -> tuple[Literal["tie", "fail"], str] | None:
        try:
            if not ref.can_score(prefix):
                return None
            score = ref.score(prefix, 1, top_k=TOP_K)
        except CookbookError:
            return None  # the reference could not answer: the tie margin judges
        if not score.greedy:
            return None
        verdict = reference_mod.judge_divergence(score.greedy[0], solo_token, run_token, tolerance.tie_margin)
        return ("fail" if verdict.failed else "tie"), f"the reference ({ref.source}): {verdict.note}"

    judge.margin = tolerance.tie_margin + expect.max_logprob_diff  # type: ignore[attr-defined]
    return judge, f"the reference: {why} (tie margin from {tolerance_from})"


def reference_prompt_check(
    ctx: CheckContext, prompt: list[int], entries: list[dict[int, float] | None] | None, boundaries: list[int],
    problems: list[str],
) -> dict[str, Any] | None:
    """The served prompt logprobs of the prompt's own tokens against the oracle's fp32 ones at every position, with
    the worst position near a chunk boundary reported apart; None when no reference can score this prompt."""
    from .oracle import tolerance_for

    ref, why = _reference(ctx)
    if ref is None or not entries:
        return {"what": f"no reference ({why})", "max_diff": None} if ref is None else None
    try:
        if not ref.can_score(prompt):
            return {"what": f"the reference ({ref.source}) cannot score this {len(prompt)}-token prompt", "max_diff": None}
        score = ref.score(prompt, 1, top_k=TOP_K)
    except CookbookError as exc:
        return {"what": f"the reference failed: {exc}", "max_diff": None}
    tolerance, tolerance_from = tolerance_for(ctx)
    diffs: list[tuple[int, float]] = []
    for i, tok in enumerate(prompt):
        mine = entries[i] if i < len(entries) else None
        theirs = score.prompt[i] if i < len(score.prompt) else None
        if i == 0 or not mine or theirs is None or tok not in mine:
            continue
        diffs.append((i, abs(mine[tok] - theirs.logprob)))
    if not diffs:
        return {"what": f"the reference ({ref.source}) scored no position", "max_diff": None}
    worst = max(diffs, key=lambda d: d[1])
    mean = sum(d for _, d in diffs) / len(diffs)
    near = [d for d in diffs if any(abs(d[0] - b) <= 2 for b in boundaries)]
    near_worst = max((d for _, d in near), default=None)
    if worst[1] > tolerance.max_abs_delta:
        problems.append(f"position {worst[0]}: prompt logprob {worst[1]:.3g} from the reference's "
                        f"(allowed {tolerance.max_abs_delta:g}, {tolerance_from})")
    if mean > tolerance.mean_abs_delta:
        problems.append(f"prompt logprobs {mean:.3g} from the reference's on average (allowed "
                        f"{tolerance.mean_abs_delta:g}, {tolerance_from})")
    return {"what": f"against the reference ({ref.source}) at {len(diffs)} positions", "max_diff": round(worst[1], 6),
            "worst_position": worst[0], "mean_diff": round(mean, 6),
            "near_boundaries_max_diff": None if near_worst is None else round(near_worst, 6),
            "allowed": tolerance.max_abs_delta, "allowed_mean": tolerance.mean_abs_delta, "tolerances": tolerance_from}


# -- for notebooks and batch runs ----------------------------------------------------------------------------------

SMALL_POOL_CHECKS = ("preemption", "chunked-prompt-logprobs")


def run_engine_states(
    ctx: CheckContext, launch_profile: str | None = None, names: list[str] | None = None, say: Callable[[str], None] = print
) -> Any:
    """The group against `ctx.endpoint`; with `launch_profile` (a recipe's verification.launch_profiles entry, e.g.
    a small KV pool) the preemption and chunked-prefill probes run on a server of the recipe started with it for
    them, and stopped after: one extra server start, not one per probe. Returns one RunResults in registry order."""
    from ..launch import Server, free_port, launch_flags
    from .registry import run_checks

    wanted = names or [name for name, spec in _registry().items() if spec.group == GROUP]
    on_small = [n for n in wanted if launch_profile and n in SMALL_POOL_CHECKS]
    results = run_checks(ctx, [n for n in wanted if n not in on_small]) if len(on_small) < len(wanted) else None
    if on_small:
        assert ctx.recipe is not None and launch_profile is not None
        flags = launch_flags(ctx.recipe, launch_profile)
        with Server(ctx.recipe, port=free_port(), extra_flags=flags, say=say) as server:
            small_ctx = CheckContext(server.endpoint, ctx.recipe, ctx.out_dir,
                                     {**ctx.params, "launch_overrides": flags}, ctx.request_timeout_s, ctx.hardware)
            small = run_checks(small_ctx, on_small)
        for result in small.checks:
            result.details["server"] = f"launched with profile {launch_profile}: {flags}"
        if results is None:
            return small
        results.checks.extend(small.checks)
        order = {name: i for i, name in enumerate(wanted)}
        results.checks.sort(key=lambda c: order.get(c.name, len(order)))
    return results


def _registry() -> dict[str, Any]:
    from .registry import CHECKS

    return CHECKS


def comparison_rows(results: Any) -> list[dict[str, Any]]:
    """One row per request compared with its solo run, for a table: check, request, identical, max logprob diff,
    and where it left the solo run (first differing token, tie or fail)."""
    rows: list[dict[str, Any]] = []
    for check_result in results.checks:
        if check_result.name not in _registry() or _registry()[check_result.name].group != GROUP:
            continue
        comparisons = list(check_result.details.get("comparisons") or [])
        for round_ in check_result.details.get("rounds") or []:
            comparisons.extend(round_.get("comparisons") or [])
        for c in comparisons:
            divergence = c.get("divergence") or {}
            rows.append({
                "check": check_result.name,
                "request": c["name"],
                "tokens identical": c["tokens_identical"],
                "max logprob diff": c["max_logprob_diff"],
                "first differing token": divergence.get("position"),
                "verdict": divergence.get("verdict", "identical" if c["tokens_identical"] else ""),
                "margin": divergence.get("margin"),
            })
    return rows
