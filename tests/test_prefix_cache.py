"""cookbook.checks.prefix_cache: the judgement (unit) and the probe against both CPU recipes (integration)."""
from __future__ import annotations

import time

import pytest

from cookbook.checks import CheckContext, run_checks
from cookbook.checks.prefix_cache import (
    CacheLayout,
    PrefixCacheReport,
    _cache_problems,
    compare,
    probe_prefix_cache,
    read_hits,
    result_text,
    server_cache_config,
)
from cookbook.checks.kit import Referee, tolerances
from cookbook.endpoint import Endpoint
from cookbook.reference import RefPosition, RefScore
from cookbook.haystack import Answer
from cookbook.recipes import Recipe
from cookbook.results import CheckResult

CPU = CacheLayout(enabled=True, block_size=128, hits_from_request=2, source="test")
HYBRID = CacheLayout(enabled=True, block_size=256, hits_from_request=3, source="test")
OFF = CacheLayout(enabled=False, hits_from_request=2, source="test")


def answer(text: str = "4829173", logprobs: tuple[float, ...] = (-0.5, -0.25), cached: int | None = 0) -> Answer:
    tokens = [text[: len(text) // 2], text[len(text) // 2 :]]
    return Answer(text=text, tokens=tokens, logprobs=list(logprobs), cached_tokens=cached, seconds=0.1)


# -- unit ----------------------------------------------------------------------------------------------------------


def test_compare_reports_bit_identity_and_the_largest_difference() -> None:
    same = compare(answer(), answer(cached=384))
    assert same.text_identical and same.bit_identical and same.max_logprob_diff == 0.0
    close = compare(answer(), answer(logprobs=(-0.5, -0.31)))
    assert close.text_identical and not close.bit_identical
    assert close.max_logprob_diff == pytest.approx(0.06)
    differs = compare(answer(), answer(text="4829999"))
    assert not differs.text_identical and not differs.tokens_identical
    assert differs.compared_tokens == 1  # the logprobs are compared up to the first different token
    assert not compare(answer(logprobs=()), answer(logprobs=())).logprobs_returned


def test_longest_hit_is_the_full_blocks_before_the_last_token() -> None:
    assert CPU.longest_hit(2007) == 1920  # the research's measured case
    assert HYBRID.longest_hit(2467) == 2304 and HYBRID.longest_hit(395) == 256
    assert CPU.longest_hit(128) == 0 and CPU.longest_hit(129) == 128
    assert OFF.longest_hit(100_000) == 0


def test_cached_tokens_rules() -> None:
    assert _cache_problems(CPU, 437, [0, 384], 2) == []
    assert _cache_problems(CPU, 437, [None, 384], 2) == []
    assert _cache_problems(HYBRID, 2467, [0, 0, 2304], 3) == []
    assert _cache_problems(CPU, 120, [0, 0], 2) == []
    [cold] = _cache_problems(CPU, 437, [256, 384], 2)
    assert "cold request" in cold
    [not_multiple] = _cache_problems(CPU, 437, [0, 300], 2)
    assert "not a multiple of the 128-token block" in not_multiple
    [too_many] = _cache_problems(CPU, 437, [0, 512], 2)
    assert "more than the 384" in too_many
    [short] = _cache_problems(CPU, 120, [0, 128], 2)
    assert "shorter than one 128-token block" in short
    [missed] = _cache_problems(HYBRID, 2467, [0, 0, 0], 3)
    assert "request 3" in missed and "did not hit" in missed
    [cached_when_off] = _cache_problems(OFF, 5000, [0, 4992], 2)
    assert "prefix caching off" in cached_when_off


def _report(
    layout: CacheLayout, expected: str, allowed: float, rows: list[tuple[int, list[int], float, str]]
) -> PrefixCacheReport:
    """Prompts whose last request answers `text` with its second logprob moved by `diff`; the others match cold."""
    from cookbook.checks.prefix_cache import PromptReport, _judge, combine

    prompts = []
    for tokens, cached, diff, text in rows:
        cold = answer()
        answers = [cold, *(answer(cached=c) for c in cached[1:-1])]
        answers.append(answer(text=text, logprobs=(-0.5, -0.25 - diff), cached=cached[-1]))
        comparisons = [compare(cold, later) for later in answers[1:]]
        report = PromptReport(
            target_tokens=tokens, prompt_tokens=tokens, salt="s", cached_tokens=list(cached),
            seconds=[0.1] * len(cached), metric_deltas=[float(c) for c in cached],
            hit_request=next((n for n, c in enumerate(cached, 1) if c), None), comparisons=comparisons,
            comparison=combine(comparisons), problems=_cache_problems(layout, tokens, list(cached), len(cached)),
            texts=[a.text for a in answers],
        )
        _judge(report, expected, allowed)
        prompts.append(report)
    return PrefixCacheReport(
        layout=layout, logprobs_expected=expected, max_logprob_diff_allowed=allowed, prompts=prompts  # type: ignore[arg-type]
    )


def test_an_early_hit_is_judged_too() -> None:
    """'align' mode can hit on the second request already (measured: 768 of an 800-token prompt); it is compared."""
    report = _report(HYBRID, "bit-identical", 0.0, [(800, [0, 768, 768], 0.0, "4829173")])
    assert report.passed and report.prompts[0].hit_request == 2
    early = report.prompts[0].model_copy(deep=True)
    early.comparisons[0] = compare(answer(), answer(text="1234567", cached=768))
    early.texts[1] = "1234567"
    early.problems = []
    from cookbook.checks.prefix_cache import _judge

    _judge(early, "bit-identical", 0.0)
    assert any(p.startswith("request 2 (a hit, 768 cached) answered '1234567'") for p in early.problems)


def test_result_text_in_the_seeds_wording() -> None:
    hybrid = _report(HYBRID, "bit-identical", 0.0, [(200, [0, 0, 0], 0.0, "4829173"), (2467, [0, 0, 2304], 0.0, "4829173")])
    assert hybrid.passed
    assert result_text(hybrid) == (
        "identical text and bit-identical logprobs 2/2; cached tokens a multiple of 256 on every hit "
        "(the 200-token prompt, shorter than one block, never hit)"
    )
    cpu = _report(CPU, "close", 0.15, [(300, [0, 256], 0.0, "4829173"), (1500, [0, 1408], 0.0625, "4829173")])
    assert cpu.passed
    assert result_text(cpu) == (
        "identical text 2/2, logprobs within 0.15 of the cold run (max diff 0.062; bit-identical 1/2); "
        "cached tokens a multiple of 128 on every hit"
    )
    off = _report(OFF, "bit-identical", 0.0, [(6000, [0, 0], 0.0, "4829173")])
    assert off.passed and result_text(off).endswith("nothing cached on any request (prefix caching off)")


def test_result_text_names_what_failed() -> None:
    shifted = _report(HYBRID, "bit-identical", 0.0, [(2467, [0, 0, 2304], 0.5, "4829173")])
    assert not shifted.passed
    assert result_text(shifted).startswith("identical text 1/1, bit-identical logprobs 0/1 (max diff 0.5)")
    wrong_text = _report(CPU, "close", 0.15, [(1500, [0, 1408], 0.0, "1234567")])
    assert not wrong_text.passed and result_text(wrong_text).startswith("identical text 0/1")
    too_far = _report(CPU, "close", 0.15, [(1500, [0, 1408], 0.25, "4829173")])
    assert not too_far.passed and "logprobs within 0.15 on 0/1 (max diff 0.25" in result_text(too_far)
    odd_block = _report(CPU, "close", 0.15, [(1500, [0, 1400], 0.0, "4829173")])
    assert not odd_block.passed and result_text(odd_block).endswith("cached tokens wrong on 1 of 1 prompts")


IS, WAS, A = 7, 9, 5  # token ids of " is", " was", " a"


def _flipped(cold_top: list[tuple[int, float]], later_top: list[tuple[int, float]]) -> tuple[Answer, Answer]:
    """A cold and a later answer (token ids, as the probe asks for them) that share their first token and part at
    the second."""
    def ids(top: list[tuple[int, float]]) -> list[tuple[str, float]]:
        return [(f"token_id:{t}", lp) for t, lp in top]

    cold = Answer(text="Paris is", tokens=["token_id:1", f"token_id:{cold_top[0][0]}"], logprobs=[-0.1, cold_top[0][1]],
                  top=[[("token_id:1", -0.1)], ids(cold_top)], cached_tokens=0, seconds=0.1)
    later = Answer(text="Paris was", tokens=["token_id:1", f"token_id:{later_top[0][0]}"],
                   logprobs=[-0.1, later_top[0][1]], top=[[("token_id:1", -0.1)], ids(later_top)], cached_tokens=384,
                   seconds=0.1)
    return cold, later


def _prompt_with(cold: Answer, later: Answer, tokens: int = 437, **judged: object) -> "object":
    from cookbook.checks.prefix_cache import PromptReport, combine

    comparisons = [compare(cold, later, **judged)]  # type: ignore[arg-type]
    return PromptReport(
        target_tokens=tokens, prompt_tokens=tokens, salt="s", cached_tokens=[0, later.cached_tokens],
        seconds=[0.1, 0.1], metric_deltas=[0.0, float(later.cached_tokens or 0)], hit_request=2,
        comparisons=comparisons, comparison=combine(comparisons), texts=[cold.text, later.text],
    )


def test_a_flip_on_a_near_tie_is_reported_as_a_tie_with_its_margin() -> None:
    from cookbook.checks.prefix_cache import _judge

    cold, later = _flipped([(IS, -0.70), (WAS, -0.72)], [(WAS, -0.69), (IS, -0.71)])
    flip = compare(cold, later).departure
    assert flip is not None and flip.position == 1 and (flip.baseline_token, flip.run_token) == (IS, WAS)
    assert flip.baseline_margin == pytest.approx(0.02) and flip.run_margin == pytest.approx(0.02)
    report = _prompt_with(cold, later)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    assert report.problems == []  # type: ignore[attr-defined]
    [tie] = report.ties  # type: ignore[attr-defined]
    assert ": tie, " in tie and "the cold run's margin 0.02" in tie and "no reference" in tie
    full = PrefixCacheReport(layout=CPU, logprobs_expected="close", max_logprob_diff_allowed=0.15, prompts=[report])
    assert full.passed and "1 departure on a near-tie" in result_text(full)
    # A recipe that expects bit-identical logprobs still fails it: the flip is reported as a tie, the bits differ.
    strict = _prompt_with(cold, later, strict=True)
    _judge(strict, "bit-identical", 0.0)  # type: ignore[arg-type]
    assert any("not bit-identical" in p for p in strict.problems)  # type: ignore[attr-defined]


def test_a_flip_to_a_token_the_cold_run_ranked_clearly_lower_fails() -> None:
    from cookbook.checks.prefix_cache import _judge

    cold, later = _flipped([(IS, -0.05), (WAS, -3.2)], [(WAS, -0.4), (IS, -1.3)])
    report = _prompt_with(cold, later)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    [problem] = report.problems  # type: ignore[attr-defined]
    assert "answered 'Paris was', the cold run 'Paris is'" in problem
    assert "the cold run's margin 3.15" in problem and ": fail, " in problem
    outside, wrong = _flipped([(IS, -0.05), (A, -2.0)], [(WAS, -0.4), (IS, -1.3)])
    flip = compare(outside, wrong).departure
    assert flip is not None and flip.baseline_margin is None and flip.verdict == "fail"
    report = _prompt_with(outside, wrong)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    assert "token 9 is not in the cold run's top 2" in report.problems[0]  # type: ignore[attr-defined]


class _Reference:
    """The reference at the flip (prompt [100, 101] + the shared token 1: position 3 of the scored ids)."""

    source = "computed here (test)"

    def __init__(self, at_flip: RefPosition) -> None:
        self.at_flip = at_flip

    def can_score(self, prompt_ids: list[int]) -> bool:
        return True

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        positions: list[RefPosition | None] = [None, None, RefPosition(1, -0.1, {1: -0.1}), self.at_flip]
        return RefScore(self.source, positions[: len(prompt_ids)], [RefPosition(0, -0.1, {0: -0.1})])


def _referee(at_flip: RefPosition) -> Referee:
    referee = Referee(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    referee._looked, referee._reference = True, _Reference(at_flip)  # type: ignore[assignment]
    return referee


def test_with_a_reference_the_reference_judges_the_flip() -> None:
    """The cold run alone would call this flip clearly lower; the reference (fp32) puts the tokens 0.1 apart."""
    from cookbook.checks.prefix_cache import _judge

    cold, later = _flipped([(IS, -0.05), (WAS, -3.2)], [(WAS, -0.4), (IS, -1.3)])
    near = _referee(RefPosition(IS, -0.6, {IS: -0.6, WAS: -0.7}))
    report = _prompt_with(cold, later, prompt=[100, 101], referee=near)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    assert report.problems == []  # type: ignore[attr-defined]
    [tie] = report.ties  # type: ignore[attr-defined]
    assert "computed here (test)" in tie and "reference margin 0.1" in tie and "the cold run's margin 3.15" in tie
    far = _referee(RefPosition(IS, -0.1, {IS: -0.1, WAS: -4.0}))
    report = _prompt_with(cold, later, prompt=[100, 101], referee=far)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    assert "this run lost the right token" in report.problems[0] and "computed here (test)" in report.problems[0]  # type: ignore[attr-defined]


def test_without_a_reference_the_verdict_says_so_and_why() -> None:
    from cookbook.checks.prefix_cache import _judge

    cold, later = _flipped([(IS, -0.70), (WAS, -0.72)], [(WAS, -0.69), (IS, -0.71)])
    referee = Referee(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    referee._looked, referee.why_none = True, "no reference recorded for this image"
    report = _prompt_with(cold, later, prompt=[100, 101], referee=referee)
    _judge(report, "close", 0.15)  # type: ignore[arg-type]
    assert "no reference (no reference recorded for this image)" in report.ties[0]  # type: ignore[attr-defined]


def test_a_new_salt_that_hits_names_the_server_ignoring_it() -> None:
    report = _report(CPU, "close", 0.15, [(1500, [0, 1408], 0.0, "4829173")])
    prompt = report.prompts[0]
    prompt.new_salt_checked, prompt.new_salt_cached = True, 0
    assert result_text(report).endswith("the same prompt under a new `cache_salt` ran cold after every hit")
    prompt.new_salt_cached = 1408
    prompt.problems.append("server ignores cache_salt: the same prompt under a new cache_salt ... 1408 cached tokens")
    assert not report.passed
    assert result_text(report).endswith(
        "cached tokens a multiple of 128 on every hit; server ignores cache_salt: a new salt hit on 1 of 1 prompts"
    )


def test_default_prompt_lengths_come_from_context_block_and_windows() -> None:
    from cookbook.checks.prefix_cache import default_prompt_tokens

    smol = default_prompt_tokens(8192, 48, 128, shortest=113)
    assert smol[0] == 120 and smol[-1] <= 8192 - 48 and len(smol) <= 9
    assert all(n % 128 for n in smol) and smol == sorted(set(smol))
    assert smol[1] < 3 * 128  # one just past the second block boundary
    gemma = default_prompt_tokens(4096, 32, 128, shortest=113, windows=[512])
    assert any(512 < n < 1024 for n in gemma) and any(n > 1024 for n in gemma)  # past the window and twice it
    hybrid = default_prompt_tokens(4096, 32, 256, shortest=113)
    assert hybrid[0] < 256 and all(n % 256 for n in hybrid)
    assert default_prompt_tokens(100, 32, 16, shortest=113) == []  # no room for a needle's frame
    seed_like = default_prompt_tokens(262144, 256, 384, shortest=120)
    assert seed_like[0] < 384 and seed_like[-1] <= 262144 - 256 and len(seed_like) <= 9


def test_sliding_windows_are_read_from_the_config_as_transformers_writes_them() -> None:
    from cookbook.haystack import _windows_from_config

    gemma = {"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}
    assert _windows_from_config(gemma) == ([512], ["sliding_attention", "full_attention"])
    assert _windows_from_config({"sliding_window": 4096})[0] == [4096]  # Mistral: every layer
    assert _windows_from_config({"sliding_window": 4096, "use_sliding_window": False})[0] == []  # Qwen2
    assert _windows_from_config({"sliding_window": None})[0] == []  # Llama
    assert _windows_from_config({"sliding_window": 1024, "layer_types": ["full_attention"]})[0] == []
    assert _windows_from_config({"text_config": gemma})[0] == [512]  # multimodal wrappers


# -- integration ---------------------------------------------------------------------------------------------------


def _hits_or_zero(endpoint: Endpoint) -> float:
    value = read_hits(endpoint)
    assert value is not None, "the server's /metrics has no vllm:prefix_cache_hits_total"
    return value


@pytest.mark.integration
def test_prefix_cache_check_on_smollm2(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    lengths = [120, 700, 2000]
    before = _hits_or_zero(cpu_server)
    started = time.monotonic()
    results = run_checks(
        CheckContext(cpu_server, cpu_recipe, params={"prefix_cache_prompt_tokens": lengths}), ["prefix-cache"]
    )
    [result] = results.checks
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    prompts = result.details["prompts"]
    assert [p["prompt_tokens"] for p in prompts] == lengths
    for prompt in prompts:
        cold, hit = prompt["cached_tokens"]
        assert not cold
        assert prompt["comparison"]["text_identical"]
        assert prompt["comparison"]["max_logprob_diff"] <= cpu_recipe.verification.prefix_cache.max_logprob_diff
        if prompt["prompt_tokens"] <= 128:
            assert not hit
        else:
            assert hit and hit % 128 == 0 and hit == (prompt["prompt_tokens"] - 1) // 128 * 128
            assert prompt["metric_deltas"][1] >= hit  # other engineers' traffic may add to it, never take away
    cached = sum(p["cached_tokens"][1] or 0 for p in prompts)
    assert _hits_or_zero(cpu_server) - before >= cached
    assert "cached tokens a multiple of 128 on every hit" in result.result
    assert result.label.startswith("Prefix-cache hit vs cold (`cache_salt`), greedy, 3 prompts of 120 to 2K tokens")
    print(f"\nSmolLM2 prefix cache: {result.result} ({time.monotonic() - started:.1f} s)")


@pytest.mark.integration
def test_prefix_cache_check_on_the_hybrid(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    lengths = [200, 395, 2467]
    started = time.monotonic()
    results = run_checks(
        CheckContext(hybrid_server, hybrid_recipe, params={"prefix_cache_prompt_tokens": lengths}), ["prefix-cache"]
    )
    [result] = results.checks
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    prompts = {p["prompt_tokens"]: p for p in result.details["prompts"]}
    # 'align' mode: the first two identical requests miss, the third hits with every full block before the last token.
    assert prompts[200]["cached_tokens"] == [0, 0, 0]
    assert prompts[395]["cached_tokens"] == [0, 0, 256]
    assert prompts[2467]["cached_tokens"] == [0, 0, 2304]
    assert all(p["comparison"]["bit_identical"] for p in prompts.values())
    assert result.result.startswith("identical text and bit-identical logprobs 3/3; cached tokens a multiple of 256")
    assert "third identical request" in result.label
    print(f"\nHybrid prefix cache: {result.result} ({time.monotonic() - started:.1f} s)")


@pytest.mark.integration
def test_the_server_layout_matches_the_recipes(
    cpu_server: Endpoint, cpu_recipe: Recipe, hybrid_server: Endpoint, hybrid_recipe: Recipe
) -> None:
    from cookbook.checks.prefix_cache import layout_from_server

    for endpoint, recipe in ((cpu_server, cpu_recipe), (hybrid_server, hybrid_recipe)):
        config = server_cache_config(endpoint)
        assert config is not None
        seen = layout_from_server(config)
        assert (seen.enabled, seen.block_size, seen.hits_from_request) == (
            recipe.prefix_caching.enabled, recipe.prefix_caching.block_size, recipe.prefix_caching.hits_from_request,
        )


@pytest.mark.integration
def test_a_server_that_caches_fails_a_recipe_with_caching_off(cpu_server: Endpoint) -> None:
    """The Qwen-AgentWorld expectation (nothing ever cached) against a server that does cache."""
    report, evidence = probe_prefix_cache(cpu_server, [700], OFF, tolerances(None), max_tokens=16)
    assert not report.passed
    assert "with prefix caching off" in evidence[0].note
    assert "cached tokens reported on 1 of 1 prompts with prefix caching off" in result_text(report)


# -- through the fault proxy: each fault of this class must make the probe fail -------------------------------------


def _through_proxy(server: Endpoint, recipe: Recipe, fault: object, lengths: list[int]) -> CheckResult:
    from cookbook.faultproxy import FaultProxy

    with FaultProxy(server.base_url, fault) as proxy:  # type: ignore[arg-type]
        ctx = CheckContext(Endpoint(proxy.base_url, server.model), recipe, params={"prefix_cache_prompt_tokens": lengths})
        [result] = run_checks(ctx, ["prefix-cache"]).checks
    return result


def _assert_caught(result: CheckResult, symptom: str) -> None:
    import re

    assert result.status == "fail", result.result
    seen = " ".join([result.result, *(e.note for e in result.evidence)])
    assert re.search(symptom, seen), seen


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault_name", ["hit-different-text", "hit-shifted-logprobs", "cached-off-block", "cached-on-cold", "ignore-cache-salt"]
)
def test_faults_make_the_probe_fail_on_smollm2(cpu_server: Endpoint, cpu_recipe: Recipe, fault_name: str) -> None:
    from cookbook.faults_longctx import LONG_CONTEXT_FAULTS

    fault = LONG_CONTEXT_FAULTS[fault_name].fresh()
    result = _through_proxy(cpu_server, cpu_recipe, fault, [700])
    _assert_caught(result, fault.symptom)
    if fault_name == "hit-different-text":  # a wrong-state hit: both runs' top-k at the first differing token
        [prompt] = result.details["prompts"]
        flip = prompt["comparisons"][0]["departure"]
        assert flip["baseline_top"] and flip["run_top"] and flip["verdict"] == "fail", flip
        assert "first differing token" in result.evidence[0].note
        assert result.evidence[0].response["first_departure"][0]["baseline_top"] == flip["baseline_top"]
    if fault_name == "ignore-cache-salt":
        [prompt] = result.details["prompts"]
        assert prompt["new_salt_checked"] and prompt["new_salt_cached"] == prompt["cached_tokens"][1] > 0
        assert "server ignores cache_salt" in result.result


@pytest.mark.integration
def test_a_tiny_logprob_drift_fails_a_bit_identical_recipe(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    """1e-4 is far inside SmolLM2's 0.15 tolerance; the hybrid recipe expects bit-identical logprobs, so it fails."""
    from cookbook.faults_longctx import CachedOffBlock, HitShiftedLogprobs

    drift = _through_proxy(hybrid_server, hybrid_recipe, HitShiftedLogprobs(delta=1e-4), [395])
    _assert_caught(drift, r"not bit-identical")
    assert drift.result.startswith("identical text 1/1, bit-identical logprobs 0/1")
    _assert_caught(_through_proxy(hybrid_server, hybrid_recipe, CachedOffBlock(), [395]), r"not a multiple of the 256")


@pytest.mark.integration
def test_the_proxy_without_a_fault_passes(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """The control: the same path through the proxy with no fault passes, so the failures above are the faults'."""
    from cookbook.faultproxy import Fault

    result = _through_proxy(cpu_server, cpu_recipe, Fault(), [700])
    assert result.status == "pass", result.result


def test_a_new_salt_is_proven_on_the_two_shortest_prompts_that_hit() -> None:
    """A second cold prefill repeats the first's work; a server that ignores the salt does so on any prompt that can
    hit, so the two shortest that can prove it cheaply (every prompt with the parameter new_salt_on=every)."""
    from cookbook.checks.prefix_cache._probe import salt_prompts

    lengths = [120, 300, 700, 1500, 2500, 7000]
    assert salt_prompts(lengths, CPU) == {300, 700}  # 120 is shorter than one block: it never hits
    assert salt_prompts(lengths, CPU, "every") == {300, 700, 1500, 2500, 7000}
    assert salt_prompts([700], CPU) == {700} and salt_prompts(lengths, OFF) == set()
    report = _report(CPU, "close", 0.15, [(n, [0, (n - 1) // 128 * 128], 0.0, "4829173") for n in (300, 700, 1500)])
    for prompt in report.prompts:
        prompt.new_salt_checked, prompt.new_salt_cached = prompt.target_tokens in (300, 1500), 0
    assert result_text(report).endswith(
        "the same prompt under a new `cache_salt` ran cold after the hits of 2 of the 3 prompts that hit")
