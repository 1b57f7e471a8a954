"""Prefix-cache hit versus cold: the probe that catches a cache hit resuming from the wrong state.

On Gated DeltaNet hybrids a hit can restore the wrong recurrent state and still answer fluently, so the probe
compares a hit with a cold run of the same greedy prompt, token by token. Per prompt (a token-exact haystack with
a needle): one request with a fresh ``cache_salt`` (cold), then the same request again with the same salt until the
recipe's ``hits_from_request`` (3 in vLLM's hybrid 'align' mode, where a hit may wait for the third identical
request). Every later request is compared with the cold one: the text must be identical and the logprobs
bit-identical, or within the recipe's tolerance. It also checks that
``cached_tokens`` is 0 on the cold run and on a hit a positive multiple of the block size below the prompt length,
that a prompt shorter than one block never hits, that ``vllm:prefix_cache_hits_total`` moved by at least the
cached amount (other clients may move it further), and, with caching off, that nothing is ever cached.
"""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..endpoint import Endpoint, metric_value
from ..errors import CookbookError, ServerDown
from ..haystack import (
    Answer,
    ask,
    body_excerpt,
    build_haystack,
    fit_lengths,
    format_tokens,
    join_words,
    make_needle,
    new_salt,
    request_body,
    request_timeout,
    seed_param,
    server_max_model_len,
)
from ..results import Evidence
from .registry import CheckContext, CheckOutcome, check

HITS_METRIC = "vllm:prefix_cache_hits_total"
METRIC_SETTLE_S = 3.0  # the server may count a hit just after it answers
NEEDLE_DEPTH = 0.5


class CacheLayout(BaseModel):
    """What the probe expects of the server's prefix cache."""

    enabled: bool = Field(description="Prefix caching on")
    block_size: int | None = Field(None, description="Tokens per cached block: cached_tokens is a multiple of it")
    hits_from_request: int = Field(2, description="The identical request by which a hit must have come")
    source: str = Field(description="Where the layout came from: 'recipe' or 'server /metrics'")

    def longest_hit(self, prompt_tokens: int) -> int:
        """Full blocks before the last prompt token: the most a hit can serve (0: this prompt never hits)."""
        if not self.enabled or not self.block_size:
            return 0
        return (prompt_tokens - 1) // self.block_size * self.block_size


class Comparison(BaseModel):
    """A later answer against the cold one."""

    text_identical: bool
    tokens_identical: bool
    bit_identical: bool = Field(description="Same tokens and every logprob equal to the last bit")
    max_logprob_diff: float | None = Field(description="Max |later - cold| over the tokens both share; None if none")
    compared_tokens: int = Field(description="Leading tokens both answers share, whose logprobs were compared")
    logprobs_returned: bool = Field(description="Both responses carried logprobs.content")


class PromptReport(BaseModel):
    """One prompt: its requests, the hit compared with the cold run, and what was wrong."""

    target_tokens: int
    prompt_tokens: int | None
    salt: str
    cached_tokens: list[int | None] = Field(description="usage cached_tokens per request, cold first")
    seconds: list[float] = Field(description="Wall time per request")
    metric_deltas: list[float | None] = Field(description="vllm:prefix_cache_hits_total change around each request")
    hit_request: int | None = Field(description="1-based number of the first request that hit")
    comparisons: list[Comparison] = Field(description="Each later request against the cold one, request 2 first")
    comparison: Comparison = Field(description="All of them together: identical only if every one is")
    problems: list[str] = Field(default_factory=list)
    texts: list[str] = Field(description="The answer of each request, cold first")


class PrefixCacheReport(BaseModel):
    layout: CacheLayout
    logprobs_expected: Literal["bit-identical", "close"]
    max_logprob_diff_allowed: float
    prompts: list[PromptReport]

    @property
    def passed(self) -> bool:
        return bool(self.prompts) and not any(p.problems for p in self.prompts)


# -- reading the server --------------------------------------------------------------------------------------------


def server_cache_config(endpoint: Endpoint) -> dict[str, str] | None:
    """The labels of vllm:cache_config_info (block_size, enable_prefix_caching, mamba_cache_mode ...), if any."""
    for metric in endpoint.metrics():
        if metric.name.startswith("vllm:cache_config_info"):
            return metric.labels
    return None


def layout_from_server(config: dict[str, str]) -> CacheLayout:
    enabled = config.get("enable_prefix_caching") == "True"
    block = config.get("block_size", "")
    return CacheLayout(
        enabled=enabled,
        block_size=int(block) if block.isdigit() else None,
        hits_from_request=3 if config.get("mamba_cache_mode") == "align" else 2,
        source="server /metrics",
    )


def read_hits(endpoint: Endpoint) -> float | None:
    """The server's prefix-cache hit counter (cached tokens since start), None when /metrics has none."""
    try:
        metrics = endpoint.metrics()
    except ServerDown:
        raise
    except CookbookError:  # no /metrics (HTTP 404 behind some proxies): the delta is simply not measured
        return None
    value = metric_value(metrics, HITS_METRIC, model_name=endpoint.model)
    return value if value is not None else metric_value(metrics, HITS_METRIC)


def _hits_delta(endpoint: Endpoint, before: float | None, expected: int) -> float | None:
    """How far the hit counter moved since `before`, waiting briefly for it to reach `expected`."""
    if before is None:
        return None
    deadline = time.monotonic() + METRIC_SETTLE_S
    while True:
        after = read_hits(endpoint)
        if after is None:
            return None
        delta = after - before
        if delta >= expected or time.monotonic() >= deadline:
            return delta
        time.sleep(0.1)


# -- comparing -----------------------------------------------------------------------------------------------------


def compare(cold: Answer, later: Answer) -> Comparison:
    """Text, tokens and logprobs of a later answer against the cold one, token by token."""
    shared = 0
    for cold_token, later_token in zip(cold.tokens, later.tokens):
        if cold_token != later_token:
            break
        shared += 1
    diffs = [abs(a - b) for a, b in zip(cold.logprobs[:shared], later.logprobs[:shared])]
    tokens_identical = cold.tokens == later.tokens and bool(cold.tokens)
    return Comparison(
        text_identical=cold.text == later.text and cold.reasoning == later.reasoning,
        tokens_identical=tokens_identical,
        bit_identical=tokens_identical and cold.logprobs == later.logprobs,
        max_logprob_diff=max(diffs) if diffs else None,
        compared_tokens=shared,
        logprobs_returned=bool(cold.logprobs) and bool(later.logprobs),
    )


def combine(comparisons: list[Comparison]) -> Comparison:
    """Several later answers against the cold one as one: the worst of each."""
    diffs = [c.max_logprob_diff for c in comparisons if c.max_logprob_diff is not None]
    return Comparison(
        text_identical=all(c.text_identical for c in comparisons),
        tokens_identical=all(c.tokens_identical for c in comparisons),
        bit_identical=all(c.bit_identical for c in comparisons),
        max_logprob_diff=max(diffs) if diffs else None,
        compared_tokens=min((c.compared_tokens for c in comparisons), default=0),
        logprobs_returned=all(c.logprobs_returned for c in comparisons),
    )


def _cache_problems(layout: CacheLayout, prompt_tokens: int, cached: list[int | None], hit_at: int) -> list[str]:
    problems: list[str] = []
    if cached[0]:
        problems.append(f"the cold request (fresh cache_salt) reported {cached[0]} cached tokens")
    if not layout.enabled:
        for number, value in enumerate(cached, 1):
            if value and number > 1:
                problems.append(f"request {number} reported {value} cached tokens with prefix caching off")
        return problems
    block = layout.block_size or 0
    longest = layout.longest_hit(prompt_tokens)
    for number, value in enumerate(cached[1:], 2):
        if not value:
            continue
        if longest == 0:
            problems.append(
                f"request {number} reported {value} cached tokens for a {prompt_tokens}-token prompt, "
                f"shorter than one {block}-token block"
            )
        elif value % block:
            problems.append(f"request {number}: {value} cached tokens is not a multiple of the {block}-token block")
        elif value > longest:
            problems.append(
                f"request {number}: {value} cached tokens, more than the {longest} a {prompt_tokens}-token prompt "
                "can have cached (full blocks before its last token)"
            )
    if longest and not cached[hit_at - 1]:
        problems.append(f"request {hit_at} (same cache_salt) did not hit: cached_tokens {cached[hit_at - 1]}")
    return problems


# -- the probe -----------------------------------------------------------------------------------------------------


def probe_prompt(
    endpoint: Endpoint,
    target_tokens: int,
    layout: CacheLayout,
    max_tokens: int,
    timeout_s: float,
    seed: int | str,
) -> tuple[PromptReport, dict[str, Any]]:
    """Cold, then the same salted request until the first that should hit; returns the report and the request."""
    cell = f"{seed}:prefix-cache:{target_tokens}"
    haystack = build_haystack(endpoint, target_tokens, NEEDLE_DEPTH, make_needle(cell), seed=cell)
    salt = new_salt()
    body = request_body(endpoint, haystack.messages, salt, max_tokens)
    timeout = request_timeout(timeout_s, haystack.prompt_tokens)
    answers: list[Answer] = []
    deltas: list[float | None] = []
    for _ in range(layout.hits_from_request):
        before = read_hits(endpoint)
        answer = ask(endpoint, body, timeout)
        deltas.append(_hits_delta(endpoint, before, answer.cached_tokens or 0))
        answers.append(answer)
    cold = answers[0]
    comparisons = [compare(cold, later) for later in answers[1:]]
    cached = [a.cached_tokens for a in answers]
    prompt_tokens = cold.prompt_tokens or haystack.prompt_tokens
    problems = _cache_problems(layout, prompt_tokens, cached, layout.hits_from_request)
    for number, (value, delta) in enumerate(zip(cached, deltas), 1):
        if value and delta is not None and delta < value:
            problems.append(
                f"request {number} reported {value} cached tokens but {HITS_METRIC} moved by only {delta:g}"
            )
    report = PromptReport(
        target_tokens=target_tokens,
        prompt_tokens=cold.prompt_tokens,
        salt=salt,
        cached_tokens=cached,
        seconds=[a.seconds for a in answers],
        metric_deltas=deltas,
        hit_request=next((n for n, value in enumerate(cached, 1) if value), None),
        comparisons=comparisons,
        comparison=combine(comparisons),
        problems=problems,
        texts=[a.text for a in answers],
    )
    return report, body


def _judge(report: PromptReport, expected: str, allowed: float) -> None:
    """Add each later request's problems under the recipe's expectation (a hit may come before the one
    `hits_from_request` names: every request after the cold one must match it)."""
    for number, comparison in enumerate(report.comparisons, 2):
        cached = report.cached_tokens[number - 1]
        what = f"request {number} ({f'a hit, {cached} cached' if cached else 'not a hit'})"
        if not comparison.text_identical:
            report.problems.append(
                f"{what} answered {report.texts[number - 1]!r}, the cold run {report.texts[0]!r}"
            )
        diff = comparison.max_logprob_diff
        if not comparison.logprobs_returned:
            report.problems.append(f"{what}: no logprobs to compare (a response had no logprobs.content)")
        elif expected == "bit-identical" and not comparison.bit_identical:
            report.problems.append(
                f"{what}: logprobs not bit-identical to the cold run (max diff {diff if diff is not None else 0:.3g})"
            )
        elif expected == "close" and (diff or 0.0) > allowed:
            report.problems.append(f"{what}: logprobs differ from the cold run by {diff:.3g} (allowed {allowed:g})")


def probe_prefix_cache(
    endpoint: Endpoint,
    prompt_tokens: list[int],
    layout: CacheLayout,
    logprobs: Literal["bit-identical", "close"] = "bit-identical",
    max_logprob_diff: float = 0.0,
    max_tokens: int = 64,
    timeout_s: float = 60.0,
    seed: int | str = 0,
) -> tuple[PrefixCacheReport, list[Evidence]]:
    """Run the probe on prompts of the given lengths (in this model's tokens); evidence for each failing prompt."""
    reports: list[PromptReport] = []
    evidence: list[Evidence] = []
    for target in prompt_tokens:
        report, body = probe_prompt(endpoint, target, layout, max_tokens, timeout_s, seed)
        _judge(report, logprobs, max_logprob_diff)
        reports.append(report)
        if report.problems:
            evidence.append(
                Evidence(
                    request=body_excerpt(body),
                    response={
                        "cached_tokens": report.cached_tokens,
                        "texts": report.texts,
                        "max_logprob_diff": report.comparison.max_logprob_diff,
                    },
                    note=f"{report.prompt_tokens}-token prompt: " + "; ".join(report.problems),
                )
            )
    full = PrefixCacheReport(
        layout=layout, logprobs_expected=logprobs, max_logprob_diff_allowed=max_logprob_diff, prompts=reports
    )
    return full, evidence


# -- wording -------------------------------------------------------------------------------------------------------


def result_text(report: PrefixCacheReport) -> str:
    """The Verified table's Result column in the seeds' wording."""
    prompts = report.prompts
    n = len(prompts)
    text_ok = sum(p.comparison.text_identical for p in prompts)
    bits_ok = sum(p.comparison.bit_identical for p in prompts)
    diffs = [p.comparison.max_logprob_diff for p in prompts if p.comparison.max_logprob_diff is not None]
    worst = max(diffs) if diffs else 0.0
    if report.logprobs_expected == "bit-identical" and text_ok == bits_ok == n:
        head = f"identical text and bit-identical logprobs {n}/{n}"
    elif report.logprobs_expected == "bit-identical":
        head = f"identical text {text_ok}/{n}, bit-identical logprobs {bits_ok}/{n} (max diff {worst:.2g})"
    else:
        allowed = report.max_logprob_diff_allowed
        within = sum((p.comparison.max_logprob_diff or 0.0) <= allowed for p in prompts)
        scope = "of the cold run" if within == n else f"on {within}/{n}"
        head = (
            f"identical text {text_ok}/{n}, logprobs within {allowed:g} {scope} "
            f"(max diff {worst:.2g}; bit-identical {bits_ok}/{n})"
        )
    layout = report.layout
    cache_bad = sum(any(_is_cache_problem(m) for m in p.problems) for p in prompts)
    if not layout.enabled:
        tail = "nothing cached on any request (prefix caching off)" if not cache_bad else (
            f"cached tokens reported on {cache_bad} of {n} prompts with prefix caching off"
        )
        return f"{head}; {tail}"
    if cache_bad:
        tail = f"cached tokens wrong on {cache_bad} of {n} prompts"
    else:
        tail = f"cached tokens a multiple of {layout.block_size:,} on every hit"
        never = [p.prompt_tokens or p.target_tokens for p in prompts if not layout.longest_hit(p.prompt_tokens or 0)]
        if never:
            plural = len(never) > 1
            tail += (
                f" (the {join_words([str(t) for t in never])}-token prompt{'s' if plural else ''}, "
                f"shorter than one block, never hit)"
            )
    return f"{head}; {tail}"


def _is_cache_problem(message: str) -> bool:
    return "cached tokens" in message or "did not hit" in message or HITS_METRIC in message


def label_for(prompt_tokens: list[int], hits_from_request: int) -> str:
    lengths = sorted(prompt_tokens)
    span = format_tokens(lengths[0]) if len(lengths) == 1 else (
        f"{format_tokens(lengths[0])} to {format_tokens(lengths[-1])}"
    )
    nth = {2: "", 3: ", hit by the third identical request"}.get(hits_from_request, "")
    return (
        f"Prefix-cache hit vs cold (`cache_salt`), greedy, {len(lengths)} prompt{'s' if len(lengths) > 1 else ''} "
        f"of {span} tokens with a needle{nth}"
    )


# -- the check -----------------------------------------------------------------------------------------------------


def _layout(ctx: CheckContext) -> tuple[CacheLayout, list[str]]:
    """The recipe's layout when there is a recipe (checked against the server's), else the server's own."""
    server = server_cache_config(ctx.endpoint)
    if ctx.recipe is None:
        if server is None:
            raise CookbookError("prefix-cache: no recipe and no vllm:cache_config_info in /metrics to learn the layout")
        return layout_from_server(server), []
    caching = ctx.recipe.prefix_caching
    layout = CacheLayout(
        enabled=caching.enabled,
        block_size=caching.block_size,
        hits_from_request=caching.hits_from_request,
        source="recipe",
    )
    mismatches: list[str] = []
    if server is not None:
        seen = layout_from_server(server)
        if seen.enabled != layout.enabled:
            mismatches.append(f"the recipe has prefix caching {'on' if layout.enabled else 'off'}, the server not")
        elif layout.enabled and seen.block_size != layout.block_size:
            mismatches.append(f"the recipe says {layout.block_size}-token blocks, the server reports {seen.block_size}")
    return layout, mismatches


@check(
    "prefix-cache",
    "Prefix-cache hit vs cold (`cache_salt`), greedy, prompts with a needle",
    group="long-context",
)
def prefix_cache(ctx: CheckContext) -> CheckOutcome:
    """Hit against cold per prompt; lengths from the recipe (or params['prefix_cache_prompt_tokens'])."""
    recipe = ctx.recipe
    expectation = recipe.verification.prefix_cache if recipe else None
    lengths = ctx.params.get("prefix_cache_prompt_tokens") or (expectation.prompt_tokens if expectation else None)
    if not lengths:
        raise CookbookError("prefix-cache: the recipe has no verification.prefix_cache.prompt_tokens")
    layout, mismatches = _layout(ctx)
    context = server_max_model_len(ctx.endpoint)
    fitted = fit_lengths(list(lengths), context, ctx.max_tokens)
    report, evidence = probe_prefix_cache(
        ctx.endpoint,
        fitted,
        layout,
        logprobs=expectation.logprobs if expectation else "bit-identical",
        max_logprob_diff=expectation.max_logprob_diff if expectation else 0.0,
        max_tokens=ctx.max_tokens,
        timeout_s=ctx.request_timeout_s,
        seed=seed_param(ctx.params),
    )
    text = result_text(report)
    for mismatch in mismatches:
        evidence.append(Evidence(note=mismatch))
    if mismatches:
        text += "; " + "; ".join(mismatches)
    details = report.model_dump()
    details["max_model_len"] = context
    if fitted != list(lengths):
        details["requested_prompt_tokens"] = list(lengths)
    measured = [p.prompt_tokens or p.target_tokens for p in report.prompts]
    return CheckOutcome(
        passed=report.passed and not mismatches,
        result=text,
        evidence=evidence,
        details=details,
        label=label_for(measured, layout.hits_from_request),
    )
