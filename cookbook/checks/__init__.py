"""The verification suite: every check of the seeds' Verified tables, against any OpenAI-compatible server.

A check is one function registered with `@check(...)` in one place (its module); `run_checks` runs a selection
in registry order and returns a `RunResults`. Importing this package imports every check module.
"""
from .registry import (
    CHECKS,
    CheckContext,
    CheckFailed,
    CheckInconclusive,
    CheckOutcome,
    RunStart,
    check,
    run_checks,
    selected_checks,
    verified_table,
)

__all__ = [
    "CHECKS",
    "CheckContext",
    "CheckFailed",
    "CheckInconclusive",
    "CheckOutcome",
    "RunStart",
    "check",
    "run_checks",
    "selected_checks",
    "verified_table",
]

# Check modules register themselves on import; the order here is the Verified table's order.
from . import _load_all  # noqa: E402,F401
