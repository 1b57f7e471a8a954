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
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ..endpoint import Endpoint, metric_value
from ..errors import CookbookError, ServerDown
from ..haystack import (
    TOP_K,
    Answer,
    chat_prompt_ids,
    token_id,
    ServedModel,
    ask,
    body_excerpt,
    build_haystack,
    fit_lengths,
    format_tokens,
    frame_tokens,
    join_words,
    longest_frame_needle,
    make_needle,
    new_salt,
    request_body,
    request_timeout,
    seed_param,
    served_model,
)
from ..results import Evidence
from .registry import CheckContext, CheckOutcome, check

HITS_METRIC = "vllm:prefix_cache_hits_total"
METRIC_SETTLE_S = 3.0  # the server may count a hit just after it answers
NEEDLE_DEPTH = 0.5
DEFAULT_PROMPTS = 8
# A recipe that says nothing about hit-versus-cold logprobs gets 'close' within its dtype's tolerance: a hit and a
# cold run go through different kernel shapes, so bit-identity is a claim a recipe opts into. bf16: SmolLM2-135M
# measured 0.063 to 0.095 on the CPU server (its recipe allows 0.15); the tiny Gemma 3 0.008 at 3,900 tokens.
DTYPE_TOLERANCE = {"fp32": 1e-3, "float32": 1e-3, "fp16": 0.05, "float16": 0.05, "bf16": 0.15, "bfloat16": 0.15,
                   "fp8": 0.3}
DEFAULT_TOLERANCE = 0.15


class CacheLayout(BaseModel):
    """What the probe expects of the server's prefix cache."""

    enabled: bool = Field(description="Prefix caching on")
    block_size: int | None = Field(None, description="Tokens per cached block: cached_tokens is a multiple of it")
    hits_from_request: int = Field(2, description="The identical request by which a hit must have come")
    source: str = Field(description="Where the layout came from: 'recipe' or 'server /metrics'")
    sliding_windows: list[int] = Field(
        default_factory=list, description="Attention windows of the served model (config.json), for the prompt lengths"
    )

    def longest_hit(self, prompt_tokens: int) -> int:
        """Full blocks before the last prompt token: the most a hit can serve (0: this prompt never hits)."""
        if not self.enabled or not self.block_size:
            return 0
        return (prompt_tokens - 1) // self.block_size * self.block_size


class ReferenceVerdict(BaseModel):
    """A reference forward pass's judgement of one flip (cookbook.reference.judge_divergence)."""

    verdict: Literal["tie", "fail", "same"]
    margin: float | None = Field(description="Reference logprob of the cold token minus the later one's")
    tolerance: float = Field(description="The dtype's tie margin (the oracle's tolerances)")
    note: str
    source: str = Field(description="Which reference: computed here, a golden file, another server")


Referee = Callable[[list[int], int, int], ReferenceVerdict | None]


class Divergence(BaseModel):
    """The first generated token where a later answer parts from the cold one, with both runs' top-k there: a flip
    between two tokens the cold run itself had within the tolerance of each other is a tie, not a wrong state."""

    index: int = Field(description="0-based position in the answer of the first differing token")
    cold_token: str | None = Field(description="The cold run's token there; None when the cold answer had ended")
    later_token: str | None = Field(description="The later run's token there; None when it had ended")
    cold_top: list[tuple[str, float]] = Field(description="The cold run's top-k (token, logprob) at that position")
    later_top: list[tuple[str, float]] = Field(description="The later run's top-k at that position")
    cold_margin: float | None = Field(
        description="Cold logprob of its own token minus cold logprob of the later token; None if not in its top-k"
    )
    cold_margin_at_least: float | None = Field(
        None, description="When the later token is not in the cold top-k: the margin is at least this"
    )
    later_margin: float | None = Field(description="Later logprob of its own token minus later logprob of the cold one")
    verdict: Literal["tie", "clearly lower", "unjudged"] = "unjudged"
    tolerance: float | None = Field(None, description="Margin up to which a flip is a tie")
    judged_by: str = Field("", description="What the verdict rests on: the cold run's own top-k, or a reference")
    cold_token_id: int | None = None
    later_token_id: int | None = None
    reference: ReferenceVerdict | None = Field(None, description="The reference's ranking of the two tokens there")

    def describe(self) -> str:
        cold = f"{self.cold_token!r}" if self.cold_token is not None else "the end of the answer"
        later = f"{self.later_token!r}" if self.later_token is not None else "the end of the answer"
        if self.reference is not None and self.reference.verdict != "same" and self.reference.margin is not None:
            margin = f"margin {self.cold_margin:.3g}" if self.cold_margin is not None else "margin unknown"
            margin += f", the reference's {self.reference.margin:.3g}"
        elif self.cold_margin is not None:
            margin = f"margin {self.cold_margin:.3g}"
        elif self.cold_margin_at_least is not None:
            margin = f"margin over {self.cold_margin_at_least:.3g} (not in the cold run's top {len(self.cold_top)})"
        else:
            margin = "margin unknown"
        head = f"first differing token {self.index}: cold {cold}, this run {later}; the cold run's {margin}"
        if self.verdict == "tie":
            return f"{head}: a flip on a near-tie (within {self.tolerance:.3g}; judged by {self.judged_by})"
        if self.verdict == "clearly lower":
            who = "the reference ranks" if self.reference is not None else "the cold run ranked"
            return f"{head}: {who} this run's token clearly lower (over {self.tolerance:.3g}; judged by {self.judged_by})"
        return f"{head} ({self.judged_by or 'not judged'})"


class Comparison(BaseModel):
    """A later answer against the cold one."""

    text_identical: bool
    tokens_identical: bool
    bit_identical: bool = Field(description="Same tokens and every logprob equal to the last bit")
    max_logprob_diff: float | None = Field(description="Max |later - cold| over the tokens both share; None if none")
    compared_tokens: int = Field(description="Leading tokens both answers share, whose logprobs were compared")
    logprobs_returned: bool = Field(description="Both responses carried logprobs.content")
    divergence: Divergence | None = Field(None, description="Where the tokens part, with both runs' top-k")


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
    ties: list[str] = Field(default_factory=list, description="Flips on a near-tie: reported, not failed")
    new_salt_cached: int | None = Field(
        None, description="cached_tokens of the same prompt under a new cache_salt after the hits (must be 0)"
    )
    new_salt_checked: bool = Field(False, description="The new-salt request was sent (prompts that can hit)")
    cold_again: Comparison | None = Field(None, description="The new-salt (second cold) run against the first")


class PrefixCacheReport(BaseModel):
    layout: CacheLayout
    logprobs_expected: Literal["bit-identical", "close"]
    max_logprob_diff_allowed: float
    prompts: list[PromptReport]
    tie_tolerance: float = Field(DEFAULT_TOLERANCE, description="A flip within this margin is a tie")
    defaults: str | None = Field(None, description="How the prompt lengths were derived, when the recipe names none")

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
        hits_from_request=hits_from_request(config),
        source="server /metrics",
    )


def hits_from_request(config: dict[str, str]) -> int:
    """In vLLM's hybrid 'align' mode a prefix is served from the cache from the third identical request."""
    return 3 if config.get("mamba_cache_mode") == "align" else 2


def default_prompt_tokens(
    max_model_len: int, answer_tokens: int, block_size: int | None, shortest: int, windows: list[int] = ()  # type: ignore[assignment]
) -> list[int]:
    """Prompt lengths for a recipe that names none, from what the server says: one shorter than a block (it must
    never hit), one just past a block boundary, then a geometric ladder to the context's end (never on a block
    boundary, so each has a partial last block), plus one past each sliding window and past twice it (a hit there
    must restore the window's blocks, not just the first ones)."""
    limit = max_model_len - answer_tokens
    if limit < shortest:
        return []
    block = block_size or 16
    lengths: set[int] = set()
    if shortest < block:
        lengths.add(max(shortest, block - max(1, block // 16)))
    start = max(shortest, 2 * block + max(1, block // 12))
    if start <= limit:
        lengths.add(start)
    for window in windows:
        for length in (window + block // 2 + 1, 2 * window + block // 2 + 1):
            if start < length <= limit:
                lengths.add(length)
    rungs = max(2, DEFAULT_PROMPTS - len(lengths))
    low = max(start, 3 * block)
    for i in range(1, rungs + 1):
        length = int(low * (limit / low) ** (i / rungs)) if limit > low else limit
        if length % block == 0:
            length -= max(1, block // 3)
        if shortest <= length <= limit:
            lengths.add(length)
    return sorted(lengths)


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
        divergence=None if tokens_identical or not (cold.tokens or later.tokens) else divergence(cold, later, shared),
    )


def _at(answer: Answer, index: int) -> tuple[str | None, float | None, list[tuple[str, float]]]:
    token = answer.tokens[index] if index < len(answer.tokens) else None
    logprob = answer.logprobs[index] if index < len(answer.logprobs) else None
    top = answer.top[index] if index < len(answer.top) else []
    return token, logprob, top


def _margin(own: float | None, top: list[tuple[str, float]], other: str | None) -> tuple[float | None, float | None]:
    """own logprob minus the other token's in the same run's top-k; else (None, a lower bound on it)."""
    if own is None or other is None:
        return None, None
    found = next((lp for token, lp in top if token == other), None)
    if found is not None:
        return own - found, None
    return None, (own - min(lp for _, lp in top)) if top else None


def divergence(cold: Answer, later: Answer, index: int) -> Divergence:
    """Both runs at the first token where they part (not yet judged: see `judge_flip`)."""
    cold_token, cold_lp, cold_top = _at(cold, index)
    later_token, later_lp, later_top = _at(later, index)
    cold_margin, at_least = _margin(cold_lp, cold_top, later_token)
    later_margin, _ = _margin(later_lp, later_top, cold_token)
    return Divergence(
        index=index, cold_token=cold_token, later_token=later_token, cold_top=cold_top, later_top=later_top,
        cold_margin=cold_margin, cold_margin_at_least=at_least, later_margin=later_margin,
    )


def _readable(
    endpoint: Endpoint, flip: Divergence, cold: Answer, messages: list[dict[str, str]], referee: Referee | None
) -> Divergence:
    """Token ids ('token_id:N') shown as text, and the reference's verdict on the two ids when there is one."""
    cache: dict[int, str] = {}

    def text(token: str | None) -> str | None:
        number = token_id(token)
        if number is None:
            return token
        if number not in cache:
            try:
                cache[number] = endpoint.detokenize([number])
            except CookbookError:
                cache[number] = token or ""
        return cache[number]

    cold_id, later_id = token_id(flip.cold_token), token_id(flip.later_token)
    shown = flip.model_copy(update={
        "cold_token": text(flip.cold_token), "later_token": text(flip.later_token),
        "cold_top": [(text(t) or "", lp) for t, lp in flip.cold_top],
        "later_top": [(text(t) or "", lp) for t, lp in flip.later_top],
        "cold_token_id": cold_id, "later_token_id": later_id,
    })
    if referee is not None and cold_id is not None and later_id is not None:
        before = [token_id(t) for t in cold.tokens[: flip.index]]
        if all(t is not None for t in before):
            prefix = chat_prompt_ids(endpoint, messages) + [t for t in before if t is not None]
            shown.reference = referee(prefix, cold_id, later_id)
    return shown


def judge_flip(flip: Divergence, tolerance: float, no_reference: str = "") -> Divergence:
    """With a reference's verdict: a tie when the reference puts the two tokens within the dtype's tie margin, a
    fail when it ranks the later token clearly lower. Without one: a tie when the cold run itself had the two
    tokens within `tolerance` of each other, clearly lower when it ranked the later token further below (or
    outside its top-k by more than that)."""
    if flip.reference is not None and flip.reference.verdict != "same":
        ref = flip.reference
        return flip.model_copy(update={
            "verdict": "tie" if ref.verdict == "tie" else "clearly lower",
            "tolerance": ref.tolerance,
            "judged_by": f"the reference ({ref.source}): {ref.note}",
        })
    judged = flip.model_copy(update={"tolerance": tolerance})
    judged.judged_by = f"the cold run's own top-{TOP_K} margin, no reference" + (f" ({no_reference})" if no_reference else "")
    if flip.cold_token is None or flip.later_token is None:
        judged.judged_by = "one answer ended here; the cold run's top-k cannot rank the end of an answer"
        return judged
    if flip.cold_margin is not None:
        judged.verdict = "tie" if flip.cold_margin <= tolerance else "clearly lower"
    elif flip.cold_margin_at_least is not None and flip.cold_margin_at_least > tolerance:
        judged.verdict = "clearly lower"
    return judged


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
    referee: Referee | None = None,
) -> tuple[PromptReport, dict[str, Any]]:
    """Cold, then the same salted request until the first that should hit; returns the report and the request."""
    cell = f"{seed}:prefix-cache:{target_tokens}"
    haystack = build_haystack(endpoint, target_tokens, NEEDLE_DEPTH, make_needle(cell), seed=cell)
    salt = new_salt()
    body = request_body(endpoint, haystack.messages, salt, max_tokens, token_ids=True)
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
    for comparison, later in zip(comparisons, answers[1:]):
        if comparison.divergence is not None:
            comparison.divergence = _readable(endpoint, comparison.divergence, cold, haystack.messages, referee)
    cached = [a.cached_tokens for a in answers]
    prompt_tokens = cold.prompt_tokens or haystack.prompt_tokens
    problems = _cache_problems(layout, prompt_tokens, cached, layout.hits_from_request)
    for number, (value, delta) in enumerate(zip(cached, deltas), 1):
        if value and delta is not None and delta < value:
            problems.append(
                f"request {number} reported {value} cached tokens but {HITS_METRIC} moved by only {delta:g}"
            )
    fresh: Answer | None = None
    if layout.enabled and layout.longest_hit(prompt_tokens):
        # The cold runs trust cache_salt; prove it: after the hits, the same prompt under a new salt must be cold.
        fresh = ask(endpoint, {**body, "cache_salt": new_salt()}, timeout)
        if fresh.cached_tokens:
            problems.append(
                f"server ignores cache_salt: the same prompt under a new cache_salt, after the hits, reported "
                f"{fresh.cached_tokens} cached tokens (must be 0)"
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
        new_salt_cached=fresh.cached_tokens if fresh else None,
        new_salt_checked=fresh is not None,
        cold_again=compare(cold, fresh) if fresh else None,
    )
    return report, body


def _judge(
    report: PromptReport, expected: str, allowed: float, tie_tolerance: float | None = None, no_reference: str = ""
) -> None:
    """Add each later request's problems under the recipe's expectation (a hit may come before the one
    `hits_from_request` names: every request after the cold one must match it). A text that parts from the cold
    run on a near-tie is a tie (reported with its margin); with 'bit-identical' it still fails on the logprobs."""
    tolerance = allowed if tie_tolerance is None else tie_tolerance
    for number, comparison in enumerate(report.comparisons, 2):
        cached = report.cached_tokens[number - 1]
        what = f"request {number} ({f'a hit, {cached} cached' if cached else 'not a hit'})"
        flip = comparison.divergence
        if flip is not None:
            flip = comparison.divergence = judge_flip(flip, tolerance, no_reference)
        if not comparison.text_identical:
            said = f"{what} answered {report.texts[number - 1]!r}, the cold run {report.texts[0]!r}"
            if flip is not None and flip.verdict == "tie":
                report.ties.append(f"{what}: {flip.describe()}")
            else:
                report.problems.append(f"{said}; {flip.describe()}" if flip is not None else said)
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
    tie_tolerance: float | None = None,
    referee: Referee | None = None,
    no_reference: str = "",
    progress: Callable[[str], None] | None = None,
) -> tuple[PrefixCacheReport, list[Evidence]]:
    """Run the probe on prompts of the given lengths (in this model's tokens); evidence for each failing prompt
    (and for each flip on a near-tie, so a reader sees both runs' top-k there). `progress` hears of each prompt."""
    reports: list[PromptReport] = []
    evidence: list[Evidence] = []
    tolerance = tie_tolerance if tie_tolerance is not None else (max_logprob_diff or DEFAULT_TOLERANCE)
    for number, target in enumerate(prompt_tokens, 1):
        if progress:
            progress(f"prompt {number}/{len(prompt_tokens)} ({target:,} tokens)")
        report, body = probe_prompt(endpoint, target, layout, max_tokens, timeout_s, seed, referee)
        why_none = no_reference or str(getattr(referee, "why_none", "") or "")
        _judge(report, logprobs, max_logprob_diff, tolerance, why_none)
        reports.append(report)
        if report.problems or report.ties:
            flips = [c.divergence.model_dump() for c in report.comparisons if c.divergence is not None]
            notes = report.problems + [f"tie (not a fail): {t}" for t in report.ties]
            evidence.append(
                Evidence(
                    request=body_excerpt(body),
                    response={
                        "cached_tokens": report.cached_tokens,
                        "new_salt_cached_tokens": report.new_salt_cached,
                        "texts": report.texts,
                        "max_logprob_diff": report.comparison.max_logprob_diff,
                        "first_divergence": flips,
                    },
                    note=f"{report.prompt_tokens}-token prompt: " + "; ".join(notes),
                )
            )
    full = PrefixCacheReport(
        layout=layout, logprobs_expected=logprobs, max_logprob_diff_allowed=max_logprob_diff, prompts=reports,
        tie_tolerance=tolerance,
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
    ties = sum(bool(p.ties) for p in prompts)
    if ties:
        head += (
            f" ({ties} flip{'s' if ties > 1 else ''} on a near-tie, within {report.tie_tolerance:g} of the cold run's "
            "top token)"
        )
    layout = report.layout
    salt_bad = sum(any(_is_salt_problem(m) for m in p.problems) for p in prompts)
    salt_checked = sum(p.new_salt_checked for p in prompts)
    cache_bad = sum(any(_is_cache_problem(m) and not _is_salt_problem(m) for m in p.problems) for p in prompts)
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
    if salt_bad:
        tail += f"; server ignores cache_salt: a new salt hit on {salt_bad} of {salt_checked} prompts"
    elif salt_checked:
        tail += "; the same prompt under a new `cache_salt` ran cold after every hit"
    return f"{head}; {tail}"


def _is_salt_problem(message: str) -> bool:
    return message.startswith("server ignores cache_salt")


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


def _layout(ctx: CheckContext, served: ServedModel) -> tuple[CacheLayout, list[str]]:
    """The recipe's layout when there is a recipe (checked against the server's), else the server's own. What the
    recipe leaves out (block size, the hybrid's third-request hit) comes from the server."""
    server = served.cache_config or None
    if ctx.recipe is None:
        if server is None:
            raise CookbookError("prefix-cache: no recipe and no vllm:cache_config_info in /metrics to learn the layout")
        layout = layout_from_server(server)
        layout.sliding_windows = list(served.sliding_windows)
        return layout, []
    caching = ctx.recipe.prefix_caching
    seen = layout_from_server(server) if server is not None else None
    block = caching.block_size if caching.block_size is not None else (seen.block_size if seen else None)
    hits_from = caching.hits_from_request
    if "hits_from_request" not in caching.model_fields_set and seen is not None:
        hits_from = seen.hits_from_request
    layout = CacheLayout(
        enabled=caching.enabled,
        block_size=block,
        hits_from_request=hits_from,
        source="recipe" if caching.block_size is not None else "recipe, block size from server /metrics",
        sliding_windows=list(served.sliding_windows),
    )
    mismatches: list[str] = []
    if seen is not None:
        if seen.enabled != layout.enabled:
            mismatches.append(f"the recipe has prefix caching {'on' if layout.enabled else 'off'}, the server not")
        elif layout.enabled and seen.block_size != layout.block_size:
            mismatches.append(f"the recipe says {layout.block_size}-token blocks, the server reports {seen.block_size}")
    elif layout.enabled and layout.block_size is None:
        raise CookbookError(
            "prefix-cache: the recipe gives no prefix_caching.block_size and the server's /metrics has no "
            "vllm:cache_config_info to read it from"
        )
    return layout, mismatches


def tie_tolerance(ctx: CheckContext, served: ServedModel) -> float:
    """Margin within which a flip is a tie: the recipe's allowed logprob difference when it gives one, else the
    dtype's (recipe precision, else the served config.json)."""
    expectation = ctx.recipe.verification.prefix_cache if ctx.recipe else None
    if expectation is not None and expectation.logprobs == "close" and expectation.max_logprob_diff > 0:
        return expectation.max_logprob_diff
    dtype = ctx.recipe.precision.dtype if ctx.recipe else served.dtype
    return DTYPE_TOLERANCE.get(str(dtype).lower(), DEFAULT_TOLERANCE)


class LazyReferee:
    """Asks the numerics oracle's reference (cookbook.reference) about a flip, loading it only when a flip happens:
    the recipe's golden file when it knows the prompt, else a forward pass computed here, else none (and why)."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.why_none = ""
        self._refs: list[Any] | None = None

    def _references(self) -> list[Any]:
        if self._refs is None:
            from ..reference import reference_for

            self._refs = []
            reasons = []
            for wanted in ("", "computed"):
                ctx = CheckContext(self.ctx.endpoint, self.ctx.recipe, params={**self.ctx.params, "reference": wanted})
                try:
                    ref, why = reference_for(ctx)
                except CookbookError as exc:
                    ref, why = None, str(exc)
                if ref is not None and all(ref is not r for r in self._refs):
                    self._refs.append(ref)
                elif ref is None:
                    reasons.append(why)
            self.why_none = "; ".join(dict.fromkeys(reasons)) or "no reference"
        return self._refs

    def __call__(self, prefix: list[int], cold_id: int, later_id: int) -> ReferenceVerdict | None:
        from ..reference import judge_divergence
        from .oracle import tolerance_for

        tolerance = tolerance_for(self.ctx)[0].tie_margin
        for ref in self._references():
            if not ref.can_score(prefix):
                self.why_none = f"{ref.source} cannot score this prompt"
                continue
            try:
                position = ref.score(prefix, 1, TOP_K).greedy[0]
            except CookbookError as exc:
                self.why_none = f"the reference failed: {exc}"
                continue
            verdict = judge_divergence(position, cold_id, later_id, tolerance)
            return ReferenceVerdict(
                verdict=verdict.verdict, margin=verdict.margin, tolerance=tolerance, note=verdict.note,
                source=ref.source,
            )
        if not self._refs and not self.why_none:
            self.why_none = "no reference"
        return None


def _shortest_prompt(endpoint: Endpoint) -> int:
    """The longest needle frame (instruction, needle, question, template) with this tokenizer, plus a margin."""
    return frame_tokens(endpoint, longest_frame_needle()) + 4


@check(
    "prefix-cache",
    "Prefix-cache hit vs cold (`cache_salt`), greedy, prompts with a needle",
    group="long-context",
)
def prefix_cache(ctx: CheckContext) -> CheckOutcome:
    """Hit against cold per prompt; lengths from params['prefix_cache_prompt_tokens'], the recipe, or else derived
    from the served context, block size and sliding windows."""
    recipe = ctx.recipe
    expectation = recipe.verification.prefix_cache if recipe else None
    served = served_model(ctx.endpoint)
    layout, mismatches = _layout(ctx, served)
    context = served.max_model_len
    lengths = ctx.params.get("prefix_cache_prompt_tokens") or (expectation.prompt_tokens if expectation else None)
    derived = None
    if not lengths:
        shortest = _shortest_prompt(ctx.endpoint)
        lengths = default_prompt_tokens(context, ctx.max_tokens, layout.block_size, shortest, layout.sliding_windows)
        windows = ", ".join(str(w) for w in layout.sliding_windows) or "none"
        derived = (
            f"no prompt lengths in the recipe: derived from the served context {context:,}, block "
            f"{layout.block_size}, sliding windows {windows}, shortest prompt {shortest} tokens"
        )
        if not lengths:
            raise CookbookError(f"prefix-cache: a {context}-token context leaves no room for a prompt with a needle")
    if expectation is not None:
        logprobs, allowed = expectation.logprobs, expectation.max_logprob_diff
    else:  # a recipe that says nothing: close within the dtype's tolerance (bit-identity is opted into)
        logprobs, allowed = "close", tie_tolerance(ctx, served)
    fitted = fit_lengths(list(lengths), context, ctx.max_tokens)
    referee = LazyReferee(ctx) if ctx.params.get("reference") != "none" else None
    report, evidence = probe_prefix_cache(
        ctx.endpoint,
        fitted,
        layout,
        logprobs=logprobs,
        max_logprob_diff=allowed,
        max_tokens=ctx.max_tokens,
        timeout_s=ctx.request_timeout_s,
        seed=seed_param(ctx.params),
        tie_tolerance=tie_tolerance(ctx, served),
        referee=referee,
        no_reference="" if referee is not None else "reference turned off (params reference=none)",
        progress=ctx.report,
    )
    report.defaults = derived
    text = result_text(report)
    for mismatch in mismatches:
        evidence.append(Evidence(note=mismatch))
    if mismatches:
        text += "; " + "; ".join(mismatches)
    details = report.model_dump()
    details["max_model_len"] = context
    details["served"] = served.model_dump()
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
