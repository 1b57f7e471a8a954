"""The house's wiring: every check module and every subcommand is loaded, none can vanish silently."""
from __future__ import annotations

from pathlib import Path

import cookbook.checks as checks
from cookbook.checks._load_all import CHECK_MODULES
from cookbook.cli import COMMANDS, build_parser

PACKAGE = Path(checks.__file__).resolve().parent.parent
HELPERS = {"registry", "matching"}  # modules of the checks package that register no check


def test_every_check_module_is_loaded() -> None:
    on_disk = {p.stem for p in (PACKAGE / "checks").glob("*.py") if not p.stem.startswith("_")} - HELPERS
    assert set(CHECK_MODULES) == on_disk
    registered_from = {spec.fn.__module__.rsplit(".", 1)[-1] for spec in checks.CHECKS.values()}
    assert registered_from == set(CHECK_MODULES)


def test_every_command_module_is_a_subcommand() -> None:
    on_disk = {p.stem for p in (PACKAGE / "cli").glob("*.py") if not p.stem.startswith("_")}
    assert set(COMMANDS) == on_disk
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(COMMANDS)
