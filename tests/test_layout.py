"""The house's wiring: every check module and every subcommand is loaded, none can vanish silently."""
from __future__ import annotations

from pathlib import Path

import cookbook.checks as checks
from cookbook.checks._load_all import CHECK_MODULES
from cookbook.cli import COMMANDS, build_parser

PACKAGE = Path(checks.__file__).resolve().parent.parent
HELPERS = {"registry", "matching", "kit", "params"}  # modules and packages of the checks package that register no check


def test_every_check_module_is_loaded() -> None:
    """A check module is a module of cookbook/checks or a package there (one module per probe inside)."""
    folder = PACKAGE / "checks"
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    assert set(CHECK_MODULES) == (modules | packages) - HELPERS
    registered_from = {spec.fn.__module__.split(".")[2] for spec in checks.CHECKS.values()}
    assert registered_from == set(CHECK_MODULES)
    in_packages = {spec.fn.__module__.split(".")[3] for spec in checks.CHECKS.values() if spec.fn.__module__.count(".") > 2}
    probes = {p.stem for name in packages - HELPERS for p in (folder / name).glob("*.py") if not p.stem.startswith("_")}
    assert in_packages == probes  # every probe module of a package registers its check


def test_every_command_module_is_a_subcommand() -> None:
    on_disk = {p.stem for p in (PACKAGE / "cli").glob("*.py") if not p.stem.startswith("_")}
    assert set(COMMANDS) == on_disk
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(COMMANDS)


def test_no_module_of_the_checks_or_the_reference_is_over_600_lines() -> None:
    """A probe per module over the shared kit (issue 21): a module past 600 lines is doing more than one job."""
    long = {str(p.relative_to(PACKAGE)): n for folder in ("checks", "reference") for p in (PACKAGE / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
