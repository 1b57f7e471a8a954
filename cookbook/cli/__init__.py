"""The `cookbook` command: parses arguments and calls the library, nothing more.

Each command lives in its own module here with `add_parser(subparsers)`; the parser's `run` default takes the
parsed arguments and returns the exit code. Errors from the library are CookbookError subclasses: one line on
stderr, their own exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CookbookError
from ..secrets import ScrubbingStream

COMMANDS = ["setup", "recipe", "serve", "verify", "bench", "run", "page", "compare", "demo", "doctor", "reference", "k8s"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cookbook", description="Gaudi Cookbook: recipes, fixes, launch, checks, benchmarks, reports")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:  # a listed command that does not import is an error, never a missing subcommand
        importlib.import_module(f"{__name__}.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Everything the command prints goes through the one masking path, control characters escaped.
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbingStream(out), ScrubbingStream(err)
    try:
        return int(args.run(args) or 0)
    except CookbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())
