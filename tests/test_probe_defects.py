"""A real defect for the long-context probes, served for real (a legal but wrong setting), not a proxy fault:
SmolLM2-135M served with a context twice its positions (`--max-model-len 16384` with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1;
its config.json says 8,192). vLLM accepts it and answers fluently; a needle read from past position 8,192 is lost.
One server for this module (COOKBOOK_TEST_LONGCTX_URL attaches to a running one while developing); the clean server
(the session's SmolLM2) passes the same probe.

(The numerics oracle's tests, tests/test_reference_integration.py, serve a RoPE base, a sliding window and an fp8 KV
cache wrongly; this one is the probes' own.)"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from cookbook.checks import CheckContext, run_checks
from cookbook.endpoint import Endpoint
from cookbook.recipes import Recipe

from servers import Registry, registry_server, uses_server


@pytest.fixture(scope="module")
@uses_server("too-long")
def too_long_server(servers: Registry) -> Iterator[Endpoint]:
    # The registry's "too-long" server (tests/servers.py): VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, --max-model-len 16384.
    # COOKBOOK_TEST_LONGCTX_URL: development only, a server already started with these settings.
    for running in registry_server(servers, "too-long"):
        yield running.endpoint


def _needles(endpoint: Endpoint, recipe: Recipe, lengths: list[int]) -> object:
    params = {"needle_lengths": lengths, "needle_depths": [0.5]}
    [result] = run_checks(CheckContext(endpoint, recipe, params=params), ["needles"]).checks
    return result


@pytest.mark.integration
def test_needles_fail_past_the_models_positions_and_name_why(too_long_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _needles(too_long_server, cpu_recipe, [7600, 9000])
    assert result.status == "fail", result.result  # type: ignore[attr-defined]
    cells = {c["target_tokens"]: c for c in result.details["cells"]}  # type: ignore[attr-defined]
    assert cells[7600]["found"], cells[7600]  # within the 8,192 positions the same server still finds it
    assert not cells[9000]["found"]
    assert result.result.startswith("1/1 at 7.6K, 0/1 at 9K tokens")  # type: ignore[attr-defined]
    symptom = "the served context 16,384 is longer than the 8,192 positions the model was made for"
    assert symptom in result.result  # type: ignore[attr-defined]
    assert any(symptom in e.note for e in result.evidence)  # type: ignore[attr-defined]
    assert any("expected" in e.note and "9000 tokens" in e.note for e in result.evidence)  # type: ignore[attr-defined]


@pytest.mark.integration
def test_the_clean_server_passes_the_same_probe(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    result = _needles(cpu_server, cpu_recipe, [7600])
    assert result.status == "pass", (result.result, [e.note for e in result.evidence])  # type: ignore[attr-defined]
    assert result.details["layout_contradictions"] == []  # type: ignore[attr-defined]
