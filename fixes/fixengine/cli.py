"""The command line: parse the arguments, dispatch to a command, print text or JSON, return the exit code."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from .base import EXIT_OK, EXIT_USAGE, FixError, Outcome, PACK_DIR
from .capture import cmd_capture
from .commands import cmd_apply, cmd_list, cmd_revert, cmd_status, ledger_profile
from .pack import load_pack


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 1
        raise FixError(EXIT_USAGE, message)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog="apply_all.py", description="Apply the Gaudi Cookbook fix pack to this image's packages.",
                epilog="exit codes: 0 ok or no-op, 1 usage, 2 image mismatch, 3 drift / conflict / missing payload"
                       " / partial state / damaged ledger or journal, 4 cannot write or lock")
    p.add_argument("--profile", help="profile to apply (e.g. v0.26.0, cpu-0.32.0)")
    p.add_argument("fixes", nargs="*", metavar="FIX", help="opt-in fixes to add (or, with --revert, fixes to revert)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="list fixes, opt-in, depends-on and state")
    mode.add_argument("--status", action="store_true", help="per pin, fix and file: pristine / applied / "
                      "modified; missing payloads; pinned files that differ")
    mode.add_argument("--revert", action="store_true", help="restore the original files, in reverse order "
                      "(from the blob store when the ledger is damaged or gone)")
    mode.add_argument("--capture", metavar="FIX", help="write FIX's payload and hashes from an edited copy of its "
                                                       "files (--from); the image must match the profile")
    p.add_argument("--from", dest="edited", type=Path, metavar="DIR",
                   help="with --capture: a folder laid out like site-packages holding the edited files")
    p.add_argument("--force", action="store_true",
                   help="with --revert: restore the saved originals even over files changed since the apply")
    p.add_argument("--dry-run", action="store_true", help="check and show what would be written; write nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--root", type=Path, help="site-packages folder to act on instead of this interpreter's")
    p.add_argument("--pack", type=Path, default=PACK_DIR, help=argparse.SUPPRESS)
    p.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for another run (600)")
    return p.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> Outcome:
    args = parse_args(argv)
    if args.root is not None and not args.root.is_dir():
        raise FixError(EXIT_USAGE, f"--root {args.root}: not a folder")
    root = args.root.resolve() if args.root is not None else None
    if not math.isfinite(args.lock_timeout) or args.lock_timeout < 0:
        raise FixError(EXIT_USAGE, f"--lock-timeout {args.lock_timeout:g}: must be a finite number of seconds >= 0")
    if args.force and not args.revert:
        raise FixError(EXIT_USAGE, "--force only goes with --revert")
    if (args.edited is not None) != (args.capture is not None):
        raise FixError(EXIT_USAGE, "--capture FIX and --from DIR go together")
    pack = load_pack(args.pack)
    profile = None
    if args.profile is not None:
        profile = pack.profiles.get(args.profile)
        if profile is None:
            raise FixError(EXIT_USAGE, f"unknown profile '{args.profile}' (profiles: {', '.join(pack.profiles)})")
    if args.list:
        if args.fixes:
            raise FixError(EXIT_USAGE, "--list takes no fix names")
        return cmd_list(pack, [profile] if profile else list(pack.profiles.values()), root)
    if args.status:
        profile = profile or ledger_profile(pack, root)
        if profile is None:
            raise FixError(EXIT_USAGE, "--status needs --profile NAME (no ledger found here)")
        return cmd_status(pack, profile, root, args.lock_timeout)
    if args.revert:
        profile = profile or ledger_profile(pack, root)
        if profile is None:
            return Outcome(EXIT_OK, ["apply_all: no fixes are applied here, nothing to revert"],
                           {"result": "no-op", "reverted": []})
        return cmd_revert(pack, profile, args.fixes, root, args.dry_run, args.lock_timeout, args.force)
    if profile is None:
        raise FixError(EXIT_USAGE, "--profile NAME is required (or --list / --status / --revert)")
    if args.capture is not None:
        if args.fixes:
            raise FixError(EXIT_USAGE, "--capture takes one fix: --capture FIX --from DIR")
        return cmd_capture(pack, profile, args.capture, args.edited, root, args.dry_run, args.lock_timeout)
    return cmd_apply(pack, profile, args.fixes, root, args.dry_run, args.lock_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    try:
        outcome = run(argv)
    except FixError as exc:
        if as_json:
            print(json.dumps({"ok": False, "exit_code": exc.code, "error": str(exc), **exc.data}, indent=2))
        else:
            print(f"apply_all: error: {exc}", file=sys.stderr)
            for line in exc.details:
                print(line, file=sys.stderr)
        return exc.code
    if as_json:
        print(json.dumps({"ok": outcome.code == EXIT_OK, "exit_code": outcome.code, **outcome.data}, indent=2))
    else:
        print("\n".join(outcome.lines))
    return outcome.code
