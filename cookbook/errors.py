"""One exception hierarchy for the whole cookbook.

Every error carries a one-line message that names the file, field or flag at fault, and the exit
code the CLI uses for it, so the CLI never has to guess.
"""
from __future__ import annotations


class CookbookError(Exception):
    """Base of every error the cookbook raises on purpose."""

    exit_code = 1


class RecipeError(CookbookError):
    """A recipe file is missing, unreadable or does not match the schema."""

    exit_code = 2


class FixPackError(CookbookError):
    """The fix pack's metadata is inconsistent or names something that does not exist."""

    exit_code = 2


class SetupError(CookbookError):
    """Building the CPU image, the cookbook environment or a model failed."""

    exit_code = 1


class LaunchError(CookbookError):
    """The server did not come up; carries the tail of its log."""

    exit_code = 1

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail or []


class ServerError(CookbookError):
    """The server answered wrongly or not at all."""

    exit_code = 1


class ServerDown(ServerError):
    """The server stopped answering (connection refused or /health failing)."""


class ResultsError(CookbookError):
    """A results file is missing or does not match the results schema."""

    exit_code = 2


class UsageError(CookbookError):
    """A command-line value that cannot be used (a flag's value out of range, a URL that is not one)."""

    exit_code = 2


class RequestTimeout(ServerError):
    """A request got no complete answer within its wall-clock deadline (or the run's budget ran out)."""


class RequestFailed(ServerError):
    """The server is up but a request failed: an HTTP error status, an answer that is not the API's JSON, or the
    connection cut midway. Mapped once, in `cookbook.endpoint`, for every caller (checks, probes, bench): a check
    or probe it ends is a "fail", a benchmark request it ends is counted as failed."""

    def __init__(self, message: str, status_code: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class RequestRejected(RequestFailed):
    """The server refused the request itself (HTTP 3xx, never followed, or 4xx): the request, not the engine, is at
    fault as the server sees it."""


class ConnectionLost(RequestFailed):
    """The connection broke before the answer was whole while /health still answers (else it is `ServerDown`)."""
