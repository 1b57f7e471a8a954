"""The numerics oracle without a server: judging flips, the top-k divergence, layout facts, golden files, the
comparison of one prompt, and a seed recipe with no reference ("not run", never a pass)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cookbook.checks import CHECKS, CheckContext, selected_checks
from cookbook.checks.oracle import (
    DEFAULT_TOLERANCES,
    LABEL,
    _outcome,
    compare_prompt,
    oracle,
    tolerance_for,
    topk_divergence,
)
from cookbook.checks.kit.departure import rank_by_reference
from cookbook.checks.registry import CheckSkipped
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.faults_oracle import ShiftedPromptLogprobs, SwappedGreedyToken
from cookbook.faultproxy import Exchange
from cookbook.haystack import sliding_windows
from cookbook.recipes import OracleTolerance, list_recipes, load_recipe
from cookbook.reference import (
    NO_REFERENCE,
    GoldenReference,
    Layout,
    OraclePrompt,
    RefPosition,
    RefScore,
    Served,
    build_prompts,
    golden_path,
    recorded_positions,
    reference_for,
)

# Every recipe that runs on the CPU image must carry its golden file: derived, so a new CPU recipe cannot be left out.
CPU_RECIPES = sorted(r.id for r in list_recipes() if r.hardware.kind == "cpu")
SEEDS = ["Qwen/Qwen3-Coder-Next", "Qwen/Qwen-AgentWorld-35B-A3B", "Qwen/Qwen3.5-122B-A10B-FP8"]
TOL = DEFAULT_TOLERANCES["bf16"]


# -- judging a flip: the probe kit's one rule, with the reference as the baseline ----------------------------------------


def test_a_flip_between_near_tied_tokens_is_a_tie_with_its_margin() -> None:
    ref = RefPosition(7, -1.00, {7: -1.00, 9: -1.05, 3: -2.5})
    verdict = rank_by_reference(ref, 7, 9, 0.5)
    assert verdict is not None and verdict.verdict == "tie" and verdict.margin == pytest.approx(0.05)
    assert "0.050 apart" in verdict.note and not verdict.failed


def test_a_flip_to_a_token_ranked_clearly_lower_fails() -> None:
    ref = RefPosition(7, -0.2, {7: -0.2, 9: -2.0, 3: -2.5})
    verdict = rank_by_reference(ref, 7, 3, 0.5)
    assert verdict is not None and verdict.failed and verdict.margin == pytest.approx(2.3)
    assert "ranked 2.300 below" in verdict.note


def test_a_flip_outside_the_reference_top_k_fails_unless_the_floor_is_within_tolerance() -> None:
    clear = RefPosition(7, -0.1, {7: -0.1, 9: -3.0})
    found = rank_by_reference(clear, 7, 42, 0.5)
    assert found is not None and found.failed and found.bound == "at least"
    flat = RefPosition(7, -9.40, {7: -9.40, 9: -9.45})  # a random-weight model: everything is a near-tie
    verdict = rank_by_reference(flat, 7, 42, 0.5)
    assert verdict is not None and verdict.verdict == "tie" and verdict.bound == "at least"


def test_the_oracle_never_calls_a_flip_from_its_own_argmax_the_baseline_off() -> None:
    """With the reference as the baseline, `expected` is its own argmax: the other token can only rank below it."""
    ref = RefPosition(7, -0.5, {7: -0.5, 9: -0.6})
    verdict = rank_by_reference(ref, ref.argmax, 9, 0.05)
    assert verdict is not None and verdict.verdict == "fail"


# -- measures ---------------------------------------------------------------------------------------------------------


def test_topk_divergence_is_zero_for_equal_lists_and_grows_with_the_gap() -> None:
    top = {1: -0.1, 2: -2.5, 3: -4.0}
    assert topk_divergence(top, dict(top)) == 0.0
    small = topk_divergence(top, {1: -0.12, 2: -2.45, 3: -4.0})
    large = topk_divergence(top, {2: -0.1, 1: -2.5, 3: -4.0})
    assert 0 < small < 0.05 < large <= 1.0


def test_sliding_windows_come_from_the_config_only_when_a_layer_slides() -> None:
    assert sliding_windows({"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}) == (512,)
    assert sliding_windows({"sliding_window": 4096, "layer_types": ["full_attention"] * 2}) == ()
    assert sliding_windows({"sliding_window": 4096, "use_sliding_window": False}) == ()
    assert sliding_windows({"sliding_window": 4096}) == (4096,)  # Mistral-style: every layer slides
    assert sliding_windows({"text_config": {"sliding_window": 1024, "layer_types": ["sliding_attention"]}}) == (1024,)
    assert sliding_windows({"sliding_window": None}) == ()
    assert sliding_windows(None) == ()


def test_recorded_positions_keep_short_prompts_whole_and_long_ones_in_the_hundreds() -> None:
    assert recorded_positions(10) == list(range(1, 10))
    kept = recorded_positions(8168)
    assert len(kept) < 600 and kept[:64] == list(range(1, 65)) and kept[-1] == 8167


def _tokenize(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character (enough to build a prompt set of exact lengths)."""
    return [ord(c) % 500 + 3 for c in text]


def test_the_prompt_set_follows_block_size_windows_and_context() -> None:
    layout = Layout(block_size=128, windows=(512,), max_model_len=4096, block_size_from="metrics", windows_from="config")
    prompts, notes = build_prompts(_tokenize, layout, max_new_tokens=16)
    kinds = [(p.kind, len(p.prompt_ids)) for p in prompts]
    assert [k for k, _ in kinds] == ["short", "short", "short", "blocks", "window", "long"]
    assert dict(kinds[3:]) == {"blocks": 3 * 128 + 64, "window": 2 * 512 + 64, "long": 4096 - 16}
    assert not notes
    prompts, notes = build_prompts(_tokenize, Layout(None, (8000,), 4096), max_new_tokens=16)
    assert [p.kind for p in prompts] == ["short", "short", "short", "long"]
    assert any("no block size" in n for n in notes) and any("8000" in n for n in notes)


# -- comparing one prompt -------------------------------------------------------------------------------------------


def _served(prompt: list[int], ref: RefScore, shift: float = 0.0, swap_at: int | None = None) -> Served:
    tokens = list(ref.greedy_ids)
    logprobs = [g.logprob for g in ref.greedy]
    if swap_at is not None:
        worst = min(ref.greedy[swap_at].top.items(), key=lambda kv: kv[1])
        tokens[swap_at], logprobs[swap_at] = worst
    return Served(
        tokens=tokens,
        logprobs=logprobs,
        top=[dict(g.top) for g in ref.greedy],
        prompt_logprobs=[None] + [p.logprob + shift for p in ref.prompt[1:] if p],
        prompt_top=[{}] + [{t: v + shift for t, v in p.top.items()} for p in ref.prompt[1:] if p],
        prompt_rank1=[None] + [p.argmax for p in ref.prompt[1:] if p],
        seconds=0.1,
        body={},
    )


def _ref(prompt: list[int], steps: int = 4) -> RefScore:
    positions = [None] + [RefPosition(t, -1.0, {t: -1.0, t + 1: -2.0, t + 2: -3.5}) for t in prompt[1:]]
    greedy = [RefPosition(100 + s, -0.5, {100 + s: -0.5, 200: -2.0, 300: -4.0}) for s in range(steps)]
    return RefScore("test", positions, greedy)


class _NoScore:
    source = "test"

    def can_score(self, prompt_ids: list[int]) -> bool:
        return False

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        raise AssertionError("not called")


def _compare(shift: float = 0.0, swap_at: int | None = None):  # type: ignore[no-untyped-def]
    prompt = OraclePrompt("short", "test", [5, 6, 7, 8, 9])
    ref = _ref(prompt.prompt_ids)
    comparison = compare_prompt(prompt, _served(prompt.prompt_ids, ref, shift, swap_at), ref, TOL, _NoScore())
    layout = Layout(128, (), 8192)
    return _outcome([comparison], TOL, "test tolerances", "golden file test", layout, [], 3)


def test_identical_logprobs_pass_with_full_agreement() -> None:
    outcome = _compare()
    assert outcome.passed, outcome.result
    assert outcome.result.startswith("top-1 agreement 4/4") and "greedy 4/4 tokens" in outcome.result
    assert outcome.details["max_abs_delta"] == 0.0


def test_shifted_prompt_logprobs_fail_naming_the_positions() -> None:
    outcome = _compare(shift=1.2)
    assert not outcome.passed
    assert "max |delta logprob| 1.200 > 0.6" in outcome.result
    assert "4 of 4 positions off by more than 0.6, the first at position 1" in outcome.evidence[0].note


def test_a_greedy_token_the_reference_ranks_clearly_lower_fails() -> None:
    outcome = _compare(swap_at=2)
    assert not outcome.passed
    assert "greedy continuation departs from the reference" in outcome.result
    assert any("ranked 3.500 below" in e.note for e in outcome.evidence)


# -- the faults rewrite what they should ----------------------------------------------------------------------------


def _completion_exchange() -> Exchange:
    return Exchange(1, "POST", "/v1/completions", {}, lambda: 1, status=200)


def test_the_shifted_logprobs_fault_moves_positions_from_its_start_on() -> None:
    body = {"choices": [{"prompt_logprobs": [None] + [{"5": {"logprob": -1.0, "rank": 1}} for _ in range(9)]}]}
    out = ShiftedPromptLogprobs(delta=1.0, start=4, every=2).response(_completion_exchange(), body)
    values = [e["5"]["logprob"] if e else None for e in out["choices"][0]["prompt_logprobs"]]
    assert values == [None, -1.0, -1.0, -1.0, -2.0, -1.0, -2.0, -1.0, -2.0, -1.0]


def test_the_swapped_token_fault_picks_the_lowest_of_the_top_k() -> None:
    body = {"choices": [{"logprobs": {
        "tokens": ["token_id:1", "token_id:2", "token_id:3"], "token_logprobs": [-0.1, -0.2, -0.3],
        "top_logprobs": [{}, {}, {"token_id:3": -0.3, "token_id:9": -4.0, "token_id:8": -2.0}],
    }}]}
    out = SwappedGreedyToken(step=2).response(_completion_exchange(), body)
    lp = out["choices"][0]["logprobs"]
    assert lp["tokens"][2] == "token_id:9" and lp["token_logprobs"][2] == -4.0


# -- recipes, golden files, which reference ---------------------------------------------------------------------------


def test_the_oracle_is_registered_in_a_group_of_its_own_before_server_health() -> None:
    assert CHECKS["oracle"].group == "oracle" and CHECKS["oracle"].label == LABEL
    assert "cookbook's own" in LABEL
    assert list(CHECKS)[-1] == "server-health"
    assert [s.name for s in selected_checks(["oracle"], None)] == ["oracle"]


@pytest.mark.parametrize("recipe_id", SEEDS)
def test_a_seed_recipe_without_a_golden_file_is_not_run_never_a_pass(recipe_id: str) -> None:
    recipe = load_recipe(recipe_id)
    assert not golden_path(recipe).exists()
    ctx = CheckContext(Endpoint("http://127.0.0.1:9", recipe.served_model_name), recipe)
    reference, why = reference_for(ctx)
    assert reference is None and why == NO_REFERENCE
    with pytest.raises(CheckSkipped, match=f"^not run: {NO_REFERENCE}$"):
        oracle(ctx)


def test_the_cpu_recipes_are_found() -> None:
    assert {"HuggingFaceTB/SmolLM2-135M-Instruct", "cookbook/tiny-qwen3-next", "cookbook/tiny-gemma3"} <= set(CPU_RECIPES)


@pytest.mark.parametrize("recipe_id", CPU_RECIPES)
def test_each_cpu_recipe_has_a_small_golden_file_used_by_default(recipe_id: str) -> None:
    recipe = load_recipe(recipe_id)
    path = golden_path(recipe)
    assert path.exists(), f"{path}: record it with `cookbook reference record {recipe_id}`"
    assert path.stat().st_size < 400_000
    golden = GoldenReference.load(path)
    produced = golden.produced
    for key in ("source", "at", "machine", "image"):
        assert produced.get(key), f"{path}: produced.{key} missing"
    assert "fp32" in produced["source"] and "transformers" in produced["source"]
    kinds = {p.kind for p in golden.prompts}
    assert {"short", "blocks", "long"} <= kinds
    block = golden.data["layout"]["block_size"]
    assert any(len(p.prompt_ids) > 3 * block for p in golden.prompts if p.kind == "blocks")
    long = next(p for p in golden.prompts if p.kind == "long")
    assert len(long.prompt_ids) >= recipe.max_model_len * 0.9
    for window in golden.data["layout"].get("windows") or []:  # a sliding-window model: a prompt past twice it
        assert any(p.kind == "window" and len(p.prompt_ids) > 2 * window for p in golden.prompts), window
    ctx = CheckContext(Endpoint("http://127.0.0.1:9", recipe.served_model_name), recipe)
    reference, source = reference_for(ctx)
    assert isinstance(reference, GoldenReference) and source.startswith("golden file")
    first = golden.prompts[0]
    score = reference.score(first.prompt_ids, 4)
    assert score.prompt[0] is None and len(score.prompt) == len(first.prompt_ids) and len(score.greedy) == 4
    assert not reference.can_score(first.prompt_ids + [1])


def test_a_broken_golden_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "golden.json"
    bad.write_text("{not json")
    with pytest.raises(CookbookError, match="golden.json: not valid JSON"):
        GoldenReference.load(bad)
    bad.write_text(json.dumps({"format": 1, "prompts": [{"prompt_ids": [1, 2], "positions": [1], "prompt": []}]}))
    with pytest.raises(CookbookError, match=r"golden.json: prompts.0: "):
        GoldenReference.load(bad)


def test_tolerances_come_from_the_recipe_for_its_dtype() -> None:
    calibrated = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    recipe = calibrated.model_copy(update={"calibration": None})
    tol, where = tolerance_for(CheckContext(Endpoint("http://127.0.0.1:9", "m"), recipe))
    assert isinstance(tol, OracleTolerance) and where == "the recipe's bf16 tolerances"
    assert tol.measured, "the recipe says what its tolerances were measured on"
    tol, where = tolerance_for(CheckContext(Endpoint("http://127.0.0.1:9", "m"), calibrated))
    assert where.startswith("calibration (3 clean runs") and where.endswith("over the recipe's bf16 tolerances")
    assert calibrated.calibration is not None
    assert tol.tie_margin == calibrated.calibration.values["reference.tie_margin"].allowed


def test_the_recipe_schema_rejects_a_golden_path_outside_the_folder(tmp_path: Path) -> None:
    from cookbook.recipes import OracleExpectation

    with pytest.raises(ValueError, match="inside the recipe's folder"):
        OracleExpectation(golden="../other/golden.json")
    assert OracleExpectation(golden="reference/gaudi2.json").golden == "reference/gaudi2.json"


def test_a_run_page_shows_the_oracle_row_labelled_as_the_cookbook_s_own() -> None:
    from cookbook.pages import render_page
    from cookbook.results import CheckResult, Hardware, RunResults

    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    results = RunResults(
        recipe=recipe.id, model=recipe.served_model_name, hardware=Hardware(kind="cpu", description="2 vCPU"),
        checks=[CheckResult(name="oracle", label=LABEL, status="pass", result="top-1 agreement 10/10 (golden file)")],
    )
    page = render_page(recipe, results)
    assert f"| {LABEL} | top-1 agreement 10/10 (golden file) |" in page


def test_reference_record_refuses_bad_input_in_one_line_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.cli import main

    seed = load_recipe("Qwen/Qwen3-Coder-Next")
    assert main(["reference", "record", "Qwen/Qwen3-Coder-Next"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no local checkpoint" in err and "--base-url" in err
    assert not golden_path(seed).exists()
    assert main(["reference", "record", "Qwen/Qwen3-Coder-Next", "--from", "computed", "--base-url", "http://127.0.0.1:9"]) == 2
    assert "choose one source" in capsys.readouterr().err
    assert main(["reference", "record", "no/such-recipe"]) == 2
    assert main(["reference", "record", "Qwen/Qwen3-Coder-Next", "--base-url", "http://127.0.0.1:9"]) == 1
    assert "does not answer /health" in capsys.readouterr().err
    assert not golden_path(seed).exists()


class _Known:
    """A reference that knows some prompts only (as a golden file does)."""

    def __init__(self, name: str, prompts: list[list[int]] | None) -> None:
        self.source, self.prompts, self.asked = name, prompts, []

    def can_score(self, prompt_ids: list[int]) -> bool:
        return self.prompts is None or prompt_ids in self.prompts

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5):
        from cookbook.reference import RefPosition, RefScore

        self.asked.append(list(prompt_ids))
        return RefScore(self.source, [None], [RefPosition(7, -0.1, {7: -0.1})])


def test_the_fallback_reference_asks_the_golden_file_first_and_the_forward_pass_for_any_other_prompt() -> None:
    from cookbook.reference import FallbackReference

    golden, computed = _Known("golden", [[1, 2, 3]]), _Known("computed", None)
    both = FallbackReference(golden, computed)
    assert both.can_score([1, 2, 3]) and both.can_score([9, 9])
    assert both.score([1, 2, 3], 1).source == "golden" and both.score([9, 9], 1).source == "computed"
    assert golden.asked == [[1, 2, 3]] and computed.asked == [[9, 9]]
    assert both.source == "golden; for a prompt it did not record, computed"
    assert not FallbackReference(_Known("g", []), _Known("c", [])).can_score([4])


def test_a_computed_score_is_read_back_from_the_cache_without_loading_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later notebook or run asks the same forward pass again: it reads the answer, and no process starts (the
    image's Python here does not exist, so a start would fail). Another checkpoint's files never share it."""
    from cookbook.image import ImageEnv
    from cookbook.reference import ComputedReference
    from cookbook.reference._computed import ScoreCache

    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    image = ImageEnv(python=tmp_path / "no-python", bin_dir=tmp_path)
    answer = {"prompt": [None, [5, -1.25, [[5, -1.25], [6, -2.0]]]], "greedy": [[7, -0.5, [[7, -0.5]]]]}
    scores = ScoreCache(checkpoint, image)
    scores.put(ScoreCache.key([4, 5], 1, 5), {"info": {"transformers": "test"}, "started_at": "then", "answer": answer})
    ref = ComputedReference(checkpoint, image)
    scored = ref.score([4, 5], 1, top_k=5)
    assert scored.prompt[1] == RefPosition(5, -1.25, {5: -1.25, 6: -2.0}) and scored.greedy_ids == [7]
    assert ref._proc is None and "transformers test" in scored.source
    with pytest.raises(CookbookError):
        ref.score([4, 5, 6], 1, top_k=5)  # not in the cache: the forward pass must start, and cannot here
    (checkpoint / "model.safetensors").write_text("other weights")
    assert ScoreCache(checkpoint, image).folder != scores.folder


def test_a_small_drift_on_every_prompt_position_fails_the_mean_and_names_the_sample() -> None:
    prompt = OraclePrompt("blocks", "test", list(range(5, 205)))
    ref = _ref(prompt.prompt_ids)
    served = _served(prompt.prompt_ids, ref, shift=TOL.mean_abs_delta * 2)  # below the max, above the mean
    comparison = compare_prompt(prompt, served, ref, TOL, _NoScore())
    outcome = _outcome([comparison], TOL, "test tolerances", "golden file test", Layout(128, (), 8192), [], 3)
    assert not outcome.passed
    assert "mean |delta logprob|" in outcome.result and "standard errors over" in outcome.result
    assert "max |delta logprob|" not in outcome.result
    assert outcome.details["mean_abs_delta_allowed"] >= TOL.mean_abs_delta
