"""The check registry and the one runner every check goes through."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..endpoint import Deadline, Endpoint, kv_pool_from_metrics, metric_value, prefill_pace_from_metrics
from ..errors import CookbookError, RequestFailed, RequestTimeout, ServerDown
from ..haystack import request_timeout
from ..progress import Progress, Task
from ..recipes import Recipe
from ..results import CheckResult, Evidence, Hardware, RunResults, Status, now, run_hardware
from .params import Param, validate


@dataclass(frozen=True)
class RunStart:
    """The server as the run found it; server-health compares against it to see a restart during the run."""

    healthy: bool
    process_start_time: float | None = None
    kv_pool_tokens: int | None = None
    prefill_s_per_token: float | None = None  # the server's measured prefill pace (endpoint.prefill_pace_from_metrics)


def snapshot_server(endpoint: Endpoint) -> RunStart:
    """Health, process start time and KV pool now (one /health and one /metrics request)."""
    if not endpoint.healthy():
        return RunStart(healthy=False)
    try:
        metrics = endpoint.metrics()
    except CookbookError:  # a server without /metrics still gets checked; server-health says what is missing
        return RunStart(healthy=True)
    return RunStart(True, metric_value(metrics, "process_start_time_seconds"), kv_pool_from_metrics(metrics),
                    prefill_pace_from_metrics(metrics))


class CheckInconclusive(CookbookError):
    """Raised inside a check that could not bring the engine into the state it exists for: never a pass, never a
    fail; `why` says what was missing (e.g. the server could not be made to preempt)."""

    def __init__(self, why: str, evidence: list[Evidence] | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.evidence = evidence or []
        self.details = details or {}


class CheckSkipped(CookbookError):
    """Raised inside a check that found, once running, it has nothing to compare with (e.g. no reference recorded
    for this image): status "skipped" with `result` as the table's text, never a pass."""

    def __init__(self, result: str, evidence: list[Evidence] | None = None) -> None:
        super().__init__(result)
        self.result = result
        self.evidence = evidence or []


class CheckFailed(CookbookError):
    """Raised inside a check to end it as a fail with evidence, e.g. when the server answers HTTP 500."""

    def __init__(self, result: str, evidence: list[Evidence] | None = None, timed_out: bool = False) -> None:
        super().__init__(result)
        self.result = result
        self.evidence = evidence or []
        self.timed_out = timed_out  # the request got no answer within its deadline (see run_checks' stall rule)


@dataclass
class CheckContext:
    """What a check gets: where the server is, what the recipe expects, the run's folder, overrides."""

    endpoint: Endpoint
    recipe: Recipe | None = None
    out_dir: Path | None = None
    params: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = 60.0
    hardware: Hardware | None = None  # what served the run; default: this machine for CPU recipes, else unknown
    run_start: RunStart | None = None  # set by run_checks before the first check
    budget_s: float | None = None  # the whole run's wall-clock budget; every request's deadline is capped by it
    task: Task | None = None  # set by run_checks: the run's progress, for a check to report its cells (`report`)

    def report(self, detail: str) -> None:
        """A long check's current cell or prompt, shown beside its name in the run's progress."""
        if self.task is not None:
            name = self.task.detail.split(":", 1)[0]
            self.task.update(f"{name}: {detail}")

    @property
    def prefill_pace(self) -> float | None:
        """Seconds per prompt token the server has prefilled at so far, as its /metrics said when the run started."""
        return self.run_start.prefill_s_per_token if self.run_start else None

    def prompt_timeout(self, prompt_tokens: int, base_s: float | None = None) -> float:
        """A deadline for one request of `prompt_tokens` (haystack.request_timeout), stretched by the server's
        measured prefill pace when it is slower than the fixed allowance."""
        return request_timeout(self.request_timeout_s if base_s is None else base_s, prompt_tokens, self.prefill_pace)

    @property
    def max_tokens(self) -> int:
        return self.recipe.verification.max_tokens if self.recipe else 64

    @property
    def concurrency(self) -> int:
        if self.recipe is None:
            return int(self.params.get("concurrency", 8))
        return self.recipe.verification.concurrency or self.recipe.max_num_seqs


@dataclass
class CheckOutcome:
    """What a check function returns; the runner adds name, label, timing and the recipe's expectations."""

    passed: bool
    result: str
    evidence: list[Evidence] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    label: str | None = None  # overrides the registered label when it depends on parameters
    inconclusive: str | None = None  # why the check proved nothing either way; `passed` is then ignored


CheckFn = Callable[[CheckContext], CheckOutcome]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    label: str  # may hold "{concurrency}", filled in by label_for
    fn: CheckFn
    group: str  # "core" or "long-context"
    applies: Callable[[CheckContext], str | None]  # None if it applies, else why not
    params: tuple[Param, ...] = ()  # what it reads from --param (cookbook.checks.params)

    def label_for(self, ctx: CheckContext) -> str:
        return self.label.replace("{concurrency}", str(ctx.concurrency))


CHECKS: dict[str, CheckSpec] = {}


def _always(_ctx: CheckContext) -> str | None:
    return None


def check(
    name: str, label: str, group: str = "core", applies: Callable[[CheckContext], str | None] = _always,
    params: tuple[Param, ...] = (),
) -> Callable[[CheckFn], CheckFn]:
    """Register a check function under `name`; `label` is the Verified table's Check column
    ("{concurrency}" in it becomes the run's in-flight count); `params` the check parameters it reads."""

    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        CHECKS[name] = CheckSpec(name, label, fn, group, applies, params)
        return fn

    return register


def check_groups() -> list[str]:
    """Every registered group, in registry order ('core', 'long-context', and whatever other modules add)."""
    return list(dict.fromkeys(s.group for s in CHECKS.values()))


def selected_checks(names: list[str] | None, recipe: Recipe | None) -> list[CheckSpec]:
    """Registry order; `names` (e.g. from --checks) may name checks or groups ('core', 'long-context').

    Without names: the recipe's `verification.checks` if it lists any, else every registered check of every
    group. Whether a check applies to the recipe is decided when it runs (its `applies`, the recipe's `skip`),
    so a check that does not apply shows as skipped with why, never silently missing; `--checks core` is the
    quick path."""
    if names:
        unknown = [n for n in names if n not in CHECKS and n not in check_groups()]
        if unknown:
            raise CookbookError(
                f"--checks: unknown check {unknown[0]!r} (groups: {', '.join(check_groups())}; checks: {', '.join(CHECKS)})"
            )
        wanted = set(names)
        return [s for s in CHECKS.values() if s.name in wanted or s.group in wanted]
    if recipe is not None and recipe.verification.checks:
        return selected_checks(recipe.verification.checks, None)
    return list(CHECKS.values())


def run_checks(ctx: CheckContext, names: list[str] | None = None, progress: Progress | None = None) -> RunResults:
    """Run the selected checks in order. If the server goes down, the rest are 'not run: server down'.

    Before the first check the server's start time and KV pool are recorded (`ctx.run_start`), so that
    server-health can tell a restart during the run; after a check that did not pass, /health decides whether
    the server is still there. `progress` gets a step per check (and the cells a long check reports).
    """
    if ctx.budget_s is not None:
        ctx.endpoint.budget = Deadline(ctx.budget_s, "the run's budget")
    try:
        return _run_checks(ctx, names, progress)
    finally:
        if ctx.budget_s is not None:
            ctx.endpoint.budget = None


# After this many checks in a row whose requests got no answer within their deadline (while /health still answers),
# the API is taken as hanging and the rest are not run: a hung server must not cost a full timeout per check.
STALLED_AFTER = 2


def _run_checks(ctx: CheckContext, names: list[str] | None, progress: Progress | None) -> RunResults:
    recipe = ctx.recipe
    budget = ctx.endpoint.budget
    ctx.run_start = snapshot_server(ctx.endpoint)
    ctx.endpoint.prefill_pace = ctx.run_start.prefill_s_per_token
    results = RunResults(
        recipe=recipe.id if recipe else "(none)",
        model=ctx.endpoint.model,
        hardware=run_hardware(ctx.hardware, ctx.recipe, ctx.endpoint.base_url),
        image=recipe.image.label.replace("`", "") if recipe else "",
        started_at=now(),
        kv_pool_tokens=ctx.run_start.kv_pool_tokens,
    )
    server_down = not ctx.run_start.healthy
    stalled = 0  # checks in a row that ran out of their requests' deadline
    not_run = "not run: server down"
    why_not_run = [Evidence(note=f"{ctx.endpoint.base_url}/health did not answer 200 before the first check")] if server_down else []
    specs = selected_checks(names, recipe)
    task = ctx.task = Task(progress, "checks", total=len(specs))
    for spec in specs:
        task.step(spec.name)
        label = spec.label_for(ctx)
        skip_reason = recipe.verification.skip.get(spec.name) if recipe else None
        skip_reason = skip_reason or spec.applies(ctx)
        if not server_down and budget is not None and budget.expired:
            server_down, not_run = True, f"not run: {budget.describe()} was used up"
            results.stopped = results.stopped or f"{budget.describe()} was used up before {spec.name}"
        if not server_down and stalled >= STALLED_AFTER:
            server_down = True
            not_run = f"not run: the API gave no answer within the deadline in {stalled} checks in a row"
            results.stopped = results.stopped or f"{not_run.removeprefix('not run: ')} (before {spec.name})"
        if server_down:
            results.checks.append(CheckResult(name=spec.name, label=label, status="not run", result=not_run,
                                              evidence=list(why_not_run)))
            continue
        if skip_reason:
            results.checks.append(CheckResult(name=spec.name, label=label, status="skipped", result=f"not applicable: {skip_reason}"))
            continue
        started = time.monotonic()
        status: Status
        timed_out = False
        try:
            outcome = spec.fn(ctx)
            status = "inconclusive" if outcome.inconclusive else "pass" if outcome.passed else "fail"
        except CheckInconclusive as exc:
            outcome = CheckOutcome(False, "", exc.evidence, exc.details, inconclusive=exc.why)
            status = "inconclusive"
        except CheckFailed as exc:
            outcome = CheckOutcome(False, exc.result, exc.evidence)
            status = "fail"
            timed_out = exc.timed_out
        except CheckSkipped as exc:
            outcome = CheckOutcome(False, exc.result, exc.evidence)
            status = "skipped"
        except ServerDown as exc:
            server_down = True
            results.stopped = results.stopped or f"server down during {spec.name}"
            outcome = CheckOutcome(False, "not run: server down", [Evidence(note=str(exc))])
            status = "not run"
            why_not_run = [Evidence(note=f"server down during {spec.name}: {exc}")]
        except (RequestFailed, RequestTimeout) as exc:  # the server failed a request (mapped once, in endpoint)
            outcome = CheckOutcome(False, str(exc), [Evidence(note=str(exc))])
            status = "fail"
            timed_out = isinstance(exc, RequestTimeout)
        except CookbookError as exc:
            outcome = CheckOutcome(False, f"error: {exc}", [Evidence(note=str(exc))])
            status = "error"
        except Exception as exc:  # a check must never take the suite down with it
            if not ctx.endpoint.healthy():
                server_down = True
                outcome = CheckOutcome(False, "not run: server down", [Evidence(note=repr(exc))])
                status = "not run"
            else:
                tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
                outcome = CheckOutcome(False, f"error: {tb}", [Evidence(note=tb)])
                status = "error"
        if status in ("fail", "error") and not ctx.endpoint.healthy():
            server_down = True  # e.g. the request that failed took the engine down with it
            results.stopped = results.stopped or f"server down after {spec.name}"
        stalled = stalled + 1 if timed_out else 0
        if timed_out:
            outcome.details = {**outcome.details, "ran_out_of_deadline": True}
        limitation = recipe.verification.known_limitations.get(spec.name) if recipe else None
        result_text = outcome.result
        evidence = list(outcome.evidence)
        if status == "inconclusive":
            why = outcome.inconclusive or "no reason given"
            result_text = result_text if result_text.startswith("inconclusive") else f"inconclusive: {why}"
            evidence.insert(0, Evidence(note=f"inconclusive: {why}"))
        if limitation and status == "fail":
            status = "known limitation"
            result_text = f"{outcome.result} (known limitation of this model)"
            evidence.insert(0, Evidence(note=f"known limitation: {limitation}"))
        results.checks.append(
            CheckResult(
                name=spec.name,
                label=outcome.label or label,
                status=status,
                result=result_text,
                evidence=evidence,
                duration_s=round(time.monotonic() - started, 3),
                details=outcome.details,
            )
        )
    task.finish()
    results.finished_at = now()
    return results


def verified_table(results: RunResults) -> str:
    """The seeds' Verified table (Check | Result) in Markdown, then the KV pool line. Only a pass shows bare:
    a fail says so, a known limitation shows its measured result with the label."""
    rows = ["| Check | Result |", "|---|---|"]
    for c in results.checks:
        shown = (f"fail: {c.result}" if c.status == "fail" else c.result).replace("|", "\\|")
        rows.append(f"| {c.label} | {shown} |")
    if results.kv_pool_tokens is not None:
        rows += ["", f"KV pool at start-up: {results.kv_pool_tokens:,} tokens."]
    return "\n".join(rows) + "\n"


def check_params(params: dict[str, Any], specs: list[CheckSpec] | None = None, flag: str = "--param") -> dict[str, Any]:
    """`params` typed by what the checks run (`specs`; default every check) declare, refused in one line naming the
    key when no such check reads it or the value is not of its type (concurrency=abc, concurrency=0 would pass the
    concurrent check with zero requests, a depth of 2)."""
    return validate(params, CHECKS.values() if specs is None else specs, CHECKS.values(), flag)
