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

    exit_code = 5


class LaunchError(CookbookError):
    """The server did not come up; carries the tail of its log."""

    exit_code = 5

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail or []


class ServerError(CookbookError):
    """The server answered wrongly or not at all."""

    exit_code = 1


class ServerDown(ServerError):
    """The server stopped answering (connection refused or /health failing)."""

    exit_code = 3


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


# -- exit codes: the one table the CLI, `cookbook --help` and docs/cli.md show ---------------------------------------

EXIT_OK = 0
EXIT_NOT_MET = 1  # the command ran and a check, a limit or a comparison did not meet what was expected
EXIT_USAGE = 2  # a flag, a recipe or a results file that cannot be used; nothing was run
EXIT_UNREACHABLE = 3  # the server does not answer
EXIT_INTERNAL = 4  # a bug: an exception nobody raised on purpose
EXIT_RUN_FAILED = 5  # the run itself broke: a notebook failed, the server did not come up
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok: everything ran and met the recipe",
    EXIT_NOT_MET: "checks not met (a failed check, a regression, a recipe that cannot run here)",
    EXIT_USAGE: "usage error: a bad flag or value, a missing or invalid recipe or results file; nothing ran",
    EXIT_UNREACHABLE: "server unreachable (--base-url does not answer)",
    EXIT_INTERNAL: "internal error: a bug; the traceback is written to a file named on stderr",
    EXIT_RUN_FAILED: "the run failed: a notebook failed, the server did not come up, setup failed",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_code_for(exc: CookbookError) -> int:
    """The exit code of an error the cookbook raised on purpose: its class's, except that a plain CookbookError
    whose message names a flag (`--out: ...`, the hierarchy's convention) is the command line's fault, a usage error."""
    if type(exc) is CookbookError and str(exc).startswith("--"):
        return EXIT_USAGE
    return int(exc.exit_code)
