"""Needles in a haystack: does the model find one number at every depth of a long, cold prompt?

A wrong cache state or broken long-context numerics (RoPE tables past a length, a chunked-prefill seam) still gives
fluent text; it loses a fact buried at some depth. Per cell of a depth x length grid the probe builds a token-exact
haystack with its own random needle, sends it cold (its own ``cache_salt``), scores by exact match and times the
answer. Lengths come from the recipe, capped to the server's context.

The planted needle is not the truth about the server: a small model loses a needle by itself. What a correct server
answers is what a correct forward pass of this model gives, so where the model's fp32 reference is at hand (the
golden file, else a forward pass computed here) it judges a cell: every answer token teacher-forced through the
reference must be its own choice, up to a near-tie the dtype can flip (`kit.departure.rank_by_reference`). Such an
answer passes even without its needle (a model limit, said so); one the reference rules out fails even with it.
Without a reference, or for a prompt past the model's positions (where a reference is not ground truth), the
planted needle stays the bar. Every answer's text must also be what its token ids say.
"""
from __future__ import annotations

import time
from typing import Callable, Literal, Protocol

from pydantic import BaseModel, Field, computed_field

from ..endpoint import Endpoint
from ..errors import CookbookError, RequestFailed
from ..haystack import (
    Answer,
    ask,
    body_excerpt,
    build_haystack,
    chat_prompt_ids,
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
from ..reference import RefPosition, Reference
from ..results import Evidence
from ..secrets import strip_url_credentials
from .kit.departure import rank_by_reference
from .kit.referee import REFERENCE_PARAMS, REFERENCE_TOP_K, Referee
from .kit.tolerances import Tolerance, tolerances
from .params import DTYPE, SEED, Param
from .registry import CheckContext, CheckOutcome, check

DEFAULT_DEPTHS = [0.1, 0.5, 0.9]
# Without a recipe: the seeds' 65K, 131K and 244K of a 262,144-token context, as fractions of the server's.
DEFAULT_LENGTH_FRACTIONS = [0.248, 0.5, 0.93]
# Which cells the reference judges: a teacher-forced fp32 pass costs about 37 s at 2K and 125 s at 6K tokens on the
# shared 2-vCPU CPU machine (SmolLM2-135M, measured under load), so by default only answers without their needle.
ReferenceScope = Literal["misses", "every-cell"]
MODEL_MISSES = "needles.model_misses"  # the calibration's name for the cells the model itself misses
SAME_ANSWER = "the reference answers the same"
NEAR_TIE = "a near-tie the dtype can flip"
GREEDY_EXTRA = 8  # tokens the reference's own answer may run past the served one's length


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
    answer_token_ids: list[int] = Field(default_factory=list, description="The answer's tokens ('token_id:N')")
    judged_by: str = Field(
        "the planted needle", description="'the reference', or 'the planted needle: <why no reference judged>'"
    )
    model_limit: bool = Field(
        False, description="The needle is missing but every answer token is the reference's own (up to near-ties)"
    )
    limit: str | None = Field(None, description="A model limit in words: the reference answers the same, or a near-tie")
    reference_answer: str | None = Field(
        None, description="The reference's own greedy answer: the served one when every token is its argmax; after a "
        "near-tie computed (a forward pass more) only with needle_reference every-cell"
    )
    near_ties: int = Field(0, description="Answer tokens that are not the reference's argmax but within its tie margin")
    reference_s: float | None = Field(None, description="Seconds the reference's forward passes took for this cell")
    disputed: str | None = Field(None, description="The first answer token the reference rules out, in words")
    text_mismatch: str | None = Field(None, description="Why message.content is not what the answer's tokens say")
    logprobs_error: str | None = Field(
        None, description="The server's error when asked for logprobs (then asked without): no tokens to judge"
    )

    @property
    def id(self) -> str:
        """'4000@0.5': length and depth, the name calibration.yaml's model_misses use."""
        return f"{self.target_tokens}@{self.depth:g}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """What a correct server answers: the needle found, or missed as the model itself misses it; nothing the
        reference rules out and text that is its tokens."""
        return (self.found or self.model_limit) and self.disputed is None and self.text_mismatch is None


class NeedleGrid(BaseModel):
    """Depth x length results, in the order the cells ran (lengths ascending, then depths)."""

    lengths: list[int] = Field(description="Target lengths in tokens")
    depths: list[float]
    cells: list[NeedleCell]

    def cell(self, length: int, depth: float) -> NeedleCell | None:
        return next((c for c in self.cells if c.target_tokens == length and c.depth == depth), None)

    def score(self, length: int) -> tuple[int, int]:
        """(cells answered as a correct server answers, cells) at one length."""
        row = [c for c in self.cells if c.target_tokens == length]
        return sum(c.passed for c in row), len(row)

    @property
    def passed(self) -> bool:
        return bool(self.cells) and all(c.passed and not c.cached_tokens for c in self.cells)

    @property
    def model_misses(self) -> list[str]:
        """Cells whose needle the model itself loses (the reference answers the same), by `NeedleCell.id`."""
        return [c.id for c in self.cells if c.model_limit]

    def times(self) -> dict[str, dict[str, float]]:
        """Per length: the first cell's time (it may compile a new shape) and the range, in seconds."""
        summary: dict[str, dict[str, float]] = {}
        for length in self.lengths:
            seconds = [c.seconds for c in self.cells if c.target_tokens == length]
            if seconds:
                summary[str(length)] = {"first": seconds[0], "min": min(seconds), "max": max(seconds)}
        return summary


class NeedleReferee(Protocol):
    """What judging a cell asks of the reference (`kit.Referee` is one; a test passes a fake)."""

    why_none: str

    @property
    def reference(self) -> Reference | None: ...

    def path(self, prompt: list[int], tokens: list[int]) -> list[RefPosition | None] | None: ...


class NeedleJudge:
    """Judges one cell's answer: its text against its tokens, then its tokens against the reference where the
    reference is ground truth, else its text against the planted needle."""

    def __init__(
        self,
        endpoint: Endpoint,
        referee: NeedleReferee | None,
        noise: Tolerance,
        max_positions: int | None = None,
        scope: ReferenceScope = "misses",
    ) -> None:
        self.endpoint, self.referee, self.noise = endpoint, referee, noise
        self.max_positions, self.scope = max_positions, scope
        self.asked = False  # whether any cell needed the reference (its source or absence is then worth saying)

    def judge(self, cell: NeedleCell, answer: Answer, prompt_ids: Callable[[], list[int]]) -> None:
        """Fill in the cell's verdict fields; `prompt_ids` gives the prompt's ids as the server saw them (asked only
        when the reference judges)."""
        if cell.logprobs_error is not None:
            cell.judged_by = f"the planted needle: the server returned no logprobs ({cell.logprobs_error})"
            return
        cell.text_mismatch = self.text_mismatch(answer)
        ids = [i for i in answer.token_ids if i is not None]
        cell.answer_token_ids = ids
        if cell.text_mismatch is not None:
            cell.judged_by = "the answer's own tokens: its text is not what they say"
            return
        reach = cell.prompt_tokens + len(ids)
        if self.max_positions and reach > self.max_positions:
            cell.judged_by = (f"the planted needle: prompt and answer ({reach:,} tokens) run past the "
                              f"{self.max_positions:,} positions the model was made for, where a reference is not "
                              "ground truth")
            return
        if cell.found and self.scope == "misses":
            cell.judged_by = "the planted needle: found (the reference is asked only for answers without their needle)"
            return
        self.asked = True
        started = time.monotonic()
        try:
            self._by_reference(cell, answer, prompt_ids)
        finally:
            cell.reference_s = round(time.monotonic() - started, 2)

    def _by_reference(self, cell: NeedleCell, answer: Answer, prompt_ids: Callable[[], list[int]]) -> None:
        ids = cell.answer_token_ids
        reference = self.referee.reference if self.referee is not None else None
        prompt = prompt_ids() if reference is not None else []
        path = self.referee.path(prompt, ids) if self.referee is not None and reference is not None else None
        if reference is None or path is None:
            cell.judged_by = f"the planted needle: no reference ({self.why_none})"
            return
        ties: list[str] = []
        for index, token in enumerate(ids):
            at = path[index] if index < len(path) else None
            ranking = rank_by_reference(at, at.argmax, token, self.noise.value) if at is not None else None
            if at is None or ranking is None:
                cell.judged_by = f"the planted needle: the reference did not score answer token {index}"
                return
            if token == at.argmax:
                continue
            if ranking.failed:
                cell.judged_by = "the reference"
                bound = "at least " if ranking.bound == "at least" else ""
                cell.disputed = (f"at answer token {index} the server chose {self.show(token)} where the reference "
                                 f"prefers {self.show(at.argmax)} by {bound}{ranking.margin:.3g} (tie margin "
                                 f"{self.noise.value:g}, {self.noise.source})")
                return
            ties.append(f"answer token {index}, {self.show(token)} where the reference prefers {self.show(at.argmax)} "
                        f"by {ranking.margin:.3g}")
        cell.judged_by = "the reference"
        cell.near_ties = len(ties)
        if not cell.found:
            cell.model_limit = True
            if not ties:  # every token the reference's argmax: the served answer is the reference's greedy answer
                cell.reference_answer, cell.limit = answer.text, SAME_ANSWER
                return
            if self.scope == "every-cell":  # a forward pass more; by default the near-tie alone is said
                cell.reference_answer = self.greedy_answer(reference, prompt, answer)
            if cell.reference_answer == answer.text.strip():
                cell.limit = SAME_ANSWER
                return
            theirs = f"; the reference answers {cell.reference_answer!r}" if cell.reference_answer is not None else ""
            cell.limit = (f"{NEAR_TIE}: {'; '.join(ties)} (within the tie margin {self.noise.value:g}, "
                          f"{self.noise.source}){theirs}")

    @property
    def why_none(self) -> str:
        return (self.referee.why_none if self.referee is not None else "") or "none available"

    def text_mismatch(self, answer: Answer) -> str | None:
        """Why the answer's text is not what its token ids say (a proxy that rewrites the text alone), else None."""
        ids = answer.token_ids
        if not ids:
            return None if not answer.text else "the answer has no token logprobs to read its text from"
        if None in ids:
            named = answer.tokens[ids.index(None)]
            return f"the answer's logprobs name a token {named!r}, not 'token_id:N' (return_tokens_as_token_ids)"
        known = [i for i in ids if i is not None]
        said = self.endpoint.detokenize(known)
        if _same_text(said, answer):
            return None
        if answer.finish_reason == "stop" and _same_text(self.endpoint.detokenize(known[:-1]), answer):
            return None  # the last token is the stop token, which message.content leaves out
        return f"the answer's text {answer.text!r} is not what its tokens say ({said!r})"

    def show(self, token: int) -> str:
        return f"{self.endpoint.detokenize([token])!r} (token {token})"

    def greedy_answer(self, reference: Reference, prompt: list[int], answer: Answer) -> str | None:
        """The reference's own greedy answer to the prompt (a forward pass more), up to its stop token or a few tokens
        past the served answer's length (the served one may have stopped short)."""
        try:
            greedy = reference.score(prompt, len(answer.token_ids) + GREEDY_EXTRA, top_k=REFERENCE_TOP_K).greedy_ids
        except CookbookError:
            return None
        stop = answer.token_ids[-1] if answer.finish_reason == "stop" and answer.token_ids else None
        if stop is not None and stop in greedy:
            greedy = greedy[: greedy.index(stop)]
        return self.endpoint.detokenize(greedy).strip()


def _same_text(said: str, answer: Answer) -> bool:
    """The tokens' text is the answer's, allowing for surrounding whitespace and a reasoning part the server split
    off into reasoning_content."""
    text, reasoning = answer.text.strip(), answer.reasoning.strip()
    if said.strip() == text:
        return True
    return bool(reasoning) and reasoning in said and said.rstrip().endswith(text)


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
    judge: NeedleJudge | None = None,
) -> tuple[NeedleGrid, list[Evidence]]:
    """Every cell cold, judged by `judge` (without one: text against tokens, then the planted needle); evidence for
    every failed cell and every cell that was not cold (a miss says how far before the question its needle sat, and
    whether that is beyond the served sliding window). `progress` hears of each cell."""
    judge = judge or NeedleJudge(endpoint, None, tolerances(None).flip_noise,
                                 served.max_positions if served is not None else None)
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
            body = request_body(endpoint, haystack.messages, new_salt(), max_tokens, logprobs=True, token_ids=True)
            timeout = request_timeout(timeout_s, haystack.prompt_tokens, endpoint.prefill_pace)
            logprobs_error = None
            try:
                answer = ask(endpoint, body, timeout)
            except RequestFailed as exc:  # e.g. non-finite logprobs past the model's positions: HTTP 400
                if exc.status_code is None:
                    raise
                logprobs_error = f"HTTP {exc.status_code}: {exc.body[:160]}"
                body = request_body(endpoint, haystack.messages, new_salt(), max_tokens, logprobs=False)
                answer = ask(endpoint, body, timeout)
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
                logprobs_error=logprobs_error,
            )
            if progress and not cell.found:
                progress(f"cell {row * len(depths) + column + 1}/{total}: no needle in the answer, judging it")
            judge.judge(cell, answer, lambda: chat_prompt_ids(endpoint, haystack.messages))
            cells.append(cell)
            if not cell.passed or cell.cached_tokens:
                notes = []
                if not cell.found and not cell.passed:
                    where = f"{haystack.filler_after:,} filler tokens before the question"
                    reach = served.beyond(haystack.filler_after) if served is not None else None
                    notes.append(
                        f"expected {needle.value} ({needle.key}) at depth {depth} ({where}"
                        f"{', ' + reach if reach else ''}), got {answer.text!r}"
                    )
                if cell.found and not cell.passed:
                    notes.append(f"the needle {needle.value} is in the answer {answer.text!r}, but a correct server "
                                 "does not answer this")
                notes += [problem for problem in (cell.text_mismatch, cell.disputed) if problem]
                if not cell.passed and not cell.disputed and not cell.text_mismatch:
                    notes.append(f"judged by {cell.judged_by}")
                if cell.cached_tokens:
                    notes.append(f"the cell was not cold: {cell.cached_tokens} cached tokens with a fresh cache_salt")
                evidence.append(
                    Evidence(
                        request=body_excerpt(body),
                        response={"content": answer.text, "finish_reason": answer.finish_reason, "usage": answer.usage,
                                  "token_ids": cell.answer_token_ids},
                        note=f"{cell.prompt_tokens} tokens: " + "; ".join(notes),
                    )
                )
    return NeedleGrid(lengths=sorted(lengths), depths=list(depths), cells=cells), evidence


def result_text(grid: NeedleGrid) -> str:
    """'3/3 at 65K, 131K and 244K tokens'; lengths with the same score share one phrase; model limits said."""
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
    limits: dict[str, int] = {}
    for c in grid.cells:
        if c.model_limit and c.passed:
            kind = SAME_ANSWER if c.limit == SAME_ANSWER else NEAR_TIE
            limits[kind] = limits.get(kind, 0) + 1
    if limits:
        said = ", ".join(f"{n} cell{'s' if n > 1 else ''} a model limit: {kind}" for kind, n in limits.items())
        text += f" ({said})"
    not_cold = sum(bool(c.cached_tokens) for c in grid.cells)
    if not_cold:
        text += f"; {not_cold} cell{'s' if not_cold > 1 else ''} not cold (cached tokens with a fresh cache_salt)"
    return text


def server_identity(ctx: CheckContext) -> dict[str, object]:
    """Which server process answered the cells: its URL, model and start time (as `run_checks` found it before the
    first check). The benchmark reuses the cells as its cold-prompt figures only for that process
    (`cookbook.bench.measured`)."""
    started = ctx.run_start.process_start_time if ctx.run_start is not None else None
    return {"base_url": strip_url_credentials(ctx.endpoint.base_url), "model": ctx.endpoint.model,
            "process_start_time": started}


def default_lengths(max_model_len: int) -> list[int]:
    """The seeds' proportions of the context, rounded to a thousand tokens when that is meaningful."""
    lengths = [int(max_model_len * f) for f in DEFAULT_LENGTH_FRACTIONS]
    return [round(n, -3) if n >= 10_000 else n for n in lengths]


NEEDLE_PARAMS = (
    Param("needle_lengths", "int list", "the recipe's verification.needles.lengths, else from the served context",
          "haystack lengths in the model's tokens", low=1, high=100_000_000),
    Param("needle_depths", "float list", "the recipe's, else 0.1, 0.5, 0.9", "needle depths as fractions of the haystack",
          low=0, high=1),
    Param("needle_digits", "int", f"the recipe's value_digits, else {DEFAULT_DIGITS}", "digits of each needle's value",
          low=1, high=100),
    Param("needle_reference", "text", "misses", "which cells the reference scores: misses or every-cell",
          choices=("misses", "every-cell")),
    SEED, DTYPE, *REFERENCE_PARAMS,
)


@check("needles", "Needle in a haystack, 3 depths, cold", group="long-context", params=NEEDLE_PARAMS)
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
    scope = str(ctx.params.get("needle_reference") or "misses")
    if scope not in ("misses", "every-cell"):
        raise CookbookError(f"needles: --param needle_reference: expected misses or every-cell, got {scope!r}")
    referee = Referee(ctx)
    judge = NeedleJudge(ctx.endpoint, referee, tolerances(ctx.recipe, ctx.params, served.dtype).flip_noise,
                        served.max_positions, "every-cell" if scope == "every-cell" else "misses")
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
        judge=judge,
    )
    details = grid.model_dump()
    if judge.asked:
        details["reference"] = {**referee.details(), "scope": scope}
    else:
        details["reference"] = {"judge": "not asked: no cell needed it", "scope": scope}
    details["noise"] = {MODEL_MISSES: grid.model_misses}
    details["times"] = grid.times()
    details["max_model_len"] = context
    details["served"] = served.model_dump()
    details["server"] = server_identity(ctx)
    contradictions = served.contradictions()
    details["layout_contradictions"] = contradictions
    text = result_text(grid)
    unjudged = [c for c in grid.cells if not c.passed and c.judged_by.startswith("the planted needle: no reference")]
    if unjudged:
        text += f"; judged by the planted needle: no reference ({referee.why_none or 'none available'})"
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
