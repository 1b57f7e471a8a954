"""Probes that drive the engine into the states behind the v0.26.0 fixes, and compare what comes out with a solo
cold run of the same request (group `engine-states`), one module per probe over the probe kit (`..kit`):

- `same_step` (`same-step-prefix`): requests hitting prefix blocks written in their own scheduler step.
- `preemption`: a load larger than the KV pool; the engine preempts and resumes.
- `chunked` (`chunked-prompt-logprobs`): `prompt_logprobs` over a prompt of several prefill chunks.
- `batch` (`batch-composition`): the same greedy prompts alone and in batches.

Every comparison is token by token on `/v1/completions` with token-id prompts (cookbook.completions), greedy,
`logprobs: 5`, judged by the kit's one rule: where a run parts from its solo run, the model's reference ranks the
two tokens (a near-tie within the dtype's measured noise is a tie; a token the reference clearly prefers, lost, is
a fail); without a reference, both runs' own top-k. A probe that could not bring the engine into its state says
"inconclusive" with why.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from ..registry import CheckContext
from ._common import GROUP, EngineLayout, engine_layout

# The probes register in this order (the Verified table's), whatever order the imports below are sorted in.
PROBE_MODULES = ("same_step", "preemption", "chunked", "batch")
for _name in PROBE_MODULES:
    importlib.import_module(f"{__name__}.{_name}")

from .batch import batch_sizes  # noqa: E402
from .chunked import chunk_boundaries, prompt_shape_problems  # noqa: E402
from .preemption import PreemptionPlan, plan_preemption  # noqa: E402
from .same_step import roles_as_scheduled  # noqa: E402

__all__ = [
    "GROUP",
    "SMALL_POOL_CHECKS",
    "EngineLayout",
    "PreemptionPlan",
    "batch_sizes",
    "chunk_boundaries",
    "comparison_rows",
    "engine_layout",
    "plan_preemption",
    "prompt_shape_problems",
    "roles_as_scheduled",
    "run_engine_states",
]

SMALL_POOL_CHECKS = ("preemption", "chunked-prompt-logprobs")


def _registry() -> dict[str, Any]:
    from ..registry import CHECKS

    return CHECKS


def run_engine_states(
    ctx: CheckContext, launch_profile: str | None = None, names: list[str] | None = None, say: Callable[[str], None] = print
) -> Any:
    """The group against `ctx.endpoint`; with `launch_profile` (a recipe's verification.launch_profiles entry, e.g.
    a small KV pool) the preemption and chunked-prefill probes run on a server of the recipe started with it for
    them, and stopped after: one extra server start, not one per probe. Returns one RunResults in registry order."""
    from ...launch import Server, free_port, launch_flags
    from ..registry import run_checks

    wanted = names or [name for name, spec in _registry().items() if spec.group == GROUP]
    on_small = [n for n in wanted if launch_profile and n in SMALL_POOL_CHECKS]
    results = run_checks(ctx, [n for n in wanted if n not in on_small]) if len(on_small) < len(wanted) else None
    if on_small:
        assert ctx.recipe is not None and launch_profile is not None
        flags = launch_flags(ctx.recipe, launch_profile)
        with Server(ctx.recipe, port=free_port(), extra_flags=flags, say=say) as server:
            small_ctx = CheckContext(server.endpoint, ctx.recipe, ctx.out_dir,
                                     {**ctx.params, "launch_overrides": flags}, ctx.request_timeout_s, ctx.hardware)
            small = run_checks(small_ctx, on_small)
        for result in small.checks:
            result.details["server"] = f"launched with profile {launch_profile}: {flags}"
        if results is None:
            return small
        results.checks.extend(small.checks)
        order = {name: i for i, name in enumerate(wanted)}
        results.checks.sort(key=lambda c: order.get(c.name, len(order)))
    return results


def comparison_rows(results: Any) -> list[dict[str, Any]]:
    """One row per request compared with its solo run, for a table: check, request, identical, max logprob diff,
    and where it left the solo run (first differing token, its verdict, the solo run's and the reference's margins)."""
    rows: list[dict[str, Any]] = []
    for check_result in results.checks:
        if check_result.name not in _registry() or _registry()[check_result.name].group != GROUP:
            continue
        comparisons = list(check_result.details.get("comparisons") or [])
        for round_ in check_result.details.get("rounds") or []:
            comparisons.extend(round_.get("comparisons") or [])
        for c in comparisons:
            departure = c.get("departure") or {}
            rows.append({
                "check": check_result.name,
                "request": c["name"],
                "tokens identical": c["tokens_identical"],
                "max logprob diff": c["max_logprob_diff"],
                "first differing token": departure.get("position"),
                "verdict": departure.get("verdict", "identical" if c["tokens_identical"] else ""),
                "solo margin": departure.get("baseline_margin"),
                "reference margin": departure.get("reference_margin"),
            })
    return rows
