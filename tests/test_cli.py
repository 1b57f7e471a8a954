"""The CLI's one language: exit codes per state, --version, a fast --help that imports no command, an example in
every command's help, RECIPE first everywhere, --out a folder, one --hardware and one --param grammar."""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook import __version__
from cookbook.cli import COMMANDS, build_parser, main
from cookbook.cli._common import parse_params, resolve_recipe_flag
from cookbook.errors import (EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NOT_MET, EXIT_UNREACHABLE, EXIT_USAGE,
                             CookbookError, ServerDown, UsageError, exit_code_for)
from cookbook.launch import free_port
from cookbook.results import Hardware, parse_hardware

ROOT = Path(__file__).resolve().parent.parent
CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"
GAUDI = "Qwen/Qwen3-Coder-Next"


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# -- exit codes ---------------------------------------------------------------------------------------------------


def test_the_exit_codes_are_distinct_and_documented() -> None:
    assert (EXIT_NOT_MET, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERNAL) == (1, 2, 3, 4)
    doc = (ROOT / "docs" / "cli.md").read_text()
    help_text = build_parser().format_help()
    for code in EXIT_CODES:
        assert f"| {code} |" in doc, code
        assert f"\n  {code} " in help_text, code


def test_exit_code_mapping() -> None:
    assert exit_code_for(UsageError("--x: bad")) == EXIT_USAGE
    assert exit_code_for(ServerDown("gone")) == EXIT_UNREACHABLE
    assert exit_code_for(CookbookError("--out: a file")) == EXIT_USAGE  # a plain error naming a flag: usage
    assert exit_code_for(CookbookError("something did not meet")) == 1


@pytest.mark.parametrize("argv", [
    ["verify", "--no-such-flag"],  # argparse
    ["compare"],  # argparse: missing RUN_A
    ["verify", "--base-url", "http://127.0.0.1:9", "--timeout", "0"],  # our own validation
    ["bench", "--base-url", "http://127.0.0.1:9", "--hardware", "gaudi2"],
    ["run", CPU, "--param", "lower=1"],
    ["page", "no/such-recipe"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    assert "Traceback" not in capsys.readouterr().err


def test_server_unreachable_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens on a free port: attaching (no model given, so /health and /v1/models are asked) fails."""
    assert main(["verify", "--base-url", f"http://127.0.0.1:{free_port()}", "--checks", "core"]) == EXIT_UNREACHABLE
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: --base-url")
    assert main(["bench", "--base-url", f"http://127.0.0.1:{free_port()}"]) == EXIT_UNREACHABLE


def test_checks_not_met_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """A Gaudi recipe on this CPU box: doctor says it cannot run here, exit 1 (not a usage error, not a crash)."""
    assert main(["doctor", GAUDI]) == EXIT_NOT_MET
    assert f"{GAUDI}: cannot run here" in capsys.readouterr().out


def test_an_internal_error_is_one_line_and_a_traceback_file(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    recipe_cli = importlib.import_module("cookbook.cli.recipe")

    def broken(args: argparse.Namespace) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(recipe_cli, "_list", broken)  # `configure` hands the parser the module's current _list
    assert main(["recipe", "list"]) == EXIT_INTERNAL
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("internal error: ZeroDivisionError: a bug") and "Traceback" not in err[0]
    where = Path(err[0].rsplit("traceback in ", 1)[1].rstrip(")"))
    text = where.read_text()
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError: a bug" in text
    where.unlink()


def test_a_command_that_does_not_import_is_an_internal_error(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A module renamed without its table entry: said in one line, exit 4, never a missing subcommand."""
    from cookbook.cli import _commands

    monkeypatch.setitem(_commands.COMMANDS, "renamed", "a command whose module is gone")
    assert main(["renamed"]) == EXIT_INTERNAL
    err = _err_lines(capsys)
    assert len(err) == 1 and "ModuleNotFoundError" in err[0] and "cookbook.cli.renamed" in err[0]
    Path(err[0].rsplit("traceback in ", 1)[1].rstrip(")")).unlink()


def test_interrupted_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    recipe_cli = importlib.import_module("cookbook.cli.recipe")

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe_cli, "_list", interrupted)
    assert main(["recipe", "list"]) == EXIT_INTERRUPTED
    assert _err_lines(capsys) == ["interrupted"]



# -- --version, --help --------------------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cookbook {__version__}"


def test_help_lists_every_command_and_imports_none() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from cookbook.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main(['--help'])\n"
        "mods = sorted(m for m in sys.modules if m.startswith('cookbook.cli.') and not m.startswith('cookbook.cli._'))\n"
        "heavy = sorted(m for m in ('pydantic', 'yaml', 'matplotlib', 'openai', 'cookbook.checks') if m in sys.modules)\n"
        "print(__import__('json').dumps({'rc': rc, 'help': out.getvalue(), 'commands': mods, 'heavy': heavy}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    seen = json.loads(done.stdout)
    assert seen["rc"] == 0 and seen["commands"] == [] and seen["heavy"] == []
    for name in COMMANDS:
        assert f"\n    {name}" in seen["help"], name
    assert "exit codes:" in seen["help"]


def test_every_command_imports_and_has_an_example() -> None:
    """The table names a module for each command: a renamed module fails here, it never vanishes from --help."""
    for name in COMMANDS:
        module = importlib.import_module(f"cookbook.cli.{name}")
        assert callable(module.configure), name
        parser = build_parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        text = sub.format_help()
        assert "examples:" in text and f"\n  cookbook {name} " in text, name


def test_a_command_is_imported_only_when_used() -> None:
    code = (
        "import sys\n"
        "from cookbook.cli import main\n"
        "main(['compare', '--help'])\n"
    )
    probe = code.replace("main(['compare', '--help'])",
                         "try:\n    main(['compare', '--help'])\nexcept SystemExit:\n    pass\n"
                         "print(sorted(m for m in sys.modules if m.startswith('cookbook.cli.') and not m.startswith('cookbook.cli._')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "['cookbook.cli.compare']"


def test_the_checks_import_without_jsonschema() -> None:
    """jsonschema's import loads its format checkers (about a second of CPU): only the json-schema check needs it, when
    it judges a reply, so `cookbook verify`, the kernels and every test process start without it."""
    code = ("import sys\nimport cookbook.checks, cookbook.cli.verify, cookbook.batch, cookbook.session\n"
            "print('jsonschema' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"

# -- --base-url, RECIPE, --out, --hardware, --param ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "bench", "serve", "run"])
def test_a_base_url_without_scheme_gets_a_one_line_hint(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, CPU, "--base-url", "localhost:8000"] if command in ("serve", "run") else [command, "--base-url", "localhost:8000"]
    assert main(argv) == EXIT_USAGE
    err = _err_lines(capsys)
    assert len(err) == 1 and "did you mean http://localhost:8000" in err[0], err


def test_recipe_flag_is_a_deprecated_alias_that_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.cli import _common

    _common._warned.discard("--recipe ID")
    for _ in range(2):
        args = argparse.Namespace(command="verify", recipe=None, recipe_flag=CPU)
        resolve_recipe_flag(args)
        assert args.recipe == CPU
    err = _err_lines(capsys)
    assert len(err) == 1 and "deprecated" in err[0] and f"cookbook verify {CPU}" in err[0]
    with pytest.raises(UsageError, match="--recipe"):
        resolve_recipe_flag(argparse.Namespace(command="verify", recipe=GAUDI, recipe_flag=CPU))


def test_verify_on_a_parser_built_by_hand_still_takes_recipe_flag() -> None:
    """tests/test_engine_states.py builds verify's parser itself and calls run(): --recipe must reach the recipe."""
    from cookbook.cli import verify
    from cookbook.cli._common import recipe_from

    parser = argparse.ArgumentParser()
    verify.add_parser(parser.add_subparsers())
    args = parser.parse_args(["verify", "--launch", "--recipe", CPU, "--checks", "known-answer"])
    assert recipe_from(args).id == CPU  # type: ignore[union-attr]


def test_the_recipe_comes_first_in_every_command_that_takes_one() -> None:
    for argv in (["verify", CPU], ["bench", CPU], ["run", CPU], ["serve", CPU], ["page", CPU], ["doctor", CPU],
                 ["reference", "record", CPU], ["k8s", "render", CPU], ["recipe", "show", CPU]):
        args = build_parser(argv[0]).parse_args(argv)
        assert args.recipe == CPU, argv


def test_out_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["page", GAUDI, "--out", str(tmp_path / "run")]) == 0
    assert "KV pool at start-up: " in (tmp_path / "run" / "page.md").read_text()
    assert main(["page", GAUDI, "--out", str(tmp_path / "old.md")]) == 0  # the old meaning, a file: still works
    assert (tmp_path / "old.md").is_file()
    for command in ("verify", "bench", "run", "demo", "page", "compare", "k8s"):
        parser = build_parser(command)
        assert "--out DIR" in parser.format_help() or "--out DIR" in _sub_help(parser, command), command


def _sub_help(parser: argparse.ArgumentParser, name: str) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    inner = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.format_help() + "".join(p.format_help() for a in inner for p in a.choices.values())


def test_one_hardware_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.cli.verify import hardware_from

    assert parse_hardware("gaudi2:four Gaudi 2 cards") == Hardware(kind="gaudi2", description="four Gaudi 2 cards")
    assert hardware_from("gaudi2:four Gaudi 2 cards") == parse_hardware("gaudi2:four Gaudi 2 cards")
    with pytest.raises(UsageError, match="KIND:DESCRIPTION"):
        parse_hardware("gaudi2")
    for name in ("verify", "bench", "run"):
        assert "--hardware KIND:DESCRIPTION" in build_parser(name).format_help() + _sub_help(build_parser(name), name)


def test_one_param_grammar() -> None:
    items = ["A=4", "B=0.5", "C=2000,4000", "D=[1, 2]", "E=abc", "F=true", "G='x, y'", "H=1e3"]
    expected = {"A": 4, "B": 0.5, "C": [2000, 4000], "D": [1, 2], "E": "abc", "F": True, "G": "x, y", "H": 1000.0}
    assert parse_params(items) == expected
    assert parse_params(items, upper_case_keys=True) == expected
    assert parse_params(["lengths=7"]) == {"lengths": 7}  # no guess from the name: the reader's declaration types it
    for bad in (["A"], ["A="], ["=1"]):
        with pytest.raises(UsageError, match="--param: expected KEY=VALUE"):
            parse_params(bad)
    with pytest.raises(UsageError, match="upper-case"):
        parse_params(["lower=1"], upper_case_keys=True)
