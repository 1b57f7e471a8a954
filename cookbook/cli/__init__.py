"""The `cookbook` command: parses arguments and calls the library, nothing more.

Each command lives in its own module here with `configure(parser)` (its arguments, `run` as the parser's default)
and `EXAMPLES` (shown under its --help); `_commands.COMMANDS` names them with their one-line help, so the top-level
parser is built without importing any of them and only the command being run is imported. Errors from the library
are CookbookError subclasses: one line on stderr and the exit code `errors.exit_code_for` gives; anything else is a
bug: one line, the traceback in a file, exit 4. The exit codes are `errors.EXIT_CODES`, listed under --help.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Any

from .. import __version__
from ..errors import EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, CookbookError, UsageError, exit_code_for
from ..secrets import ScrubbingStream
from ._commands import COMMANDS

__all__ = ["COMMANDS", "build_parser", "main"]

_EPILOG = "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items()) + (
    "\n\nRun `cookbook COMMAND --help` for a command's flags and examples; docs/cli.md has them all."
)


def load_command(name: str) -> Any:
    """The module of one subcommand; a listed command that does not import is an error, never a missing subcommand."""
    return importlib.import_module(f"{__name__}.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, with only `command`'s module imported and its arguments filled in (None: none of them,
    enough for `cookbook --help`, which lists every command from the table)."""
    parser = argparse.ArgumentParser(
        prog="cookbook", description="Gaudi Cookbook: recipes, fixes, launch, checks, benchmarks, reports",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cookbook {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_line in COMMANDS.items():
        if name != command:
            subparsers.add_parser(name, help=help_line, add_help=False)  # a placeholder: never parsed
            continue
        module = load_command(name)
        sub = subparsers.add_parser(
            name, help=help_line, description=(module.__doc__ or help_line).strip().split("\n\n")[0],
            epilog="examples:\n" + module.EXAMPLES.strip("\n"), formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(sub)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option (the top level has no option
    that takes a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    try:
        parser = build_parser(command if command in COMMANDS else None)
    except Exception as exc:  # a listed command whose module does not import: a bug, said as one
        return _internal_error(exc)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and argparse's usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    # Everything the command prints goes through the one masking path, control characters escaped.
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbingStream(out), ScrubbingStream(err)
    try:
        _common_checks(args)
        return int(args.run(args) or 0)
    except CookbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        return _internal_error(exc)
    finally:
        _close_references()
        sys.stdout, sys.stderr = out, err


def _close_references() -> None:
    """Stop every reference forward pass the command started (a check loads one at most once per run)."""
    from ..reference import COMPUTED

    COMPUTED.close_all()


def _common_checks(args: argparse.Namespace) -> None:
    """What every command's flags share, checked once here: the deprecated --recipe, a --base-url without scheme."""
    from ._common import resolve_recipe_flag

    resolve_recipe_flag(args)
    url = getattr(args, "base_url", None)
    if url and "://" not in url and re.fullmatch(r"[\w.\-\[\]:]+(/\S*)?", url):  # localhost:8000, gaudi-box
        raise UsageError(f"--base-url: {url!r} has no scheme; did you mean http://{url.lstrip('/')} ?")


def _internal_error(exc: BaseException) -> int:
    """A bug: one line on stderr, the whole traceback in a file for the report, exit 4."""
    where = _write_traceback(exc)
    print(f"internal error: {type(exc).__name__}: {str(exc)[:300]} (a bug; traceback in {where})", file=sys.stderr)
    return EXIT_INTERNAL


def _write_traceback(exc: BaseException) -> str:
    import tempfile
    import time
    import traceback

    from ..secrets import scrub

    text = scrub(f"cookbook {__version__}: {' '.join(sys.argv)}\n"
                 + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    try:
        fd, path = tempfile.mkstemp(prefix=f"cookbook-traceback-{time.strftime('%Y%m%dT%H%M%S')}-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path
    except OSError:
        return "nowhere (could not write a file)"


if __name__ == "__main__":
    sys.exit(main())
