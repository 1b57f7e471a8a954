"""The verification suite: the whole of it against the real CPU server, and each check failing under its fault.

The fault matrix runs every named fault of `cookbook.faultproxy.FAULTS` through a proxy in front of the same real
server and asserts that the checks it targets fail with a result or evidence naming the symptom. The whole suite
also runs through a proxy without a fault, so a failure in the matrix is the fault's doing, not the proxy's.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from cookbook.checks import CHECKS, CheckContext, run_checks, selected_checks
from cookbook.checks.basic import KNOWN_ANSWERS, Reply, _grade
from cookbook.checks.registry import RunStart
from cookbook.checks.sampling import judge_with_second_try, prompt_logprobs_problem, seed_probe, unseeded_agreement_chance
from cookbook.checks.tools import assemble_streamed_call, call_problem
from cookbook.errors import CookbookError
from cookbook.endpoint import Endpoint
from cookbook.faultproxy import (
    FAULTS, BrokenToolStream, Chain, Exchange, Fault, FaultProxy, ForceToolChoice, KillAfter, NoToolCall,
)
from cookbook.launch import free_port
from cookbook.recipes import Recipe, load_recipe
from cookbook.results import RunResults

from servers import deadline

REPO = Path(__file__).resolve().parent.parent
CORE = [
    "known-answer", "known-answer-concurrent", "tool-call-auto", "tool-call-streamed", "tool-result", "top-logprobs",
    "prompt-logprobs", "json-schema", "logit-bias", "min-p", "min-tokens", "bad-words", "seed", "sampling-concurrent",
    "server-health",
]
# What the core suite may ask of the server (measured: see test_whole_suite_through_a_proxy_without_fault). Its cost
# in work, not in seconds: what it asks is deterministic, how fast a shared 2-core machine answers is not.
SUITE_MAX_REQUESTS = 56  # 46 measured on 2026-12-01
SUITE_MAX_TOKENS_ASKED = 2600  # 2,088 measured on 2026-12-01


def _ctx(base_url: str, model: str, recipe: Recipe | None) -> CheckContext:
    return CheckContext(Endpoint(base_url, model), recipe)


def _without_limitations(recipe: Recipe) -> Recipe:
    """The recipe with no known limitations, so that a fault's fail stays a fail."""
    verification = recipe.verification.model_copy(update={"known_limitations": {}})
    return recipe.model_copy(update={"verification": verification})


def _said(results: RunResults, name: str) -> str:
    check = results.check(name)
    assert check is not None
    return " | ".join([check.result, *(e.note for e in check.evidence)])


# ---------------------------------------------------------------------------------------------------------------
# Without a server


def test_core_checks_in_table_order_with_server_health_last() -> None:
    core = [s.name for s in selected_checks(["core"], None)]
    assert core == CORE
    assert list(CHECKS)[-1] == "server-health"


def test_default_selection_is_every_registered_group() -> None:
    """Issue 11: `cookbook verify --recipe X` runs every check that applies by default, not only the core group;
    whether one applies is decided per check when it runs (skipped with why), not by leaving it out."""
    from cookbook.checks.registry import check_groups

    assert {"core", "long-context"} <= set(check_groups())
    for recipe in (None, load_recipe("Qwen/Qwen3-Coder-Next"), load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")):
        assert [s.name for s in selected_checks(None, recipe)] == list(CHECKS)
    assert {"prefix-cache", "needles"} <= {s.name for s in selected_checks(None, load_recipe("Qwen/Qwen3-Coder-Next"))}
    # --checks core stays the quick path; a group and a check name may be mixed.
    assert "needles" not in [s.name for s in selected_checks(["core"], None)]
    mixed = [s.name for s in selected_checks(["long-context", "seed"], None)]
    assert mixed == [n for n in CHECKS if n == "seed" or CHECKS[n].group == "long-context"]
    assert {"seed", "prefix-cache", "needles"} <= set(mixed)
    with pytest.raises(CookbookError, match="--checks: unknown check 'no-such'"):
        selected_checks(["no-such"], None)


def test_every_v0_26_0_fix_names_an_existing_check() -> None:
    for path in sorted((REPO / "fixes" / "v0.26.0").glob("*/fix.json")):
        named = json.loads(path.read_text()).get("check")
        assert named in CHECKS, f"{path}: check {named!r} is not a registered check or probe"


def test_every_core_check_has_a_fault_that_targets_it() -> None:
    targeted = {name for f in FAULTS.values() for name in f.catches}
    assert set(CORE) <= targeted, f"no fault targets {sorted(set(CORE) - targeted)}"
    for fault in FAULTS.values():
        assert fault.symptom and re.compile(fault.symptom)


def test_concurrency_label_follows_the_recipe(cpu_recipe: Recipe) -> None:
    ctx = _ctx("http://127.0.0.1:9", "m", cpu_recipe)
    assert CHECKS["known-answer-concurrent"].label_for(ctx) == f"The same prompts, {cpu_recipe.max_num_seqs} in flight"


def _spy_on_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the checks whose function was called, in order (each still runs as registered)."""
    ran: list[str] = []

    def spied(spec: Any) -> Any:
        def fn(ctx: CheckContext) -> Any:
            ran.append(spec.name)
            return spec.fn(ctx)
        return dataclasses.replace(spec, fn=fn)

    for name, spec in list(CHECKS.items()):
        monkeypatch.setitem(CHECKS, name, spied(spec))
    return ran


def test_dead_server_gives_a_full_table_of_not_run_without_trying_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick by construction: one /health probe (refused at once) decides it, and no check sends a request or waits
    on a timeout."""
    ran = _spy_on_checks(monkeypatch)
    probes: list[float] = []
    healthy = Endpoint.healthy

    def probe(self: Endpoint, timeout_s: float = 5.0) -> bool:
        probes.append(timeout_s)
        return healthy(self, timeout_s)

    monkeypatch.setattr(Endpoint, "healthy", probe)
    results = run_checks(_ctx(f"http://127.0.0.1:{free_port()}", "m", None))
    assert [c.status for c in results.checks] == ["not run"] * len(CHECKS)  # the default is every registered check
    assert all(c.result == "not run: server down" for c in results.checks)
    assert ran == [] and len(probes) == 1


def test_server_health_cannot_pass_without_a_start_time() -> None:
    ctx = _ctx(f"http://127.0.0.1:{free_port()}", "m", None)
    with pytest.raises(CookbookError, match="run_checks"):
        CHECKS["server-health"].fn(ctx)
    ctx.run_start = RunStart(healthy=True)  # a server whose /metrics had no process_start_time_seconds
    ctx.endpoint.healthy = lambda timeout_s=5.0: True  # type: ignore[method-assign]
    ctx.endpoint.process_start_time = lambda: 5.0  # type: ignore[method-assign]
    outcome = CHECKS["server-health"].fn(ctx)
    assert not outcome.passed and "cannot be ruled out" in outcome.result


def _reply(content: str = "", **body: Any) -> Reply:
    return Reply({"messages": []}, {"choices": [{"message": {"content": content}, "finish_reason": "stop"}], **body}, 0.1)


def test_grading_names_the_prompt_a_crossed_answer_fits() -> None:
    items = list(KNOWN_ANSWERS[:2])  # 2 + 2, 12 + 12
    outcome = _grade(items, [_reply("12 + 12 = 24"), _reply("12 + 12 = 24")])
    assert outcome.result == "1/2" and not outcome.passed
    assert "another prompt in flight" in outcome.evidence[0].note and items[1].prompt in outcome.evidence[0].note


@pytest.mark.parametrize(
    "name, arguments, problem",
    [
        ("get_weather", '{"city": "Paris"}', None),
        ("get_weather", '{"city": "Paris, France"}', None),
        ("get_time", '{"city": "Paris"}', "instead of"),
        ("get_weather", '{"city": "Lyon"}', "wrong argument"),
        ("get_weather", '{"city": "Par', "not valid JSON"),
        ("get_weather", '["Paris"]', "not a JSON object"),
    ],
)
def test_tool_call_validation(name: str, arguments: str, problem: str | None) -> None:
    found = call_problem(name, arguments)
    assert found is None if problem is None else problem in (found or "")


def test_streamed_call_assembly() -> None:
    def delta(**call: Any) -> dict[str, Any]:
        return {"choices": [{"delta": {"tool_calls": [{"index": 0, **call}]}}]}

    chunks = [delta(id="c1", function={"name": "get_weather"}), delta(function={"arguments": '{"city"'}),
              {"choices": [{"delta": {"content": ""}}]}, delta(function={"arguments": ': "Paris"}'})]
    call = assemble_streamed_call(chunks)
    assert (call["id"], call["name"], call["arguments"], call["argument_chunks"]) == ("c1", "get_weather", '{"city": "Paris"}', 2)


def test_prompt_logprobs_shape() -> None:
    def entry(actual_rank: int) -> dict[str, Any]:
        ranks = sorted({actual_rank, 1, 2, 3, 4, 5})
        return {str(r): {"logprob": -float(r), "rank": r} for r in ranks}

    good = _reply(prompt_logprobs=[None, entry(1), entry(9)], usage={"prompt_tokens": 3})
    assert prompt_logprobs_problem(good) is None
    assert "for 4 prompt tokens" in str(prompt_logprobs_problem(_reply(prompt_logprobs=[None, entry(1), entry(9)], usage={"prompt_tokens": 4})))
    short = {k: v for k, v in entry(1).items() if k != "5"}
    assert "4 entries" in str(prompt_logprobs_problem(_reply(prompt_logprobs=[None, short], usage={"prompt_tokens": 2})))
    assert "no prompt_logprobs" in str(prompt_logprobs_problem(_reply(usage={"prompt_tokens": 2})))



def _sampled(tokens: str, probs: list[list[float]]) -> Reply:
    content = [{"token": t, "logprob": math.log(p[0]), "top_logprobs": [{"token": "x", "logprob": math.log(q)} for q in p]}
               for t, p in zip(tokens, probs)]
    return _reply(choices=[{"message": {"content": tokens}, "logprobs": {"content": content}, "finish_reason": "length"}])


def test_a_same_seed_pair_may_part_only_after_the_seed_demonstrably_held() -> None:
    """Late: 12 shared tokens at sum p^2 = 0.5 each (chance 2.4e-4) is past what unseeded samples share. Early: a
    pair parting after 3 such tokens (chance 0.125) is what a server ignoring the seed gives, and fails."""
    flat = [[0.5, 0.5]]
    probe = seed_probe(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    late = probe.verify([_sampled("abcdefghijklmn", flat * 14), _sampled("abcdefghijklXY", flat * 14), _sampled("zz", flat * 2)])
    assert late is None and probe.details["parted_at_token"] == 12
    assert "not the seed" in probe.details["note"]
    early = seed_probe(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    problem = early.verify([_sampled("abcdefgh", flat * 8), _sampled("abcXYZWV", flat * 8), _sampled("zz", flat * 2)])
    assert problem is not None and "same seed gave different text from token 3" in problem.note
    assert unseeded_agreement_chance([]) == 1.0
    assert unseeded_agreement_chance([{"top_logprobs": [{"logprob": math.log(0.6)}]}]) == pytest.approx(0.36 + 0.4 * 0.6)


def test_a_seed_pair_that_parts_early_once_gets_one_second_try_and_twice_fails() -> None:
    """A batch-variant engine may part a seeded pair early once in a while: the second try decides. A server that
    ignores the seed parts early on both tries and fails, naming both; a control with no second try fails at once."""
    flat = [[0.5, 0.5]]
    early = [_sampled("abcdefgh", flat * 8), _sampled("abcXYZWV", flat * 8), _sampled("zz", flat * 2)]
    held = [_sampled("abcdefgh", flat * 8), _sampled("abcdefgh", flat * 8), _sampled("zz", flat * 2)]
    sent: list[int] = []

    def send(replies: list[Reply]) -> Callable[[], list[Reply]]:
        return lambda: sent.append(1) or replies

    probe = seed_probe(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    assert judge_with_second_try(probe, early, send(held)) is None and len(sent) == 1
    assert "a first try failed, the same seed gave different text from token 3" in probe.details["note"]
    assert probe.details["second_try"]["passed"] is True
    twice = seed_probe(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    problem = judge_with_second_try(twice, early, send(early))
    assert problem is not None and problem.note.count("from token 3") == 2 and "twice" in problem.note
    assert len(sent) == 2
    assert judge_with_second_try(twice, held, send(early)) is None and len(sent) == 2  # a pass is never re-sent
    once = seed_probe(CheckContext(Endpoint("http://127.0.0.1:9", "m"), None))
    once.second_try = False
    assert judge_with_second_try(once, early, send(held)) is not None and len(sent) == 2


# ---------------------------------------------------------------------------------------------------------------
# The whole suite on the real CPU server


def _assert_clean(results: RunResults, recipe: Recipe) -> None:
    for check in results.checks:
        if check.name in recipe.verification.known_limitations:
            assert check.status in ("pass", "known limitation"), check
            assert "known limitation" in check.result or check.status == "pass"
        else:
            assert check.status == "pass", f"{check.name}: {check.result} {[e.note for e in check.evidence]}"


class _Tally(Fault):
    """No fault: counts what the suite asks of the server (API requests, tokens it may generate)."""

    name = "tally"

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens_asked = 0  # max_tokens (or max_completion_tokens) times n, over every generation request
        self.unbounded: list[str] = []  # generation requests that set no max: the run's cost would be the model's

    def request(self, ex: Exchange) -> None:
        if not ex.is_api:
            return None
        params = ex.params
        generates = ex.path.split("?")[0].endswith(("/chat/completions", "/completions"))
        most = params.get("max_tokens", params.get("max_completion_tokens"))
        with self.lock:
            self.requests += 1
            if generates and not isinstance(most, int):
                self.unbounded.append(ex.path)
            elif generates:
                self.tokens_asked += most * int(params.get("n") or 1)
        return None


@pytest.mark.integration
def test_whole_suite_on_the_cpu_server(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    results = run_checks(_ctx(cpu_server.base_url, cpu_server.model, cpu_recipe), ["core"])
    assert [c.name for c in results.checks] == CORE
    _assert_clean(results, cpu_recipe)
    assert results.check("known-answer").result == "8/8"  # type: ignore[union-attr]
    assert results.check("known-answer-concurrent").result == f"{cpu_recipe.max_num_seqs}/{cpu_recipe.max_num_seqs}"  # type: ignore[union-attr]
    assert results.check("server-health").result == "healthy, no restarts"  # type: ignore[union-attr]
    assert results.kv_pool_tokens and results.kv_pool_tokens > 0
    assert all(c.duration_s > 0 for c in results.checks)
    assert results.stopped == "", results.stopped
    assert not any(c.details.get("ran_out_of_deadline") for c in results.checks)


@pytest.mark.integration
def test_whole_suite_through_a_proxy_without_fault(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """Clean through a proxy that changes nothing, and within its cost: the suite stays quick because of what it
    asks (requests, tokens, every generation bounded), which is counted here rather than timed."""
    tally = _Tally()
    with FaultProxy(cpu_server.base_url, tally) as proxy:
        results = run_checks(_ctx(proxy.base_url, cpu_server.model, cpu_recipe), ["core"])
    _assert_clean(results, cpu_recipe)
    print(f"\ncore suite asked: {tally.requests} API requests, {tally.tokens_asked} tokens")
    assert tally.unbounded == []
    assert 0 < tally.requests <= SUITE_MAX_REQUESTS
    assert 0 < tally.tokens_asked <= SUITE_MAX_TOKENS_ASKED


@pytest.mark.integration
def test_hybrid_suite(hybrid_server: Endpoint, hybrid_recipe: Recipe) -> None:
    results = run_checks(_ctx(hybrid_server.base_url, hybrid_server.model, hybrid_recipe), ["core"])
    for check in results.checks:
        assert check.ok, f"{check.name}: {check.result}"
    ran = {c.name for c in results.checks if c.status == "pass"}
    assert {"top-logprobs", "prompt-logprobs", "logit-bias", "min-p", "seed", "sampling-concurrent", "server-health"} <= ran


# ---------------------------------------------------------------------------------------------------------------
# The fault matrix


@pytest.mark.integration
# no-tool-call: SmolLM2-135M does not call under auto even without it; its proof is the adapter test below.
@pytest.mark.parametrize("name", [n for n, f in FAULTS.items() if f.catches and n != "no-tool-call"])
def test_each_fault_is_caught(name: str, cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    fault = FAULTS[name]
    with FaultProxy(cpu_server.base_url, name) as proxy:
        results = run_checks(_ctx(proxy.base_url, cpu_server.model, cpu_recipe), list(fault.catches))
    for target in fault.catches:
        check = results.check(target)
        # Caught means the check judged the answers and failed them: a check that crashed ("error") catches nothing,
        # even when its exception text happens to match the symptom.
        assert check is not None and check.status == "fail", f"{name}: {target} was {check}"
        assert re.search(fault.symptom, _said(results, target)), f"{name}: {target} said {_said(results, target)!r}"
        assert check.evidence and check.evidence[0].note


@pytest.mark.integration
def test_missing_tool_arguments_are_caught(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    with FaultProxy(cpu_server.base_url, BrokenToolStream("missing")) as proxy:
        results = run_checks(_ctx(proxy.base_url, cpu_server.model, cpu_recipe), ["tool-call-streamed"])
    assert results.checks[0].status == "fail"
    assert "no argument chunks" in _said(results, "tool-call-streamed")


@pytest.mark.integration
def test_tool_call_auto_passes_good_calls_and_catches_a_lost_one(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """SmolLM2-135M almost never calls under auto, so an adapter turns auto into required: the check then sees
    real calls from the real server, and the no-tool-call fault on top must make it fail."""
    recipe = _without_limitations(cpu_recipe)
    with FaultProxy(cpu_server.base_url, ForceToolChoice()) as proxy:
        good = run_checks(_ctx(proxy.base_url, cpu_server.model, recipe), ["tool-call-auto"]).checks[0]
    assert good.status == "pass", good
    assert good.result == "5/5 valid `get_weather` calls with the right argument"
    with FaultProxy(cpu_server.base_url, Chain(ForceToolChoice(), NoToolCall())) as proxy:
        results = run_checks(_ctx(proxy.base_url, cpu_server.model, recipe), ["tool-call-auto"])
    assert results.checks[0].status == "fail"
    assert results.checks[0].result.startswith("0/5")
    assert re.search(NoToolCall.symptom, _said(results, "tool-call-auto"))


@pytest.mark.integration
def test_a_dead_engine_stops_the_run(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    with FaultProxy(cpu_server.base_url, "prompt-logprobs-500") as proxy:
        results = run_checks(_ctx(proxy.base_url, cpu_server.model, cpu_recipe), ["prompt-logprobs", "seed", "server-health"])
    assert [c.status for c in results.checks] == ["fail", "not run", "not run"]


@pytest.mark.integration
def test_server_killed_mid_run(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """Connections refused after the known-answer check: the check that hits it and all later ones are not run,
    and the run ends at once instead of waiting on timeouts."""
    with FaultProxy(cpu_server.base_url, KillAfter(after=8)) as proxy:
        ctx = _ctx(proxy.base_url, cpu_server.model, cpu_recipe)
        # the run's own bound (60 s on a quiet machine, stretched by the server's measured pace): a run that waited
        # on timeouts would end by it, and say so
        ctx.budget_s = deadline(cpu_server, 60.0)
        results = run_checks(ctx, ["core"])
    statuses = [c.status for c in results.checks]
    assert statuses[0] == "pass"
    assert statuses[1:] == ["not run"] * (len(CORE) - 1)
    assert all(c.result == "not run: server down" for c in results.checks[1:])
    # Ended by the refused connection itself: not by the budget, and no request ran out of its deadline.
    assert results.stopped == "server down during known-answer-concurrent", results.stopped
    assert not any(c.details.get("ran_out_of_deadline") for c in results.checks)
    assert proxy.killed


def test_an_inconclusive_check_is_neither_pass_nor_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from cookbook.checks import CheckInconclusive, CheckOutcome, registry

    def cannot_reach(_ctx: CheckContext) -> CheckOutcome:
        raise CheckInconclusive("the KV pool holds the whole offered load, so nothing was preempted")

    def said_why(_ctx: CheckContext) -> CheckOutcome:
        return CheckOutcome(True, "", inconclusive="no second request shared the step")

    monkeypatch.setattr(registry, "snapshot_server", lambda _endpoint: RunStart(healthy=True))
    monkeypatch.setattr(Endpoint, "healthy", lambda _self: True)
    for name, fn in (("t-unreached", cannot_reach), ("t-said-why", said_why)):
        monkeypatch.setitem(CHECKS, name, registry.CheckSpec(name, name, fn, "t-group", registry._always))
    results = run_checks(_ctx("http://127.0.0.1:9", "m", None), ["t-group"])
    unreached, said = results.checks
    assert (unreached.status, said.status) == ("inconclusive", "inconclusive")
    assert unreached.result == "inconclusive: the KV pool holds the whole offered load, so nothing was preempted"
    assert said.result == "inconclusive: no second request shared the step"  # `passed=True` is ignored
    assert unreached.ok and results.all_ok  # never a fail: verify exits 0 ...
    assert "pass" not in results.check_summary()  # ... and never counted as a pass
    assert results.check_summary().endswith("(inconclusive: t-unreached, t-said-why)")


def test_min_tokens_is_inconclusive_when_the_answer_already_runs_past_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose plain answer already runs 32 tokens cannot show min_tokens: inconclusive with why, not a fail."""
    from cookbook.checks import sampling
    from cookbook.checks.registry import CheckInconclusive

    ctx = _ctx(f"http://127.0.0.1:{free_port()}", "m", None)
    probe = sampling.min_tokens_probe(ctx)
    long = _reply("four " * 40, usage={"completion_tokens": 48})
    long.body["choices"][0]["finish_reason"] = "length"
    with pytest.raises(CheckInconclusive, match="already ran 48 tokens"):
        probe.verify([long, long])
    short, held = _reply("4", usage={"completion_tokens": 2}), _reply("4 " * 20, usage={"completion_tokens": 40})
    assert probe.verify([short, held]) is None
    assert "before min_tokens 32" in probe.verify([short, short]).note  # type: ignore[union-attr]

    # In the burst it is said, never a wrong control: the others still count.
    monkeypatch.setattr(sampling, "_concurrent_probes", lambda _ctx: [sampling.min_tokens_probe])
    monkeypatch.setattr(sampling, "chat_all", lambda _ctx, bodies: [long] * len(bodies))
    outcome = sampling.sampling_concurrent(ctx)
    assert outcome.passed and "`min_tokens`, which could not show (inconclusive)" in outcome.result
    assert "inconclusive: without min_tokens the answer already ran 48 tokens" in outcome.evidence[0].note
