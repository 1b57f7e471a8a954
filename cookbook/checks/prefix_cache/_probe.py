"""The prefix-cache probe itself: per prompt a cold request, the same salted request until a hit, a new salt; each
later answer against the cold one by the probe kit's one rule (a departure the model's reference calls a near-tie
is the kernels' numerics, not a wrong cache state)."""
from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ...completions import Trace, maybe_token_id
from ...endpoint import Endpoint
from ...errors import CookbookError
from ...haystack import (
    Answer,
    ask,
    body_excerpt,
    build_haystack,
    chat_prompt_ids,
    make_needle,
    new_salt,
    request_body,
    request_timeout,
)
from ...results import Evidence
from ..kit import Departure, Drift, Referee, Tolerances, compare_traces
from ._layout import HITS_METRIC, CacheLayout, hits_delta, read_hits

NEEDLE_DEPTH = 0.5


class Comparison(BaseModel):
    """A later answer against the cold one."""

    text_identical: bool
    tokens_identical: bool
    bit_identical: bool = Field(description="Same tokens and every logprob equal to the last bit")
    max_logprob_diff: float | None = Field(description="Max |later - cold| over the tokens both share; None if none")
    compared_tokens: int = Field(description="Leading tokens both answers share, whose logprobs were compared")
    logprobs_returned: bool = Field(description="Both responses carried logprobs.content")
    departure: Departure | None = Field(None, description="Where the tokens part, both runs' and the reference's view")
    drift: Drift | None = Field(None, description="The shared tokens' logprobs: within, noise or fail")


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
    judge: str = Field("", description="Who judged departures: the reference, or both runs' own top-k and why")
    defaults: str | None = Field(None, description="How the prompt lengths were derived, when the recipe names none")

    @property
    def passed(self) -> bool:
        return bool(self.prompts) and not any(p.problems for p in self.prompts)


def trace_of(answer: Answer, names: dict[str, int]) -> Trace:
    """An answer as the kit's Trace. Tokens named `token_id:N` keep their id; a token named by its text (a server
    that ignored return_tokens_as_token_ids) gets a negative id from `names`, shared by the runs compared, which no
    reference can score: such a departure is judged by the runs' own top-k."""
    def number(token: str) -> int:
        found = maybe_token_id(token)
        return found if found is not None else names.setdefault(token, -1 - len(names))

    return Trace(token_ids=[number(t) for t in answer.tokens], logprobs=list(answer.logprobs),
                 top=[{number(t): lp for t, lp in step} for step in answer.top])


def compare(
    cold: Answer,
    later: Answer,
    tol: Tolerances | None = None,
    prompt: list[int] | None = None,
    referee: Referee | None = None,
    strict: bool = False,
) -> Comparison:
    """Text, tokens and logprobs of a later answer against the cold one, token by token; a departure and the shared
    tokens' logprobs judged by the kit's one rule (`prompt` and `referee` let the model's reference judge)."""
    from ..kit import tolerances

    shared = 0
    for cold_token, later_token in zip(cold.tokens, later.tokens):
        if cold_token != later_token:
            break
        shared += 1
    diffs = [abs(a - b) for a, b in zip(cold.logprobs[:shared], later.logprobs[:shared])]
    tokens_identical = cold.tokens == later.tokens and bool(cold.tokens)
    comparison = Comparison(
        text_identical=cold.text == later.text and cold.reasoning == later.reasoning,
        tokens_identical=tokens_identical,
        bit_identical=tokens_identical and cold.logprobs == later.logprobs,
        max_logprob_diff=max(diffs) if diffs else None,
        compared_tokens=shared,
        logprobs_returned=bool(cold.logprobs) and bool(later.logprobs),
    )
    if cold.tokens and later.tokens and cold.logprobs and later.logprobs:
        names: dict[str, int] = {}
        a, b = trace_of(cold, names), trace_of(later, names)
        scorable = prompt if not names else None
        judged = compare_traces("", a, b, scorable, referee, tol or tolerances(None), drift_allowed="hit",
                                strict_logprobs=strict, baseline_name="the cold run")
        comparison.departure, comparison.drift = judged.departure, judged.drift
    return comparison


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
    tol: Tolerances,
    referee: Referee | None = None,
    strict: bool = False,
    check_salt: bool = True,
) -> tuple[PromptReport, dict[str, Any]]:
    """Cold, then the same salted request until the first that should hit, then (`check_salt`) the same prompt
    under a new salt; returns the report and the request."""
    cell = f"{seed}:prefix-cache:{target_tokens}"
    haystack = build_haystack(endpoint, target_tokens, NEEDLE_DEPTH, make_needle(cell), seed=cell)
    salt = new_salt()
    body = request_body(endpoint, haystack.messages, salt, max_tokens, token_ids=True)
    timeout = request_timeout(timeout_s, haystack.prompt_tokens, endpoint.prefill_pace)
    answers: list[Answer] = []
    deltas: list[float | None] = []
    for _ in range(layout.hits_from_request):
        before = read_hits(endpoint)
        answer = ask(endpoint, body, timeout)
        deltas.append(hits_delta(endpoint, before, answer.cached_tokens or 0))
        answers.append(answer)
    cold = answers[0]
    prompt_ids: list[int] | None = None
    if any(later.tokens != cold.tokens or later.logprobs != cold.logprobs for later in answers[1:]):
        prompt_ids = chat_prompt_ids(endpoint, haystack.messages)
    comparisons = [compare(cold, later, tol, prompt_ids, referee, strict) for later in answers[1:]]
    cached = [a.cached_tokens for a in answers]
    prompt_tokens = cold.prompt_tokens or haystack.prompt_tokens
    problems = _cache_problems(layout, prompt_tokens, cached, layout.hits_from_request)
    for number, (value, delta) in enumerate(zip(cached, deltas), 1):
        if value and delta is not None and delta < value:
            problems.append(
                f"request {number} reported {value} cached tokens but {HITS_METRIC} moved by only {delta:g}"
            )
    fresh: Answer | None = None
    if check_salt and layout.enabled and layout.longest_hit(prompt_tokens):
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
        cold_again=compare(cold, fresh, tol) if fresh else None,
    )
    return report, body


def _judge(report: PromptReport, expected: str, allowed: float, tokens: Callable[[int], str] | None = None) -> None:
    """Add each later request's problems under the recipe's expectation (a hit may come before the one
    `hits_from_request` names: every request after the cold one must match it). A text that parts from the cold
    run where the kit's rule finds a near-tie (or the cold run the one off) is a tie, reported with its margins;
    with 'bit-identical' it still fails on the logprobs. `tokens` shows a token id as text."""
    for number, comparison in enumerate(report.comparisons, 2):
        cached = report.cached_tokens[number - 1]
        what = f"request {number} ({f'a hit, {cached} cached' if cached else 'not a hit'})"
        departure = comparison.departure
        described = _described(departure, tokens) if departure is not None else None
        if not comparison.text_identical:
            said = f"{what} answered {report.texts[number - 1]!r}, the cold run {report.texts[0]!r}"
            if departure is not None and not departure.failed:
                report.ties.append(f"{what}: {described}")
            else:
                report.problems.append(f"{said}; {described}" if described else said)
        diff = comparison.max_logprob_diff
        if not comparison.logprobs_returned:
            report.problems.append(f"{what}: no logprobs to compare (a response had no logprobs.content)")
        elif expected == "bit-identical" and not comparison.bit_identical:
            report.problems.append(
                f"{what}: logprobs not bit-identical to the cold run (max diff {diff if diff is not None else 0:.3g})"
            )
        elif expected == "close" and comparison.drift is not None and comparison.drift.verdict == "fail":
            note = f"; {comparison.drift.note}" if comparison.drift.note else ""
            report.problems.append(
                f"{what}: logprobs differ from the cold run by {diff or 0.0:.3g} (allowed {allowed:g}){note}"
            )


def _described(departure: Departure, tokens: Callable[[int], str] | None) -> str:
    text = departure.describe()
    if tokens is None:
        return text
    shown = [f"{t} = {tokens(t)!r}" for t in (departure.baseline_token, departure.run_token) if t is not None and t >= 0]
    return f"{text} [{', '.join(shown)}]" if shown else text


def token_text(endpoint: Endpoint) -> Callable[[int], str]:
    """Token id -> its text on this server (for a reader), memoised; the id itself when /detokenize fails."""
    cache: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in cache:
            try:
                cache[token] = endpoint.detokenize([token])
            except CookbookError:
                cache[token] = f"token_id:{token}"
        return cache[token]

    return text


def salt_prompts(prompt_tokens: list[int], layout: CacheLayout, on: Literal["shortest", "every"] = "shortest") -> set[int]:
    """The prompts whose new-salt request proves that `cache_salt` isolates. A second cold prefill repeats the first
    one's work (the longest prompt's alone took 20 s of the SmolLM2 probe's 85), and a server that ignores the salt
    ignores it on any prompt that can hit: 'shortest' sends it for the two shortest of those (one and two cached
    blocks or more); 'every' for each."""
    can_hit = sorted(t for t in prompt_tokens if layout.enabled and layout.longest_hit(t))
    return set(can_hit) if on == "every" else set(can_hit[:2])


def probe_prefix_cache(
    endpoint: Endpoint,
    prompt_tokens: list[int],
    layout: CacheLayout,
    tol: Tolerances,
    logprobs: Literal["bit-identical", "close"] = "bit-identical",
    max_tokens: int = 64,
    timeout_s: float = 60.0,
    seed: int | str = 0,
    referee: Referee | None = None,
    progress: Callable[[str], None] | None = None,
    new_salt_on: Literal["shortest", "every"] = "shortest",
) -> tuple[PrefixCacheReport, list[Evidence]]:
    """Run the probe on prompts of the given lengths (in this model's tokens); evidence for each failing prompt
    (and for each departure on a near-tie, so a reader sees both runs' top-k and the reference's margin there).
    `progress` hears of each prompt. 'close' allows `tol.hit_drift`; 'bit-identical' nothing. `new_salt_on`: which
    prompts also prove that a new salt runs cold (`salt_prompts`)."""
    reports: list[PromptReport] = []
    evidence: list[Evidence] = []
    allowed = tol.hit_drift.value if logprobs == "close" else 0.0
    shown = token_text(endpoint)
    salted = salt_prompts(prompt_tokens, layout, new_salt_on)
    for number, target in enumerate(prompt_tokens, 1):
        if progress:
            progress(f"prompt {number}/{len(prompt_tokens)} ({target:,} tokens)")
        report, body = probe_prompt(endpoint, target, layout, max_tokens, timeout_s, seed, tol, referee,
                                    strict=logprobs == "bit-identical", check_salt=target in salted)
        _judge(report, logprobs, allowed, shown)
        reports.append(report)
        if report.problems or report.ties:
            departures = [c.departure.model_dump() for c in report.comparisons if c.departure is not None]
            notes = report.problems + [f"tie (not a fail): {t}" for t in report.ties]
            evidence.append(
                Evidence(
                    request=body_excerpt(body),
                    response={
                        "cached_tokens": report.cached_tokens,
                        "new_salt_cached_tokens": report.new_salt_cached,
                        "texts": report.texts,
                        "max_logprob_diff": report.comparison.max_logprob_diff,
                        "first_departure": departures,
                    },
                    note=f"{report.prompt_tokens}-token prompt: " + "; ".join(notes),
                )
            )
    full = PrefixCacheReport(
        layout=layout, logprobs_expected=logprobs, max_logprob_diff_allowed=allowed, prompts=reports,
        judge=referee.describe() if referee is not None else "both runs' own top-k (reference turned off)",
    )
    return full, evidence
