"""Needles in a haystack: does the model find one number at every depth of a long, cold prompt?

A wrong cache state or broken long-context numerics (RoPE tables past a length, a chunked-prefill seam) still gives
fluent text; it loses a fact buried at some depth. Per cell of a depth x length grid the probe builds a token-exact
haystack with its own random needle, sends it cold (its own ``cache_salt``), scores by exact match and times the
answer. Lengths come from the recipe, capped to the server's context.
"""
from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, Field

from ..endpoint import Endpoint
from ..errors import CookbookError
from ..haystack import (
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
    served_model,
    DEFAULT_DIGITS,
    ServedModel,
)
from ..results import Evidence
from .registry import CheckContext, CheckOutcome, check

DEFAULT_DEPTHS = [0.1, 0.5, 0.9]
# Without a recipe: the seeds' 65K, 131K and 244K of a 262,144-token context, as fractions of the server's.
DEFAULT_LENGTH_FRACTIONS = [0.248, 0.5, 0.93]


class NeedleCell(BaseModel):
    """One cold request: a haystack of one length with its needle at one depth."""

    target_tokens: int = Field(description="The length asked for")
    prompt_tokens: int = Field(description="The prompt's length as the server counted it (usage.prompt_tokens)")
    depth: float = Field(description="Requested depth, a fraction of the filler")
    actual_depth: float = Field(description="Where the needle landed")
    needle_key: str
    needle_value: str = Field(description="The number the answer must contain exactly")
    answer: str = Field(description="message.content of the answer")
    found: bool = Field(description="The needle's number appears exactly in the answer")
    seconds: float = Field(description="Time to the whole answer, end to end (the first cell at a shape compiles)")
    cached_tokens: int | None = Field(description="Should be 0 or None: every cell is cold")
    finish_reason: str | None = None
    filler_after: int = Field(0, description="Filler tokens between the needle and the question")


class NeedleGrid(BaseModel):
    """Depth x length results, in the order the cells ran (lengths ascending, then depths)."""

    lengths: list[int] = Field(description="Target lengths in tokens")
    depths: list[float]
    cells: list[NeedleCell]

    def cell(self, length: int, depth: float) -> NeedleCell | None:
        return next((c for c in self.cells if c.target_tokens == length and c.depth == depth), None)

    def score(self, length: int) -> tuple[int, int]:
        row = [c for c in self.cells if c.target_tokens == length]
        return sum(c.found for c in row), len(row)

    @property
    def passed(self) -> bool:
        return bool(self.cells) and all(c.found and not c.cached_tokens for c in self.cells)

    def times(self) -> dict[str, dict[str, float]]:
        """Per length: the first cell's time (it may compile a new shape) and the range, in seconds."""
        summary: dict[str, dict[str, float]] = {}
        for length in self.lengths:
            seconds = [c.seconds for c in self.cells if c.target_tokens == length]
            if seconds:
                summary[str(length)] = {"first": seconds[0], "min": min(seconds), "max": max(seconds)}
        return summary


def probe_needles(
    endpoint: Endpoint,
    lengths: list[int],
    depths: list[float],
    max_tokens: int = 64,
    timeout_s: float = 60.0,
    seed: int | str = 0,
    served: ServedModel | None = None,
    digits: int = DEFAULT_DIGITS,
    progress: Callable[[str], None] | None = None,
) -> tuple[NeedleGrid, list[Evidence]]:
    """Every cell cold, scored by exact match; evidence for every miss and every cell that was not cold (a miss
    says how far before the question its needle sat, and whether that is beyond the served sliding window).
    `progress` hears of each cell."""
    cells: list[NeedleCell] = []
    evidence: list[Evidence] = []
    total = len(lengths) * len(depths)
    for row, length in enumerate(sorted(lengths)):
        for column, depth in enumerate(depths):
            if progress:
                progress(f"cell {row * len(depths) + column + 1}/{total} ({length:,} tokens, depth {depth:.0%})")
            cell_seed = f"{seed}:needle:{length}:{depth}"
            needle = make_needle(cell_seed, digits)
            haystack = build_haystack(endpoint, length, depth, needle, seed=cell_seed)
            body = request_body(endpoint, haystack.messages, new_salt(), max_tokens, logprobs=False)
            answer = ask(endpoint, body, request_timeout(timeout_s, haystack.prompt_tokens))
            cell = NeedleCell(
                target_tokens=length,
                prompt_tokens=answer.prompt_tokens or haystack.prompt_tokens,
                depth=depth,
                actual_depth=round(haystack.actual_depth, 4),
                needle_key=needle.key,
                needle_value=needle.value,
                answer=answer.text,
                found=needle.found_in(answer.text),
                seconds=answer.seconds,
                cached_tokens=answer.cached_tokens,
                finish_reason=answer.finish_reason,
                filler_after=haystack.filler_after,
            )
            cells.append(cell)
            if not cell.found or cell.cached_tokens:
                notes = []
                if not cell.found:
                    where = f"{haystack.filler_after:,} filler tokens before the question"
                    reach = served.beyond(haystack.filler_after) if served is not None else None
                    notes.append(
                        f"expected {needle.value} ({needle.key}) at depth {depth} ({where}"
                        f"{', ' + reach if reach else ''}), got {answer.text!r}"
                    )
                if cell.cached_tokens:
                    notes.append(f"the cell was not cold: {cell.cached_tokens} cached tokens with a fresh cache_salt")
                evidence.append(
                    Evidence(
                        request=body_excerpt(body),
                        response={"content": answer.text, "finish_reason": answer.finish_reason, "usage": answer.usage},
                        note=f"{cell.prompt_tokens} tokens: " + "; ".join(notes),
                    )
                )
    return NeedleGrid(lengths=sorted(lengths), depths=list(depths), cells=cells), evidence


def result_text(grid: NeedleGrid) -> str:
    """'3/3 at 65K, 131K and 244K tokens'; lengths with the same score share one phrase."""
    groups: list[tuple[str, list[str]]] = []
    for length in grid.lengths:
        found, total = grid.score(length)
        prompt = next(c.prompt_tokens for c in grid.cells if c.target_tokens == length)
        score = f"{found}/{total}"
        if groups and groups[-1][0] == score:
            groups[-1][1].append(format_tokens(prompt))
        else:
            groups.append((score, [format_tokens(prompt)]))
    text = ", ".join(f"{score} at {join_words(words)}" for score, words in groups) + " tokens"
    not_cold = sum(bool(c.cached_tokens) for c in grid.cells)
    if not_cold:
        text += f"; {not_cold} cell{'s' if not_cold > 1 else ''} not cold (cached tokens with a fresh cache_salt)"
    return text


def default_lengths(max_model_len: int) -> list[int]:
    """The seeds' proportions of the context, rounded to a thousand tokens when that is meaningful."""
    lengths = [int(max_model_len * f) for f in DEFAULT_LENGTH_FRACTIONS]
    return [round(n, -3) if n >= 10_000 else n for n in lengths]


@check("needles", "Needle in a haystack, 3 depths, cold", group="long-context")
def needles(ctx: CheckContext) -> CheckOutcome:
    """The grid from the recipe (or params 'needle_lengths' / 'needle_depths'), every cell in the details; the
    heatmap is drawn from them by `cookbook.plots.needles_figure`, never by the check."""
    expectation = ctx.recipe.verification.needles if ctx.recipe else None
    served = served_model(ctx.endpoint)
    context = served.max_model_len
    lengths = ctx.params.get("needle_lengths") or (expectation.lengths if expectation else None)
    lengths = lengths or default_lengths(context)
    depths = ctx.params.get("needle_depths") or (expectation.depths if expectation else None) or DEFAULT_DEPTHS
    digits = int(ctx.params.get("needle_digits") or (expectation.value_digits if expectation else DEFAULT_DIGITS))
    if not lengths or not depths:
        raise CookbookError("needles: no lengths or depths to test")
    fitted = fit_lengths(list(lengths), context, ctx.max_tokens)
    grid, evidence = probe_needles(
        ctx.endpoint,
        fitted,
        list(depths),
        max_tokens=ctx.max_tokens,
        timeout_s=ctx.request_timeout_s,
        seed=seed_param(ctx.params),
        served=served,
        digits=digits,
        progress=ctx.report,
    )
    details = grid.model_dump()
    details["times"] = grid.times()
    details["max_model_len"] = context
    details["served"] = served.model_dump()
    contradictions = served.contradictions()
    details["layout_contradictions"] = contradictions
    text = result_text(grid)
    if contradictions and not grid.passed:  # what the server does otherwise than the model's config says
        text += "; " + "; ".join(contradictions)
        evidence += [Evidence(note=c) for c in contradictions]
    if fitted != list(lengths):
        details["requested_lengths"] = list(lengths)
    return CheckOutcome(
        passed=grid.passed,
        result=text,
        evidence=evidence,
        details=details,
        label=f"Needle in a haystack, {len(depths)} depth{'s' if len(depths) > 1 else ''}, cold",
    )
