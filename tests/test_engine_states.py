"""The engine-states probes: same-step shared prefixes, preemption and resumption, chunked prefill with long
prompt_logprobs, batch composition. Unit tests need no server; integration tests use the session's SmolLM2 server
and ONE extra server of this module: the recipe's `engine-states` launch profile (a 17-block KV pool and 640-token
prefill chunks), where the engine really preempts and chunks. Every probe also fails under a fault of its class."""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cookbook.checks import CHECKS, CheckContext, run_checks
from cookbook.checks.engine_states import (
    GROUP,
    EngineLayout,
    chunk_boundaries,
    plan_preemption,
    prompt_shape_problems,
)
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError, RecipeError
from cookbook.faultproxy import Exchange, FaultProxy
from cookbook.faults_states import CorruptInFlight, RepeatTail, ShiftPromptLogprobs
from cookbook.launch import launch_flags
from cookbook.recipes import Recipe, load_recipe
from cookbook.results import RunResults

from servers import Registry, registry_server, uses_server

NAMES = ["same-step-prefix", "preemption", "chunked-prompt-logprobs", "batch-composition"]
SMALL_BATCH = {"batch_sizes": [2, 4], "batch_max_tokens": 16}


# -- unit ----------------------------------------------------------------------------------------------------------


def test_the_group_is_registered_in_order() -> None:
    assert [name for name, spec in CHECKS.items() if spec.group == GROUP] == NAMES
    assert list(CHECKS)[-1] == "server-health"  # the group sits before the final health check


def _layout(pool: int, block: int = 128, context: int = 8192, seqs: int = 8, chunk: int | None = 2048) -> EngineLayout:
    return EngineLayout(block_size=block, kv_pool_tokens=pool, prefix_caching=True, max_model_len=context,
                        max_num_seqs=seqs, max_num_batched_tokens=chunk)


def test_preemption_is_planned_only_when_the_pool_is_smaller_than_the_load() -> None:
    big = plan_preemption(_layout(93_184))
    assert isinstance(big, str) and "93,184 tokens" in big and "--launch-profile engine-states" in big
    plan = plan_preemption(_layout(2176, context=2048))
    assert not isinstance(plan, str)
    assert plan.prompt_tokens % 128 == 120 and plan.offered_blocks >= 1.2 * plan.pool_blocks
    assert plan.prompt_tokens + plan.max_tokens <= 2048


def test_prompt_logprobs_shape_catches_a_shift_past_a_boundary() -> None:
    prompt = [10, 11, 12, 13, 14, 15]
    entries: list[dict[int, float] | None] = [None] + [{t: -1.0, 99: -2.0} for t in prompt[1:]]
    assert prompt_shape_problems(prompt, entries) == []
    shifted = entries[:3] + entries[4:] + entries[-1:]
    assert any("do not hold their own prompt token, first at position 3" in p for p in prompt_shape_problems(prompt, shifted))
    assert prompt_shape_problems(prompt, None) == ["the response has no prompt_logprobs"]
    assert prompt_shape_problems(prompt, entries[:-1])[0].startswith("prompt_logprobs has 5 entries")
    nan = list(entries)
    nan[2] = {12: math.nan}
    assert any("not finite" in p for p in prompt_shape_problems(prompt, nan))
    assert chunk_boundaries(2047, 640) == [640, 1280, 1920]


def _exchange(body: dict[str, Any], in_flight: int, path: str = "/v1/completions") -> Exchange:
    return Exchange(1, "POST", path, body, lambda: in_flight, status=200)


def _response(ids: list[int]) -> dict[str, Any]:
    return {"choices": [{"text": "some text here", "logprobs": {
        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.1] * len(ids), "top_logprobs": []}}]}


def test_the_faults_change_traffic_only_in_their_state() -> None:
    ids = [1, 2, 3, 4, 5, 6]
    alone = CorruptInFlight().response(_exchange({}, 1), _response(ids))
    assert alone == _response(ids)
    busy = CorruptInFlight().response(_exchange({}, 2), _response(ids))
    assert busy["choices"][0]["logprobs"]["tokens"][:3] == ["token_id:1", "token_id:2", "token_id:3"]
    assert busy["choices"][0]["logprobs"]["tokens"][3:] == ["token_id:5", "token_id:6", "token_id:7"]
    repeated = RepeatTail().response(_exchange({}, 3), _response(ids))
    assert repeated["choices"][0]["logprobs"]["tokens"][3:] == ["token_id:1", "token_id:2", "token_id:3"]
    entries = [None, {"5": {"logprob": -1.0}}, {"6": {"logprob": -1.0}}, {"7": {"logprob": -1.0}}]
    shifted = ShiftPromptLogprobs(boundary=2).response(_exchange({}, 1), {"choices": [{"prompt_logprobs": list(entries)}]})
    assert shifted["choices"][0]["prompt_logprobs"] == [entries[0], entries[1], entries[3], entries[3]]


def test_launch_flags_from_a_profile_and_overrides(cpu_recipe: Recipe) -> None:
    flags = launch_flags(cpu_recipe, "engine-states", ["max-num-batched-tokens=512", "--enforce-eager=false"])
    assert flags == {"num-gpu-blocks-override": 17, "max-model-len": 2048, "max-num-batched-tokens": 512,
                     "enforce-eager": False}
    with pytest.raises(RecipeError, match="no launch profile 'nope' \\(known: engine-states\\)"):
        launch_flags(cpu_recipe, "nope")
    for bad in ("foo", "=3", "port=9", "Bad Flag=1"):
        with pytest.raises(RecipeError, match="--launch-override"):
            launch_flags(cpu_recipe, None, [bad])


def test_the_group_does_not_apply_where_prefix_caching_is_off() -> None:
    recipe = load_recipe("Qwen/Qwen-AgentWorld-35B-A3B")
    assert not recipe.prefix_caching.enabled
    ctx = CheckContext(Endpoint("http://127.0.0.1:9", recipe.served_model_name), recipe)
    assert "prefix caching is off" in (CHECKS["same-step-prefix"].applies(ctx) or "")


# -- integration: the session's server ------------------------------------------------------------------------------


def _run(endpoint: Endpoint, recipe: Recipe, names: list[str], **params: Any) -> RunResults:
    ctx = CheckContext(endpoint, recipe, params=params, request_timeout_s=180)
    return run_checks(ctx, names)


def _check(results: RunResults, name: str) -> Any:
    found = results.check(name)
    assert found is not None
    return found


@pytest.mark.integration
def test_same_step_prefixes_on_the_session_server(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _check(_run(cpu_server, cpu_recipe, ["same-step-prefix"]), "same-step-prefix")
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    details = result.details
    assert details["reached"] and details["queued_margin_s"] > 0
    cached = {r["role"]: [] for r in details["requests"]}
    for r in details["requests"]:
        cached[r["role"]].append(r["cached_tokens"])
    assert cached["writer"] == [0] and cached["cold"] == [0]
    assert cached["hit"] == [details["prefix_tokens"]] * 2  # every full block of the prefix, written in that step


@pytest.mark.integration
def test_batch_composition_on_the_session_server(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _check(_run(cpu_server, cpu_recipe, ["batch-composition"], **SMALL_BATCH), "batch-composition")
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    assert [r["size"] for r in result.details["rounds"]] == [2, 4]
    assert all(r["overlapped"] for r in result.details["rounds"])


@pytest.mark.integration
def test_a_server_that_cannot_preempt_is_inconclusive_with_why(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _check(_run(cpu_server, cpu_recipe, ["preemption"]), "preemption")
    assert result.status == "inconclusive"
    assert re.search(r"KV pool \([\d,]+ tokens.*cannot|no load it accepts can make it preempt", result.result)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["same-step-prefix", "batch-composition"])
def test_corrupting_requests_in_flight_fails_the_probe(cpu_server: Endpoint, cpu_recipe: Recipe, name: str) -> None:
    with FaultProxy(cpu_server.base_url, CorruptInFlight(), timeout_s=900) as proxy:  # a loaded machine is slow
        result = _check(_run(Endpoint(proxy.base_url, cpu_server.model), cpu_recipe, [name], **SMALL_BATCH), name)
    assert result.status == "fail", result.result
    assert any(re.search(CorruptInFlight.symptom, e.note) for e in result.evidence)


@pytest.mark.integration
def test_verify_launch_starts_with_the_overrides_and_stops(
    cpu_server: Endpoint, cpu_recipe: Recipe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CLI's --launch wiring (profile + override into the server's flags and the checks' parameters, stopped
    after), with the launcher pointed at the session's server: starting a third server here would not earn its place
    (the module's small-pool server is started by the library the same way)."""
    from cookbook.cli import verify
    from cookbook.launch import Ready
    from cookbook.results import read_results

    seen: dict[str, Any] = {}

    class Launched:
        def __init__(self, recipe: Recipe, port: int, extra_flags: dict[str, Any], say: Any, progress: Any = None) -> None:
            seen["flags"] = extra_flags

        def start(self) -> Ready:
            return Ready(cpu_server.base_url, cpu_server.model, None, tmp_path / "server.log", 0.0)

        def stop(self) -> None:
            seen["stopped"] = True

    monkeypatch.setattr(verify, "Server", Launched)
    out = tmp_path / "results.json"
    parser = argparse.ArgumentParser()
    verify.add_parser(parser.add_subparsers())
    args = parser.parse_args([
        "verify", "--launch", "--recipe", cpu_recipe.id, "--checks", "chunked-prompt-logprobs", "--json", str(out),
        "--timeout", "120", "--param", "chunked_prompt_tokens=700", "--launch-profile", "engine-states",
        "--launch-override", "max-num-batched-tokens=512",
    ])
    assert verify.run(args) == 0
    assert seen == {"flags": {"num-gpu-blocks-override": 17, "max-model-len": 2048, "max-num-batched-tokens": 512},
                    "stopped": True}
    chunked = read_results(out).check("chunked-prompt-logprobs")
    assert chunked is not None and chunked.status == "pass", chunked and chunked.result
    assert chunked.details["chunk_tokens"] == 512 and chunked.details["boundaries"] == [512]
    with pytest.raises(CookbookError, match="--launch: needs RECIPE"):
        verify.run(argparse.Namespace(**{**vars(args), "recipe": None}))



def test_the_writer_of_a_salt_is_the_request_the_engine_took_first() -> None:
    from cookbook.checks.engine_states import roles_as_scheduled as _roles_as_scheduled

    sent = ["writer", "hit", "cold", "hit"]
    groups = [0, 0, 1, 0]
    assert _roles_as_scheduled(sent, groups, [0, 512, 0, 512]) == sent
    # the API server handed request 2 to the engine first: it wrote, request 1 read what it wrote in that step
    assert _roles_as_scheduled(sent, groups, [512, 0, 0, 512]) == ["hit", "writer", "cold", "hit"]
    # every request of the salt read cached blocks: nobody of that salt wrote them, so the writer stays accused
    assert _roles_as_scheduled(sent, groups, [512, 512, 0, 512]) == sent
    # none read anything (the engine did not share within the step): roles as sent, the probe says so
    assert _roles_as_scheduled(sent, groups, [0, 0, 0, 0]) == sent

# -- integration: one extra server with a small KV pool and small prefill chunks -----------------------------------


@pytest.fixture(scope="module")
@uses_server("small-pool")
def small_pool(servers: Registry, cpu_recipe: Recipe) -> Iterator[tuple[Endpoint, dict[str, Any]]]:
    """The registry's "small-pool" server (tests/servers.py): the recipe's `engine-states` launch profile."""
    for running in registry_server(servers, "small-pool"):
        yield running.endpoint, launch_flags(cpu_recipe, "engine-states")


@pytest.mark.integration
def test_the_small_pool_preempts_and_chunks_and_every_output_equals_its_solo_run(
    small_pool: tuple[Endpoint, dict[str, Any]], cpu_server: Endpoint, cpu_recipe: Recipe
) -> None:
    endpoint, flags = small_pool
    results = _run(endpoint, cpu_recipe, ["preemption", "chunked-prompt-logprobs"], launch_overrides=flags,
                   chunk_reference_url=cpu_server.base_url)
    preempt = _check(results, "preemption")
    assert preempt.status == "pass", (preempt.result, [e.note for e in preempt.evidence])
    assert preempt.details["preemptions_delta"] >= 1 and preempt.details["healthy_after"]
    chunked = _check(results, "chunked-prompt-logprobs")
    assert chunked.status == "pass", (chunked.result, [e.note for e in chunked.evidence])
    assert chunked.details["boundaries"] == [640, 1280, 1920]
    assert chunked.details["reference"]["max_diff"] is not None  # compared with the session server's 2,048 chunks
    assert chunked.details["memory"]["peak_mib"] > 100 and chunked.details["memory"]["source"].startswith("process tree")


@pytest.mark.integration
@pytest.mark.parametrize("fault,name", [
    (RepeatTail(), "preemption"),
    (ShiftPromptLogprobs(boundary=640), "chunked-prompt-logprobs"),
], ids=["repeat-tail", "shift-prompt-logprobs"])
def test_faults_fail_the_small_pool_probes(
    small_pool: tuple[Endpoint, dict[str, Any]], cpu_recipe: Recipe, fault: Any, name: str
) -> None:
    endpoint, flags = small_pool
    with FaultProxy(endpoint.base_url, fault.fresh(), timeout_s=900) as proxy:
        result = _check(_run(Endpoint(proxy.base_url, endpoint.model), cpu_recipe, [name], launch_overrides=flags), name)
    assert result.status == "fail", result.result
    assert any(re.search(fault.symptom, e.note) for e in result.evidence), [e.note for e in result.evidence]
