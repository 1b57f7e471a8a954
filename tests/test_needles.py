"""cookbook.checks.needles: scoring and wording (unit), the grid on SmolLM2 (integration)."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, cast

import pytest

from cookbook import plots
from cookbook.checks import CHECKS, CheckContext, run_checks
from cookbook.checks.kit.tolerances import Tolerance
from cookbook.checks.needles import NeedleCell, NeedleGrid, NeedleJudge, ReferenceScope, default_lengths, result_text
from cookbook.completions import maybe_token_id
from cookbook.endpoint import Endpoint
from cookbook.faultproxy import Exchange, Fault, FaultProxy
from cookbook.haystack import Answer, Needle
from cookbook.recipes import Recipe
from cookbook.reference import RefPosition, RefScore
from cookbook.results import CheckResult


def cell(length: int, depth: float, found: bool, seconds: float = 1.0, cached: int | None = 0) -> NeedleCell:
    return NeedleCell(
        target_tokens=length, prompt_tokens=length, depth=depth, actual_depth=depth, needle_key="the blue door",
        needle_value="4829173", answer="4829173" if found else "I do not know", found=found, seconds=seconds,
        cached_tokens=cached,
    )


def grid(rows: dict[int, list[bool]]) -> NeedleGrid:
    depths = [0.1, 0.5, 0.9]
    cells = [cell(length, d, ok) for length, oks in rows.items() for d, ok in zip(depths, oks)]
    return NeedleGrid(lengths=list(rows), depths=depths, cells=cells)


def test_registered_in_the_long_context_group() -> None:
    assert CHECKS["needles"].group == "long-context"
    assert CHECKS["prefix-cache"].group == "long-context"


def test_result_text_in_the_seeds_wording() -> None:
    everything = grid({65000: [True] * 3, 131000: [True] * 3, 244000: [True] * 3})
    assert everything.passed
    assert result_text(everything) == "3/3 at 65K, 131K and 244K tokens"
    partial = grid({2000: [True] * 3, 4000: [True] * 3, 7600: [True, False, True]})
    assert not partial.passed
    assert result_text(partial) == "3/3 at 2K and 4K, 2/3 at 7.6K tokens"


def test_a_cell_that_was_not_cold_fails_the_grid() -> None:
    warm = NeedleGrid(lengths=[1000], depths=[0.5], cells=[cell(1000, 0.5, True, cached=896)])
    assert not warm.passed
    assert result_text(warm) == "1/1 at 1K tokens; 1 cell not cold (cached tokens with a fresh cache_salt)"


def test_times_keep_the_first_cell_apart() -> None:
    timed = NeedleGrid(
        lengths=[65000], depths=[0.1, 0.5], cells=[cell(65000, 0.1, True, 99.0), cell(65000, 0.5, True, 17.0)]
    )
    assert timed.times() == {"65000": {"first": 99.0, "min": 17.0, "max": 99.0}}


def test_default_lengths_follow_the_seeds_proportions() -> None:
    assert default_lengths(262144) == [65000, 131000, 244000]
    assert default_lengths(8192) == [2031, 4096, 7618]


# -- a cell judged by the reference (a fake one: RefPositions chosen here) ------------------------------------------

VOCAB = {0: "<|im_end|>", 1: "The", 2: " number", 3: " is", 4: " 714", 5: "397", 6: "4", 7: ".", 8: "5"}
NEEDLE = Needle(key="the blue door", value="7143974")
FOUND = [1, 2, 3, 4, 5, 6, 7, 0]  # "The number is 7143974."
CUT_SHORT = [1, 2, 3, 4, 5, 7, 0]  # "The number is 714397." : the 135M model's own miss at 4K, depth 0.5
NOISE = Tolerance(name="reference.tie_margin", value=0.5, source="the test's tie margin")


class FakeEndpoint:
    def detokenize(self, tokens: list[int]) -> str:
        return "".join(VOCAB[t] for t in tokens)


class FakeReference:
    """A reference whose greedy answer is `greedy`."""

    source = "a fake reference"

    def __init__(self, greedy: list[int]) -> None:
        self.greedy = greedy
        self.scored = 0

    def can_score(self, prompt_ids: list[int]) -> bool:
        return True

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        self.scored += 1
        return RefScore(self.source, [], [RefPosition(t, -0.1, {t: -0.1}) for t in self.greedy[:max_new_tokens]])


class FakeReferee:
    """`kit.Referee`'s surface: at each answer token the reference prefers `prefer.get(j, the served token)` by
    `margin` nats over the served token."""

    def __init__(self, prefer: dict[int, int] | None = None, margin: float = 3.0, greedy: list[int] | None = None,
                 available: bool = True) -> None:
        self.prefer, self.margin = prefer or {}, margin
        self._reference = FakeReference(greedy or []) if available else None
        self.why_none = "" if available else "no reference recorded for this image"
        self.paths: list[tuple[list[int], list[int]]] = []

    @property
    def reference(self) -> FakeReference | None:
        return self._reference

    def path(self, prompt: list[int], tokens: list[int]) -> list[RefPosition | None] | None:
        self.paths.append((prompt, tokens))
        steps: list[RefPosition | None] = []
        for j, token in enumerate(tokens):
            best = self.prefer.get(j, token)
            if best == token:
                steps.append(RefPosition(token, -0.05, {token: -0.05, 99: -4.0}))
            else:
                steps.append(RefPosition(token, -0.05 - self.margin, {best: -0.05, token: -0.05 - self.margin}))
        return steps + [None]


def served(tokens: list[int], text: str | None = None) -> Answer:
    said = "".join(VOCAB[t] for t in tokens if t)
    return Answer(text=said if text is None else text, tokens=[f"token_id:{t}" for t in tokens], seconds=0.1,
                  finish_reason="stop")


def judged(answer: Answer, referee: FakeReferee | None, scope: ReferenceScope = "every-cell", prompt_tokens: int = 4000,
           max_positions: int | None = 8192) -> NeedleCell:
    cell = NeedleCell(
        target_tokens=prompt_tokens, prompt_tokens=prompt_tokens, depth=0.5, actual_depth=0.5, needle_key=NEEDLE.key,
        needle_value=NEEDLE.value, answer=answer.text, found=NEEDLE.found_in(answer.text), seconds=0.1,
        cached_tokens=0,
    )
    judge = NeedleJudge(cast(Endpoint, FakeEndpoint()), referee, NOISE, max_positions, scope)
    judge.judge(cell, answer, lambda: [11, 12, 13])
    return cell


def test_an_answer_that_is_the_references_own_and_finds_the_needle_passes() -> None:
    referee = FakeReferee()
    cell = judged(served(FOUND), referee)
    assert cell.passed and cell.found and not cell.model_limit
    assert cell.judged_by == "the reference" and cell.disputed is None and cell.text_mismatch is None
    assert referee.paths == [([11, 12, 13], FOUND)]  # the served answer's ids, teacher-forced after the prompt's
    # by default the reference is asked only for answers without their needle: a found one costs no forward pass
    quick = FakeReferee()
    cell = judged(served(FOUND), quick, scope="misses")
    assert cell.passed and cell.judged_by.startswith("the planted needle: found") and quick.paths == []


def test_an_answer_the_reference_gives_too_passes_without_its_needle_as_a_model_limit() -> None:
    referee = FakeReferee()
    cell = judged(served(CUT_SHORT), referee, scope="misses")
    assert not cell.found and cell.model_limit and cell.passed
    assert cell.limit == "the reference answers the same" and cell.reference_answer == "The number is 714397."
    assert referee.reference is not None and referee.reference.scored == 0  # the path was its greedy answer already
    grid = NeedleGrid(lengths=[4000], depths=[0.5], cells=[cell])
    assert grid.passed and grid.model_misses == ["4000@0.5"]
    assert result_text(grid) == "1/1 at 4K tokens (1 cell a model limit: the reference answers the same)"


def test_a_near_tie_the_dtype_can_flip_is_a_model_limit_that_says_so() -> None:
    # at token 5 the server ended the number where the reference says '4' by 0.3 < the 0.5 tie margin (measured on
    # the clean CPU server: 4000@0.5 answered '714397.' where the reference prefers '4' by 0.268)
    referee = FakeReferee(prefer={5: 6}, margin=0.3, greedy=FOUND)
    cell = judged(served(CUT_SHORT), referee, scope="misses")
    assert cell.passed and cell.model_limit and cell.near_ties == 1 and cell.reference_answer is None
    assert cell.limit == ("a near-tie the dtype can flip: answer token 5, '.' (token 7) where the reference prefers "
                          "'4' (token 6) by 0.3 (within the tie margin 0.5, the test's tie margin)")
    assert referee.reference is not None and referee.reference.scored == 0  # no second forward pass by default
    grid = NeedleGrid(lengths=[4000], depths=[0.5], cells=[cell])
    assert result_text(grid) == "1/1 at 4K tokens (1 cell a model limit: a near-tie the dtype can flip)"
    thorough = FakeReferee(prefer={5: 6}, margin=0.3, greedy=FOUND)
    cell = judged(served(CUT_SHORT), thorough, scope="every-cell")
    assert cell.passed and cell.reference_answer == "The number is 7143974."  # its own greedy answer, a pass more
    assert cell.limit is not None and cell.limit.endswith("the reference answers 'The number is 7143974.'")


def test_an_answer_the_reference_rules_out_fails_even_with_its_needle() -> None:
    # the reference prefers '.' after ' is' by 3 nats: a correct server does not answer this, needle or not
    cell = judged(served(FOUND), FakeReferee(prefer={2: 7}, margin=3.0))
    assert cell.found and not cell.passed and not cell.model_limit
    assert cell.disputed is not None and cell.disputed.startswith(
        "at answer token 2 the server chose ' is' (token 3) where the reference prefers '.' (token 7) by 3"
    )
    missed = judged(served(CUT_SHORT), FakeReferee(prefer={5: 6}, margin=3.0))  # cut short where it should not be
    assert not missed.passed and not missed.model_limit and missed.disputed is not None
    assert not NeedleGrid(lengths=[4000], depths=[0.5], cells=[missed]).passed


def test_without_a_reference_the_planted_needle_is_the_bar() -> None:
    lost = judged(served(CUT_SHORT), FakeReferee(available=False))
    assert not lost.passed and not lost.model_limit
    assert lost.judged_by == "the planted needle: no reference (no reference recorded for this image)"
    assert judged(served(FOUND), FakeReferee(available=False)).passed
    assert not judged(served(CUT_SHORT), None).passed


def test_a_prompt_past_the_models_positions_keeps_the_planted_needle_as_the_bar() -> None:
    referee = FakeReferee()  # would call the cut-short answer the model's own: not ground truth out there
    cell = judged(served(CUT_SHORT), referee, prompt_tokens=9000, max_positions=8192)
    assert not cell.passed and not cell.model_limit and referee.paths == []
    assert cell.judged_by.startswith("the planted needle: prompt and answer (9,007 tokens) run past the 8,192")


def test_a_server_that_cannot_return_logprobs_is_judged_by_the_planted_needle() -> None:
    """SmolLM2 served past its positions answers HTTP 400 (non-finite logprobs) when asked for logprobs; the cell is
    asked again without them and its needle is the bar."""
    for tokens, passed in ((CUT_SHORT, False), (FOUND, True)):
        answer = served(tokens).model_copy(update={"tokens": []})
        cell = NeedleCell(
            target_tokens=9000, prompt_tokens=9000, depth=0.5, actual_depth=0.5, needle_key=NEEDLE.key,
            needle_value=NEEDLE.value, answer=answer.text, found=NEEDLE.found_in(answer.text), seconds=0.1,
            logprobs_error="HTTP 400: Out of range float values are not JSON compliant", cached_tokens=0,
        )
        referee = FakeReferee()
        NeedleJudge(cast(Endpoint, FakeEndpoint()), referee, NOISE, None, "every-cell").judge(cell, answer, list)
        assert cell.passed is passed and referee.paths == [] and cell.text_mismatch is None
        assert cell.judged_by.startswith("the planted needle: the server returned no logprobs (HTTP 400")


def test_an_answer_whose_text_is_not_its_tokens_fails() -> None:
    rewritten = served(FOUND, text="The number is 8254085.")  # a proxy that changes the text only
    cell = judged(rewritten, FakeReferee())
    assert not cell.passed and cell.text_mismatch is not None and "is not what its tokens say" in cell.text_mismatch
    # with the needle still in the text, too: the text must be the tokens'
    assert not judged(served(CUT_SHORT, text="The number is 7143974."), FakeReferee()).passed
    named = Answer(text="The", tokens=["The"], seconds=0.1, finish_reason="length")
    cell = judged(named, FakeReferee())
    assert not cell.passed and cell.text_mismatch is not None and "token_id:N" in cell.text_mismatch


@pytest.mark.integration
def test_needle_grid_on_smollm2(cpu_server: Endpoint, cpu_recipe: Recipe, tmp_path: Path) -> None:
    lengths = [800, 2000]
    started = time.monotonic()
    ctx = CheckContext(cpu_server, cpu_recipe, out_dir=tmp_path, params={"needle_lengths": lengths})
    [result] = run_checks(ctx, ["needles"]).checks
    cells = result.details["cells"]
    assert len(cells) == len(lengths) * 3
    assert sorted({c["prompt_tokens"] for c in cells}) == lengths  # token-exact, as the server counted them
    assert len({c["needle_value"] for c in cells}) == len(cells)  # a fresh needle per cell
    assert all(not c["cached_tokens"] for c in cells)  # every cell cold
    for c in cells:
        assert c["found"] == (c["needle_value"] in c["answer"])
    assert "figure" not in result.details and list(tmp_path.iterdir()) == []  # the check returns data, never draws
    assert plots.save(plots.needles_figure(result), tmp_path / "needles.png").read_bytes()[:4] == b"\x89PNG"
    # SmolLM2-135M finds the needle at every cell of this grid (measured); a miss is a real regression.
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    assert result.result == "3/3 at 800 and 2K tokens"
    assert result.label == "Needle in a haystack, 3 depths, cold"
    print(f"\nSmolLM2 needles: {result.result}; times {result.details['times']} ({time.monotonic() - started:.1f} s)")


@pytest.mark.integration
def test_needles_do_not_run_on_the_random_weight_hybrid(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    [result] = run_checks(CheckContext(hybrid_server, hybrid_recipe), ["needles"]).checks
    assert result.status == "skipped" and "random weights" in result.result


# -- through the fault proxy ---------------------------------------------------------------------------------------


def _needles_through(server: Endpoint, recipe: Recipe, fault: object, lengths: list[int], depths: list[float]) -> CheckResult:
    from cookbook.faultproxy import FaultProxy

    with FaultProxy(server.base_url, fault) as proxy:  # type: ignore[arg-type]
        params = {"needle_lengths": lengths, "needle_depths": depths}
        ctx = CheckContext(Endpoint(proxy.base_url, server.model), recipe, params=params)
        [result] = run_checks(ctx, ["needles"]).checks
    return result


@pytest.mark.integration
def test_a_needle_lost_beyond_a_depth_fails_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import NeedleLostBeyond

    result = _needles_through(cpu_server, cpu_recipe, NeedleLostBeyond(depth=0.5), [800], [0.1, 0.9])
    assert result.status == "fail", (result.result, [e.note for e in result.evidence])
    assert result.result == "1/2 at 800 tokens"
    [miss] = [c for c in result.details["cells"] if not c["found"]]
    assert miss["depth"] == 0.9
    assert "expected" in result.evidence[0].note and "at depth 0.9" in result.evidence[0].note


@pytest.mark.integration
def test_a_needle_lost_beyond_a_length_fails_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import NeedleLostBeyond

    result = _needles_through(cpu_server, cpu_recipe, NeedleLostBeyond(depth=None, tokens=1500), [800, 2000], [0.5])
    assert result.status == "fail"
    assert result.result == "1/1 at 800, 0/1 at 2K tokens"
    assert any(re.search(NeedleLostBeyond.symptom, e.note) for e in result.evidence), [e.note for e in result.evidence]


@pytest.mark.integration
def test_a_shorter_needle_lost_or_altered_still_fails(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """The recipe's shorter needle (verification.needles.value_digits) detects as the seven-digit one did: a needle
    lost beyond a depth fails its cell, and only that cell."""
    from cookbook.faultproxy import FaultProxy
    from cookbook.faults_longctx import NeedleLostBeyond

    with FaultProxy(cpu_server.base_url, NeedleLostBeyond(depth=0.5)) as proxy:
        params = {"needle_lengths": [800], "needle_depths": [0.1, 0.9], "needle_digits": 5}
        [result] = run_checks(CheckContext(Endpoint(proxy.base_url, cpu_server.model), cpu_recipe, params=params), ["needles"]).checks
    assert result.status == "fail" and result.result == "1/2 at 800 tokens", (result.result, [e.note for e in result.evidence])
    assert all(len(c["needle_value"]) == 5 for c in result.details["cells"])
    [miss] = [c for c in result.details["cells"] if not c["found"]]
    assert miss["depth"] == 0.9 and miss["needle_value"] not in miss["answer"]


@pytest.mark.integration
def test_cached_tokens_on_a_cold_cell_fail_the_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    from cookbook.faults_longctx import CachedOnCold

    result = _needles_through(cpu_server, cpu_recipe, CachedOnCold(), [800], [0.5])
    assert result.status == "fail"
    assert result.result == "1/1 at 800 tokens; 1 cell not cold (cached tokens with a fresh cache_salt)"
    assert any(re.search(CachedOnCold.symptom, e.note) for e in result.evidence), [e.note for e in result.evidence]


def test_the_needle_fault_finds_the_needle_depth_in_a_request() -> None:
    from cookbook.faults_longctx import needle_depth
    from cookbook.haystack import _messages, make_needle

    needle = make_needle(0)
    content = _messages(f"{'Filler. ' * 90}{needle.sentence} {'Filler. ' * 10}", needle)[0]["content"]
    depth = needle_depth(content)
    assert depth is not None and 0.75 < depth < 0.95
    assert needle_depth("no document here") is None


def test_long_context_faults_are_made_by_name_from_a_table_of_ones_own() -> None:
    from cookbook.faultproxy import FAULTS, fault_table, make_fault
    from cookbook.faults_longctx import LONG_CONTEXT_FAULTS

    table = fault_table(LONG_CONTEXT_FAULTS)  # a fresh dict: the shared FAULTS stays as it was
    for name, fault in LONG_CONTEXT_FAULTS.items():
        made = make_fault(name, table)
        assert type(made) is type(fault) and made is not fault
        assert set(made.catches) <= {"prefix-cache", "needles"} and made.symptom
        assert name not in FAULTS


# -- judged by the reference on the real server ----------------------------------------------------------------------


@pytest.mark.integration
def test_the_clean_server_passes_the_recipes_needle_grid(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """The recipe's own lengths and depths (the demo's grid): a cell the 135M model misses by itself is a model limit
    the reference confirms, never a fail; every cell says what judged it."""
    from cookbook.checks.needles import MODEL_MISSES, NEAR_TIE, SAME_ANSWER

    started = time.monotonic()
    [result] = run_checks(CheckContext(cpu_server, cpu_recipe), ["needles"]).checks
    cells = result.details["cells"]
    assert result.details.get("requested_lengths") is None and len(cells) == 9
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    for c in cells:
        assert c["passed"] and c["text_mismatch"] is None and c["disputed"] is None, c
        assert c["judged_by"] == "the reference" if not c["found"] else c["judged_by"].startswith("the planted needle")
        if c["model_limit"]:  # the 135M model's own miss (4000@0.5 cut 7143974 short), or a near-tie from it
            kind = SAME_ANSWER if c["limit"] == SAME_ANSWER else NEAR_TIE
            assert c["limit"].startswith(kind) and f"a model limit: {kind}" in result.result, (c, result.result)
            assert c["reference_answer"] == c["answer"] if kind == SAME_ANSWER else "within the tie margin" in c["limit"]
    misses = [f"{c['target_tokens']}@{c['depth']:g}" for c in cells if c["model_limit"]]
    assert result.details["noise"] == {MODEL_MISSES: misses}
    judged = {f"{c['target_tokens']}@{c['depth']:g}": c["reference_s"] for c in cells if c["reference_s"] is not None}
    print(f"\nrecipe grid: {result.result}; {result.details['reference']['judge']}; reference s per cell {judged}; "
          f"{time.monotonic() - started:.0f} s")


class AlteredNeedleDigit(Fault):
    """A server that answers one digit off, consistently: the text and its token ids both say the wrong number (a
    wrong long-context state would), so only the reference can tell it from the model's own miss."""

    name = "altered-needle-digit"
    catches = ("needles",)
    symptom = r"at answer token \d+ the server chose"

    def __init__(self, digit_ids: dict[int, int]) -> None:
        self.digit_ids = digit_ids  # token id -> digit
        self.ids_of = {digit: token for token, digit in digit_ids.items()}
        super().__init__()

    def response(self, ex: Exchange, body: Any) -> Any:
        if not (ex.is_chat and ex.status == 200 and isinstance(body, dict)):
            return body
        for choice in body.get("choices") or []:
            items = (choice.get("logprobs") or {}).get("content") or []
            ids = [maybe_token_id(item.get("token")) for item in items]
            digit_at = {j: self.digit_ids[t] for j, t in enumerate(ids) if t is not None and t in self.digit_ids}
            content = (choice.get("message") or {}).get("content") or ""
            last = max((m.start() for m in re.finditer(r"\d", content)), default=None)
            if not digit_at or last is None:
                continue
            step = max(digit_at)
            wrong = (digit_at[step] + 1) % 10
            items[step]["token"] = f"token_id:{self.ids_of[wrong]}"
            choice["message"]["content"] = content[:last] + str(wrong) + content[last + 1:]
        return body


@pytest.mark.integration
def test_a_needle_altered_in_text_and_tokens_alike_is_ruled_out_by_the_reference(
    cpu_server: Endpoint, cpu_recipe: Recipe
) -> None:
    """The text is its tokens and the needle is missing, as in the model's own misses: the reference, not the planted
    needle, says the server chose a digit a correct forward pass does not."""
    digit_ids = {cpu_server.tokenize(str(d))[0]: d for d in range(10)}
    assert len(digit_ids) == 10  # one token per digit in SmolLM2's tokenizer
    with FaultProxy(cpu_server.base_url, AlteredNeedleDigit(digit_ids)) as proxy:
        params = {"needle_lengths": [800], "needle_depths": [0.5]}
        [result] = run_checks(CheckContext(Endpoint(proxy.base_url, cpu_server.model), cpu_recipe, params=params),
                              ["needles"]).checks
    [c] = result.details["cells"]
    assert result.status == "fail" and result.result == "0/1 at 800 tokens", result.result
    assert not c["found"] and c["text_mismatch"] is None and not c["model_limit"]
    assert c["judged_by"] == "the reference" and re.search(AlteredNeedleDigit.symptom, c["disputed"]), c
    assert any(re.search(AlteredNeedleDigit.symptom, e.note) for e in result.evidence)
