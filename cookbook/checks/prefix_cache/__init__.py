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

Modules: `_layout` (what the cache should do, from the recipe and /metrics), `_probe` (the requests and the
comparison, by the probe kit's one rule); this one words the result and registers the check.
"""
from __future__ import annotations

from ...errors import CookbookError
from ...haystack import fit_lengths, join_words, seed_param, served_model
from ...results import Evidence
from ..kit import Referee, tolerances, too_noisy
from ..kit.referee import REFERENCE_PARAMS
from ..kit.tolerances import PREFIX_CACHE_MAX_LOGPROB_DIFF
from ..params import DTYPE, SEED, Param
from ..registry import CheckContext, CheckInconclusive, CheckOutcome, check
from ._layout import (
    HITS_METRIC,
    CacheLayout,
    default_prompt_tokens,
    hits_from_request,
    label_for,
    layout_from_server,
    read_hits,
    recipe_layout,
    server_cache_config,
    shortest_prompt,
)
from ._probe import (
    Comparison,
    PrefixCacheReport,
    PromptReport,
    _cache_problems,
    _judge,
    combine,
    compare,
    probe_prefix_cache,
    probe_prompt,
    trace_of,
)

__all__ = [
    "HITS_METRIC",
    "CacheLayout",
    "Comparison",
    "PrefixCacheReport",
    "PromptReport",
    "combine",
    "compare",
    "default_prompt_tokens",
    "hits_from_request",
    "label_for",
    "layout_from_server",
    "probe_prefix_cache",
    "probe_prompt",
    "read_hits",
    "result_text",
    "server_cache_config",
    "trace_of",
    "_cache_problems",
    "_judge",
]


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
        by = "the reference" if report.judge.startswith("the reference") else "both runs' own top-k"
        head += f" ({ties} departure{'s' if ties > 1 else ''} on a near-tie, judged by {by})"
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
        hitting = sum(bool(layout.longest_hit(p.prompt_tokens or p.target_tokens)) for p in prompts)
        scope = "every hit" if salt_checked >= hitting else f"the hits of {salt_checked} of the {hitting} prompts that hit"
        tail += f"; the same prompt under a new `cache_salt` ran cold after {scope}"
    return f"{head}; {tail}"


def _is_salt_problem(message: str) -> bool:
    return message.startswith("server ignores cache_salt")


def _is_cache_problem(message: str) -> bool:
    return "cached tokens" in message or "did not hit" in message or HITS_METRIC in message


PREFIX_CACHE_PARAMS = (
    Param("prefix_cache_prompt_tokens", "int list", "the recipe's, else from the served context, block size and windows",
          "prompt lengths in the model's tokens", low=1, high=100_000_000),
    Param("new_salt_on", "text", "shortest", "which prompts get a new cache_salt: shortest or every",
          choices=("shortest", "every")),
    PREFIX_CACHE_MAX_LOGPROB_DIFF, SEED, DTYPE, *REFERENCE_PARAMS,
)


@check(
    "prefix-cache",
    "Prefix-cache hit vs cold (`cache_salt`), greedy, prompts with a needle",
    group="long-context",
    params=PREFIX_CACHE_PARAMS,
)
def prefix_cache(ctx: CheckContext) -> CheckOutcome:
    """Hit against cold per prompt; lengths from params['prefix_cache_prompt_tokens'], the recipe, or else derived
    from the served context, block size and sliding windows."""
    recipe = ctx.recipe
    expectation = recipe.verification.prefix_cache if recipe else None
    served = served_model(ctx.endpoint)
    layout, mismatches = recipe_layout(ctx, served)
    context = served.max_model_len
    lengths = ctx.params.get("prefix_cache_prompt_tokens") or (expectation.prompt_tokens if expectation else None)
    derived = None
    if not lengths:
        shortest = shortest_prompt(ctx.endpoint)
        lengths = default_prompt_tokens(context, ctx.max_tokens, layout.block_size, shortest, layout.sliding_windows)
        windows = ", ".join(str(w) for w in layout.sliding_windows) or "none"
        derived = (
            f"no prompt lengths in the recipe: derived from the served context {context:,}, block "
            f"{layout.block_size}, sliding windows {windows}, shortest prompt {shortest} tokens"
        )
        if not lengths:
            raise CookbookError(f"prefix-cache: a {context}-token context leaves no room for a prompt with a needle")
    # A recipe that says nothing: 'close' within the dtype's tolerance (bit-identity is a claim a recipe opts into).
    logprobs = expectation.logprobs if expectation is not None else "close"
    tol = tolerances(ctx.recipe, ctx.params, served.dtype)
    noisy = too_noisy(tol.hit_drift, tol.flip_noise) if logprobs == "close" else too_noisy(tol.flip_noise)
    if noisy:
        raise CheckInconclusive(noisy, details={"tolerances": tol.model_dump()})
    fitted = fit_lengths(list(lengths), context, ctx.max_tokens)
    referee = Referee(ctx)
    report, evidence = probe_prefix_cache(
        ctx.endpoint,
        fitted,
        layout,
        tol,
        logprobs=logprobs,
        max_tokens=ctx.max_tokens,
        timeout_s=ctx.request_timeout_s,
        seed=seed_param(ctx.params),
        referee=referee,
        progress=ctx.report,
        new_salt_on="every" if ctx.params.get("new_salt_on") == "every" else "shortest",
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
    details["tolerances"] = tol.model_dump()
    details.update(referee.details())
    details["noise"] = noise_seen(report)
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


def noise_seen(report: PrefixCacheReport) -> dict[str, float | None]:
    """What a run measured, for `cookbook calibrate` (on a clean server every departure is noise): the worst
    hit-vs-cold logprob difference, and the largest reference margin at a departure."""
    diffs = [c.max_logprob_diff for p in report.prompts for c in p.comparisons if c.max_logprob_diff is not None]
    ties = [abs(c.departure.reference_margin) for p in report.prompts for c in p.comparisons
            if c.departure is not None and c.departure.reference_margin is not None]
    return {"prefix_cache.max_logprob_diff": max(diffs) if diffs else None,
            "reference.tie_margin": max(ties) if ties else None}
