"""The probes on a model the project had never seen, with sliding-window layers: cookbook/tiny-gemma3, a recipe
written as a user would (no prompt lengths, no layout hints). One real server for this module (set
COOKBOOK_TEST_SLIDING_URL to attach to a running one while developing)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from cookbook.checks import CheckContext, run_checks
from cookbook.endpoint import Endpoint
from cookbook.haystack import served_model
from cookbook.recipes import Recipe, load_recipe

from servers import Registry, registry_server, uses_server

RECIPE = "cookbook/tiny-gemma3"


def test_the_recipe_gives_the_probes_no_layout_hints() -> None:
    recipe = load_recipe(RECIPE)
    assert recipe.verification.prefix_cache is None and recipe.verification.needles is None
    assert recipe.model.architecture == "Gemma3ForCausalLM"


@pytest.fixture(scope="module")
def sliding_recipe() -> Recipe:
    return load_recipe(RECIPE)


@pytest.fixture(scope="module")
@uses_server("gemma")
def sliding_server(servers: Registry) -> Iterator[Endpoint]:
    for running in registry_server(servers, "gemma"):
        yield running.endpoint


@pytest.mark.integration
def test_layout_facts_come_from_the_server_and_the_served_config(sliding_server: Endpoint) -> None:
    facts = served_model(sliding_server)
    assert facts.max_model_len == 4096 and facts.block_size == 128
    assert facts.sliding_windows == [512]  # from the served config.json, not from the recipe
    assert facts.layer_types.count("sliding_attention") == 4 and facts.dtype == "bfloat16"


@pytest.mark.integration
def test_prefix_cache_derives_its_prompts_and_passes_on_sliding_windows(
    sliding_server: Endpoint, sliding_recipe: Recipe
) -> None:
    [result] = run_checks(CheckContext(sliding_server, sliding_recipe), ["prefix-cache"]).checks
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    details = result.details
    assert "sliding windows 512" in details["defaults"] and "context 4,096" in details["defaults"]
    prompts = {p["prompt_tokens"]: p for p in details["prompts"]}
    lengths = sorted(prompts)
    assert lengths[0] < 128 and lengths[-1] <= 4096 - sliding_recipe.verification.max_tokens
    assert any(512 < n <= 1024 for n in lengths) and any(n > 1024 for n in lengths)  # past the window, and twice
    for tokens, prompt in prompts.items():
        cold, hit = prompt["cached_tokens"]
        assert not cold
        if not prompt["comparison"]["text_identical"]:
            # The random tiny model has exact bf16 ties (three tokens at -9.666 on an AMD EPYC host): a hit may take
            # another of them, and only the fp32 reference can say it is a tie, not a wrong state.
            departed = [c for c in prompt["comparisons"] if not c["text_identical"]]
            assert departed and all(c["departure"]["verdict"] == "tie" for c in departed), prompt
            assert all(c["departure"]["reference_margin"] is not None for c in departed), prompt  # the reference's word
        # Every full block before the last token, the window's included: the sliding-window groups hit too.
        assert hit == (tokens - 1) // 128 * 128
        if prompt["new_salt_checked"]:
            assert prompt["new_salt_cached"] == 0
    # The salt is proven on the two shortest prompts that hit.
    hitting = [n for n in lengths if prompts[n]["cached_tokens"][1]]
    assert [n for n in lengths if prompts[n]["new_salt_checked"]] == hitting[:2]
    # No recipe expectation: 'close' within bf16's tolerance; bit-identity is reported either way.
    assert details["logprobs_expected"] == "close" and details["max_logprob_diff_allowed"] == 0.15
    assert f"a new `cache_salt` ran cold after the hits of 2 of the {len(hitting)} prompts that hit" in result.result


@pytest.mark.integration
def test_the_oracle_passes_against_the_recorded_golden_file(sliding_server: Endpoint, sliding_recipe: Recipe) -> None:
    [result] = run_checks(CheckContext(sliding_server, sliding_recipe), ["oracle"]).checks
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    details = result.details
    assert details["source"].startswith("golden file") and details["tolerances_from"] == "the recipe's bf16 tolerances"
    kinds = {p["kind"] for p in details["prompts"]}
    assert "window" in kinds  # a prompt past twice the 512-token window, from the recorded layout
