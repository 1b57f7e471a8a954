"""Server health after all checks: /health answers 200 and the process did not restart during the run.

A restart is seen as a changed `process_start_time_seconds` in /metrics against the value `run_checks` recorded
before the first check (`ctx.run_start`); a server that restarts quietly between two checks would otherwise pass
everything. The KV pool recorded at the start goes into the results (`kv_pool_tokens`) and this check's details.
"""
from __future__ import annotations

from datetime import datetime, timezone

from ..errors import CookbookError, ServerError
from ..results import Evidence
from .registry import CheckContext, CheckOutcome, check


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


@check("server-health", "Server health after all checks")
def server_health(ctx: CheckContext) -> CheckOutcome:
    start = ctx.run_start
    if start is None:
        raise CookbookError("server-health needs the run's start snapshot: run it through run_checks")
    details = {"kv_pool_tokens": start.kv_pool_tokens, "process_start_time": start.process_start_time}
    if not ctx.endpoint.healthy():
        note = f"{ctx.endpoint.base_url}/health does not answer 200 after the checks"
        return CheckOutcome(False, "unhealthy after the checks", [Evidence(note=note)], details)
    problem: str | None
    try:
        now = ctx.endpoint.process_start_time()
    except ServerError as exc:
        now, problem = None, f"/metrics unreadable ({exc})"
    else:
        problem = None if now is not None else "no process_start_time_seconds in /metrics"
    details["process_start_time_now"] = now
    if problem is None and start.process_start_time is None:
        problem = "no process_start_time_seconds in /metrics at the start of the run"
    if problem is not None:
        return CheckOutcome(False, f"healthy; a restart cannot be ruled out: {problem}", [Evidence(note=problem)], details)
    if now != start.process_start_time:
        assert now is not None and start.process_start_time is not None
        note = (
            f"restarted during the run: process_start_time_seconds moved from {_when(start.process_start_time)} "
            f"to {_when(now)}"
        )
        return CheckOutcome(False, "healthy, but restarted during the run", [Evidence(note=note)], details)
    return CheckOutcome(True, "healthy, no restarts", [], details)
