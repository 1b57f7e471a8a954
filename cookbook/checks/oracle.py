"""The numerics oracle: served logprobs against a reference forward pass of the same weights (group `oracle`).

Every other check compares the server with itself or with a known answer; this one compares it with ground truth
(`cookbook.reference`: a golden file in the recipe's folder, a forward pass computed here, or another server). For
each prompt of the set (short, crossing several KV blocks, past each sliding window, near the served context) the
served `prompt_logprobs` and greedy continuation are compared token by token with the reference's: top-1
agreement, max and mean |delta logprob| of the chosen tokens, the total-variation distance between the two top-k
lists, and the first greedy token that differs, judged by the reference (a near-tie within the dtype's tie margin
is a tie, not a fail). Tolerances per served dtype come from the recipe (`verification.oracle.tolerances`), else
the defaults below, measured on the CPU server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ServerError
from ..haystack import server_max_model_len, sliding_windows
from ..recipes import OracleTolerance
from ..reference import (
    GoldenReference,
    Layout,
    OraclePrompt,
    RefPosition,
    RefScore,
    Reference,
    Served,
    block_size_from_metrics,
    build_prompts,
    checkpoint_config,
    checkpoint_facts,
    complete_with_logprobs,
    reference_for,
    served_checkpoint,
)
from ..results import Evidence
from .kit.departure import Ranking, rank_by_reference
from .kit.tolerances import (REFERENCE_DEFAULTS, REFERENCE_MAX, REFERENCE_MEAN, REFERENCE_TIE, REFERENCE_TOPK,
                              reference_tolerance)
from .kit.tolerances import MEAN_Z, Tolerance, mean_bound, too_noisy
from .kit.referee import REFERENCE, REFERENCE_CHECKPOINT, REFERENCE_MODEL
from .params import DTYPE, Param
from .registry import CheckContext, CheckFailed, CheckInconclusive, CheckOutcome, CheckSkipped, check

LABEL = "Logprobs against a reference forward pass (cookbook's own check)"

DEFAULT_TOLERANCES = REFERENCE_DEFAULTS  # the served dtype's defaults live with every other tolerance
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_TOP_K = 5
EVIDENCE_POSITIONS = 3


def tolerance_for(ctx: CheckContext) -> tuple[OracleTolerance, str]:
    """The recipe's tolerance for its served dtype (calibrated values on top), else the cookbook's default."""
    return reference_tolerance(ctx.recipe, ctx.params)


# -- comparing one prompt ---------------------------------------------------------------------------------------------


def topk_divergence(ref_top: dict[int, float], served_top: dict[int, float]) -> float:
    """Total-variation distance over the union of both top-k lists (0: same, 1: disjoint). A token missing from one
    side's list is counted at that side's lowest listed probability, the most it can be."""
    if not ref_top or not served_top:
        return 0.0
    ref_floor, served_floor = min(ref_top.values()), min(served_top.values())
    total = 0.0
    for token in set(ref_top) | set(served_top):
        p_ref = math.exp(ref_top.get(token, ref_floor))
        p_served = math.exp(served_top.get(token, served_floor))
        total += abs(p_ref - p_served)
    return min(1.0, total / 2)


def margin_drift(ref: RefPosition, served_top: dict[int, float]) -> float:
    """The most the served margin between the reference's top token and another token both top-k lists hold departs
    from the reference's margin: the noise that decides whether two candidates can swap (a flip needs a reference
    margin below it), so what a clean run shows of it is what `tie_margin` must cover."""
    top = ref.argmax
    if top not in served_top or top not in ref.top:
        return 0.0
    return max((abs((served_top[top] - served_top[t]) - (ref.top[top] - ref.top[t]))
                for t in ref.top if t != top and t in served_top), default=0.0)


@dataclass
class PositionDiff:
    where: str  # "prompt" or "greedy"
    index: int  # position in the prompt, or greedy step
    token: int
    served: float
    reference: float
    delta: float
    divergence: float
    margin_drift: float = 0.0  # see margin_drift()


@dataclass
class PromptComparison:
    """One prompt's comparison: per-position differences, top-1 agreement, ties, the greedy verdict."""

    prompt: OraclePrompt
    diffs: list[PositionDiff] = field(default_factory=list)
    top1_agree: int = 0
    top1_ties: list[tuple[int, float | None]] = field(default_factory=list)  # (position, reference margin)
    top1_flips: list[tuple[int, str]] = field(default_factory=list)  # clear disagreements: (position, note)
    greedy_same: int = 0
    greedy_total: int = 0
    greedy_verdict: str = "same"
    greedy_note: str = ""
    greedy_tie_margin: float | None = None  # the reference's margin at a greedy near-tie flip
    served_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def top1_positions(self) -> int:
        return self.top1_agree + len(self.top1_ties) + len(self.top1_flips)

    def worst(self, n: int = EVIDENCE_POSITIONS) -> list[PositionDiff]:
        return sorted(self.diffs, key=lambda d: -d.delta)[:n]

    def first_over(self, limit: float) -> PositionDiff | None:
        return next((d for d in self.diffs if d.where == "prompt" and d.delta > limit), None)


def compare_prompt(
    prompt: OraclePrompt, served: Served, ref: RefScore, tol: OracleTolerance, reference: Reference
) -> PromptComparison:
    out = PromptComparison(prompt, served_seconds=served.seconds)
    ids = prompt.prompt_ids
    # Prompt positions (teacher-forced on both sides): the prompt token's logprob, the argmax, the top-k.
    for i in range(1, len(ids)):
        ref_pos = ref.prompt[i] if i < len(ref.prompt) else None
        served_lp = served.prompt_logprobs[i]
        if ref_pos is None or served_lp is None:
            continue
        _top1(out, i, ref_pos, served.prompt_rank1[i], tol)
        out.diffs.append(
            PositionDiff("prompt", i, ids[i], served_lp, ref_pos.logprob, abs(served_lp - ref_pos.logprob),
                         topk_divergence(ref_pos.top, served.prompt_top[i]), margin_drift(ref_pos, served.prompt_top[i]))
        )
    # Greedy continuation: equal token by token until the first difference, judged there by the reference.
    ref_ids = ref.greedy_ids
    n = min(len(served.tokens), len(ref_ids))
    out.greedy_total = n
    for step in range(n):
        ref_pos = ref.greedy[step]
        token = served.tokens[step]
        if token != ref_pos.token_id:
            verdict = _rank(ref_pos, ref_pos.token_id, token, tol)
            out.greedy_verdict = "fail" if verdict.failed else "tie"
            out.greedy_note = f"greedy step {step}: served token {token}, reference {ref_pos.token_id}; {verdict.note}"
            out.greedy_tie_margin = None if verdict.failed else verdict.margin
            if verdict.verdict == "tie":
                _after_tie(out, prompt, served, step, reference, tol)
            break
        out.greedy_same += 1
        out.diffs.append(
            PositionDiff("greedy", step, token, served.logprobs[step], ref_pos.logprob,
                         abs(served.logprobs[step] - ref_pos.logprob), topk_divergence(ref_pos.top, served.top[step]),
                         margin_drift(ref_pos, served.top[step]))
        )
    return out


def _rank(ref_pos: RefPosition, expected: int, other: int, tol: OracleTolerance) -> Ranking:
    """The kit's one rule with the reference as the baseline (its own argmax is `expected`)."""
    ranking = rank_by_reference(ref_pos, expected, other, tol.tie_margin)
    if ranking is None:  # the reference's own token is always in its top-k; a malformed position is not a tie
        return Ranking(verdict="fail", margin=None, bound="exact", note=f"token {other}: neither token in the reference's top-k")
    return ranking


def _top1(out: PromptComparison, i: int, ref_pos: RefPosition, served_argmax: int | None, tol: OracleTolerance) -> None:
    if served_argmax is None or served_argmax == ref_pos.argmax:
        out.top1_agree += 1
        return
    verdict = _rank(ref_pos, ref_pos.argmax, served_argmax, tol)
    if not verdict.failed:
        out.top1_ties.append((i, verdict.margin))
    else:
        out.top1_flips.append((i, verdict.note))


def _after_tie(
    out: PromptComparison, prompt: OraclePrompt, served: Served, step: int, reference: Reference, tol: OracleTolerance
) -> None:
    """After a tie the two continuations part; a reference that can score any ids (computed, another server) scores
    the served continuation itself, so its remaining tokens are still compared."""
    continued = prompt.prompt_ids + served.tokens
    if isinstance(reference, GoldenReference) or not reference.can_score(continued):
        out.notes.append(f"greedy compared up to the tie at step {step} (a golden file holds only its own continuation)")
        return
    forced = reference.score(continued, 0, len(next(iter(served.top), {})) or DEFAULT_TOP_K)
    base = len(prompt.prompt_ids)
    for j in range(step, len(served.tokens)):
        ref_pos = forced.prompt[base + j]
        if ref_pos is None:
            continue
        out.diffs.append(
            PositionDiff("greedy", j, served.tokens[j], served.logprobs[j], ref_pos.logprob,
                         abs(served.logprobs[j] - ref_pos.logprob), topk_divergence(ref_pos.top, served.top[j]),
                         margin_drift(ref_pos, served.top[j]))
        )
        if served.tokens[j] != ref_pos.argmax:
            verdict = _rank(ref_pos, ref_pos.argmax, served.tokens[j], tol)
            if verdict.failed:
                out.greedy_verdict = "fail"
                out.greedy_note += f"; then at greedy step {j} (reference scoring the served continuation): {verdict.note}"
                return
    out.notes.append(f"greedy: after the tie at step {step}, the reference scored the served continuation")


# -- the check ----------------------------------------------------------------------------------------------------------


def _layout(ctx: CheckContext) -> Layout:
    config, config_from = checkpoint_config(ctx.recipe, served_checkpoint(ctx))
    block = block_size_from_metrics(ctx.endpoint)
    return Layout(
        block_size=block,
        windows=sliding_windows(config),
        max_model_len=server_max_model_len(ctx.endpoint),
        block_size_from="vllm:cache_config_info in the server's /metrics" if block else "",
        windows_from=config_from if config else "",
    )


def _prompts(ctx: CheckContext, reference: Reference, layout: Layout, max_new: int) -> tuple[list[OraclePrompt], list[str]]:
    """The golden file's prompts (kept only where they still fit the served layout), else a set built now."""
    spec = ctx.recipe.verification.oracle if ctx.recipe else None
    if isinstance(reference, GoldenReference):
        notes = []
        prompts = []
        for g in reference.prompts:
            if len(g.prompt_ids) + max_new > layout.max_model_len:
                notes.append(f"the golden {g.kind} prompt ({len(g.prompt_ids)} tokens) does not fit the served context")
                continue
            prompts.append(OraclePrompt(g.kind, g.why, g.prompt_ids, g.text))  # type: ignore[arg-type]
        if layout.block_size and not any(len(p.prompt_ids) > 2 * layout.block_size for p in prompts):
            notes.append(f"no golden prompt crosses two of the server's {layout.block_size}-token blocks")
        local = served_checkpoint(ctx)
        recorded_weights = (reference.produced.get("forward") or {}).get("weights") or {}
        if local is not None and recorded_weights.get("sha256"):
            here = checkpoint_facts(local).get("sha256") or {}
            changed = [f for f, h in recorded_weights["sha256"].items() if f in here and here[f] != h]
            if changed:
                notes.append(f"the golden file was recorded on other weights ({', '.join(changed)} differ): record it again")
        recorded = set(reference.data.get("layout", {}).get("windows") or [])
        for w in layout.windows:
            if w not in recorded and not any(len(p.prompt_ids) > w for p in prompts):
                notes.append(f"no golden prompt is longer than the model's sliding window of {w} tokens")
        return prompts, notes
    return build_prompts(ctx.endpoint.tokenize, layout, max_new, spec.long_prompt_tokens if spec else None)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


ORACLE_PARAMS = (
    Param("oracle_max_new_tokens", "int", f"the recipe's verification.oracle.max_new_tokens, else {DEFAULT_MAX_NEW_TOKENS}",
          "tokens generated per reference prompt", low=1, high=100_000),
    Param("oracle_kinds", "text list", "every kind", "only the reference prompts of these kinds: short, blocks, window, long",
          choices=("short", "blocks", "window", "long")),
    REFERENCE, REFERENCE_MODEL, REFERENCE_CHECKPOINT, DTYPE,
)


@check("oracle", LABEL, group="oracle", params=ORACLE_PARAMS)
def oracle(ctx: CheckContext) -> CheckOutcome:
    reference, source = reference_for(ctx)
    if reference is None:
        raise CheckSkipped(f"not run: {source}", [Evidence(note=f"not run: {source}; record one with `cookbook reference record`")])
    tol, tol_from = tolerance_for(ctx)
    noisy = too_noisy(Tolerance(name=REFERENCE_TIE, value=tol.tie_margin, source=tol_from))
    if noisy:
        raise CheckInconclusive(noisy)
    spec = ctx.recipe.verification.oracle if ctx.recipe else None
    max_new = int(ctx.params.get("oracle_max_new_tokens") or (spec.max_new_tokens if spec else DEFAULT_MAX_NEW_TOKENS))
    top_k = spec.top_k if spec else DEFAULT_TOP_K
    if isinstance(reference, GoldenReference):
        top_k = min(top_k, reference.top_k)
        max_new = min(max_new, int(reference.data.get("max_new_tokens", max_new)))
    layout = _layout(ctx)
    prompts, notes = _prompts(ctx, reference, layout, max_new)
    kinds = ctx.params.get("oracle_kinds")
    if kinds:
        wanted = set(kinds if isinstance(kinds, list) else [kinds])
        prompts = [p for p in prompts if p.kind in wanted]
    if not prompts:
        raise CheckSkipped(f"not run: no prompt of the reference fits this server ({'; '.join(notes)})")

    comparisons: list[PromptComparison] = []
    for prompt in prompts:
        timeout = ctx.prompt_timeout(len(prompt.prompt_ids)) * 2
        try:
            served = complete_with_logprobs(ctx.endpoint, prompt.prompt_ids, max_new, top_k, timeout)
        except ServerError as exc:
            raise CheckFailed(
                f"the {prompt.kind} prompt ({len(prompt.prompt_ids)} tokens) failed: {exc}",
                [Evidence(request=_excerpt(prompt, max_new, top_k), note=str(exc))],
            ) from None
        ref = reference.score(prompt.prompt_ids, max_new, top_k)
        comparisons.append(compare_prompt(prompt, served, ref, tol, reference))
    # The source sentence once the reference has run (a computed one then names its versions and machine).
    return _outcome(comparisons, tol, tol_from, reference.source, layout, notes, top_k)


def _excerpt(prompt: OraclePrompt, max_new: int, top_k: int) -> dict[str, Any]:
    ids = prompt.prompt_ids
    shown: Any = ids if len(ids) <= 24 else f"{ids[:12]} ... {ids[-12:]} ({len(ids)} token ids)"
    return {"prompt": shown, "max_tokens": max_new, "temperature": 0, "logprobs": top_k, "prompt_logprobs": top_k,
            "ignore_eos": True, "return_tokens_as_token_ids": True}


def _outcome(
    comparisons: list[PromptComparison], tol: OracleTolerance, tol_from: str, source: str, layout: Layout,
    notes: list[str], top_k: int,
) -> CheckOutcome:
    diffs = [d for c in comparisons for d in c.diffs]
    deltas = [d.delta for d in diffs]
    max_delta = max(deltas, default=0.0)
    mean_delta = sum(deltas) / len(deltas) if deltas else 0.0
    mean_allowed = mean_bound(tol.mean_abs_delta, deltas)
    max_div = max((d.divergence for d in diffs), default=0.0)
    positions = sum(c.top1_positions for c in comparisons)
    agree = sum(c.top1_agree for c in comparisons)
    ties = [(c.prompt.kind, i, m) for c in comparisons for i, m in c.top1_ties]
    flips = [(c.prompt.kind, i, note) for c in comparisons for i, note in c.top1_flips]
    agreement = (agree + len(ties)) / positions if positions else 1.0
    greedy_same = sum(c.greedy_same for c in comparisons)
    greedy_total = sum(c.greedy_total for c in comparisons)
    greedy_ties = [c for c in comparisons if c.greedy_verdict == "tie"]
    greedy_fails = [c for c in comparisons if c.greedy_verdict == "fail"]

    problems: list[str] = []
    if max_delta > tol.max_abs_delta:
        problems.append(f"max |delta logprob| {_fmt(max_delta)} > {tol.max_abs_delta:g}")
    if mean_delta > mean_allowed:
        problems.append(f"mean |delta logprob| {_fmt(mean_delta)} > {mean_allowed:.4g} ({tol.mean_abs_delta:g} + "
                        f"{mean_allowed - tol.mean_abs_delta:.2g}, {MEAN_Z:g} standard errors over {len(deltas)} positions)")
    if max_div > tol.max_topk_divergence:
        problems.append(f"top-{top_k} divergence {max_div:.3f} > {tol.max_topk_divergence:g}")
    if agreement < tol.min_top1_agreement:
        problems.append(f"top-1 agreement {agreement:.1%} < {tol.min_top1_agreement:.0%}")
    if greedy_fails:
        problems.append(f"greedy continuation departs from the reference on {len(greedy_fails)} prompt(s)")

    summary = (
        f"top-1 agreement {agree}/{positions}"
        + (f" (+{len(ties)} near-ties)" if ties else "")
        + f"; chosen-token |Δ logprob| max {_fmt(max_delta)}, mean {mean_delta:.3f}; top-{top_k} divergence max "
        f"{max_div:.3f}; greedy {greedy_same}/{greedy_total} tokens"
        + (f" ({len(greedy_ties)} near-tie flip{'s' if len(greedy_ties) > 1 else ''})" if greedy_ties else "")
        + f" over {len(comparisons)} prompts of {min(len(c.prompt.prompt_ids) for c in comparisons):,} to "
        f"{max(len(c.prompt.prompt_ids) for c in comparisons):,} tokens"
    )
    kind = source.split(":")[0].split(" ")[0]
    short_source = {"golden": "golden file", "computed": "computed here", "another": "another server"}.get(kind, kind)
    result = f"{summary} ({short_source})"
    if problems:
        result = f"{'; '.join(problems)}: {summary} ({short_source})"

    evidence: list[Evidence] = [Evidence(note=f"reference: {source}"), Evidence(note=f"tolerances: {tol_from}")]
    evidence += [Evidence(note=f"note: {n}") for n in notes if "other weights" in n]
    if problems:
        evidence.insert(0, Evidence(note=_symptom(comparisons, tol, layout, problems)))
        for c in comparisons:
            worst = [d for d in c.worst() if d.delta > tol.max_abs_delta or d.divergence > tol.max_topk_divergence]
            if not worst and c.greedy_verdict != "fail":
                continue
            evidence.append(
                Evidence(
                    request=_excerpt(c.prompt, 0, top_k),
                    response=[
                        {"where": d.where, "position": d.index, "token": d.token, "served": round(d.served, 4),
                         "reference": round(d.reference, 4), "delta": round(d.delta, 4),
                         "topk_divergence": round(d.divergence, 4)}
                        for d in worst
                    ],
                    note=f"{c.prompt.kind} prompt ({len(c.prompt.prompt_ids)} tokens): "
                    + (c.greedy_note if c.greedy_verdict == "fail" else f"largest |Δ logprob| {_fmt(worst[0].delta)} at "
                       f"{worst[0].where} position {worst[0].index}"),
                )
            )
    for c in greedy_ties:
        evidence.append(Evidence(note=f"{c.prompt.kind} prompt: near-tie, not a fail: {c.greedy_note}"))
    details = {
        "source": source,
        "tolerances": tol.model_dump(),
        "tolerances_from": tol_from,
        "layout": {"block_size": layout.block_size, "block_size_from": layout.block_size_from,
                   "windows": list(layout.windows), "windows_from": layout.windows_from,
                   "max_model_len": layout.max_model_len},
        "notes": notes + [n for c in comparisons for n in c.notes],
        "top1_agreement": round(agreement, 5),
        "max_abs_delta": round(max_delta, 5),
        "mean_abs_delta": round(mean_delta, 5),
        "mean_abs_delta_allowed": round(mean_allowed, 5),
        "max_topk_divergence": round(max_div, 5),
        "greedy_same": greedy_same,
        "greedy_total": greedy_total,
        "near_ties": [{"prompt": k, "position": i, "margin": None if m is None else round(m, 4)} for k, i, m in ties],
        "clear_flips": [{"prompt": k, "position": i, "note": n} for k, i, n in flips[:20]],
        "prompts": [_prompt_details(c) for c in comparisons],
        "noise": _noise(comparisons, diffs, [m for _, _, m in ties]),
    }
    return CheckOutcome(not problems, result, evidence if problems or greedy_ties else evidence[:2], details)


def _noise(comparisons: list[PromptComparison], diffs: list[PositionDiff],
           tie_margins: list[float | None]) -> dict[str, float | None]:
    """What this run measured, for `cookbook calibrate`: the chosen tokens' max and mean |served - reference|, the
    largest top-k divergence, and the flip noise: the larger of any near-tie's reference margin (greedy and top-1)
    and the largest margin drift (margin_drift) at any compared position."""
    deltas = [d.delta for d in diffs]
    flips = [abs(m) for m in tie_margins if m is not None]
    flips += [abs(c.greedy_tie_margin) for c in comparisons if c.greedy_tie_margin is not None]
    flips += [d.margin_drift for d in diffs]
    return {
        REFERENCE_MAX: round(max(deltas), 5) if deltas else None,
        REFERENCE_MEAN: round(sum(deltas) / len(deltas), 5) if deltas else None,
        REFERENCE_TOPK: round(max(d.divergence for d in diffs), 5) if diffs else None,
        REFERENCE_TIE: round(max(flips), 5) if flips else None,
    }


def _prompt_details(c: PromptComparison) -> dict[str, Any]:
    deltas = [d.delta for d in c.diffs]
    return {
        "kind": c.prompt.kind,
        "why": c.prompt.why,
        "tokens": len(c.prompt.prompt_ids),
        "positions": len(deltas),
        "max_abs_delta": round(max(deltas, default=0.0), 5),
        "mean_abs_delta": round(sum(deltas) / len(deltas), 5) if deltas else 0.0,
        "max_topk_divergence": round(max((d.divergence for d in c.diffs), default=0.0), 5),
        "top1": [c.top1_agree, len(c.top1_ties), len(c.top1_flips)],
        "greedy": [c.greedy_same, c.greedy_total, c.greedy_verdict],
        "greedy_note": c.greedy_note,
        "served_seconds": c.served_seconds,
    }


def _symptom(comparisons: list[PromptComparison], tol: OracleTolerance, layout: Layout, problems: list[str]) -> str:
    """One sentence naming what went wrong and where it starts (a wrong RoPE base or window shows by position)."""
    parts = []
    for c in comparisons:
        first = c.first_over(tol.max_abs_delta)
        if first is not None:
            prompt_diffs = [d for d in c.diffs if d.where == "prompt"]
            over = sum(1 for d in prompt_diffs if d.delta > tol.max_abs_delta)
            parts.append(
                f"{c.prompt.kind} prompt ({len(c.prompt.prompt_ids)} tokens): {over} of {len(prompt_diffs)} positions "
                f"off by more than {tol.max_abs_delta:g}, the first at position {first.index}"
            )
    where = "; ".join(parts[:4]) if parts else "no single position beyond the max, but the distribution drifts"
    windows = f" (the model's sliding windows: {', '.join(map(str, layout.windows))})" if layout.windows else ""
    return f"served logprobs depart from the reference ({'; '.join(problems)}): {where}{windows}"
