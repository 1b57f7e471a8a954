"""Every example a `--help` prints (cookbook/cli/*.py EXAMPLES) is a command that works: each line is parsed by the
real parser, the ones that need no server and no Gaudi box are run for real, and every `--param KEY=VALUE` a help
text shows is a parameter its reader takes (`--param CONCURRENCY=4` in `run` and `demo` was not)."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from cookbook.cli import COMMANDS, build_parser, load_command, main

ROOT = Path(__file__).resolve().parent.parent
# (command, subcommand) whose examples run here in seconds: they read recipes and write files, no server, no card.
RUN_FOR_REAL = {("recipe", "list"), ("recipe", "show"), ("recipe", "validate"), ("recipe", "launch-script"),
                ("recipe", "container"), ("doctor", None), ("k8s", "render"), ("page", None)}
# Flags whose value is read from a run folder or a server: a line with one is parsed, not run.
NEEDS_MORE = {"--base-url", "--launch", "--results", "--fleet-results"}


def examples() -> list[tuple[str, str, list[str]]]:
    """(command, the line as printed, its words without the comment) for every example line of every command."""
    found = []
    for command in COMMANDS:
        text = load_command(command).EXAMPLES.replace("\\\n", " ")
        for line in text.strip("\n").splitlines():
            if line.strip():
                found.append((command, line.strip(), _globbed(shlex.split(line, comments=True))))
    return found


def _globbed(words: list[str]) -> list[str]:
    """A shell glob (runs/*-smol) as the shell gives it when it matches: two names here, whatever is on disk."""
    return [w.replace("*", part) for w in words for part in (("a", "b") if "*" in w else ("",))]


EXAMPLES = examples()


def _subcommand(command: str, words: list[str]) -> str | None:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    return words[2] if nested and len(words) > 2 else None


def _runs_here(command: str, words: list[str]) -> bool:
    listing = command == "verify" and "--list-params" in words
    return listing or (command, _subcommand(command, words)) in RUN_FOR_REAL and not NEEDS_MORE & set(words)


def _outs_into(words: list[str], tmp_path: Path) -> list[str]:
    """The words with every `--out DIR` moved under tmp_path, so running an example writes nothing in the checkout."""
    moved = list(words)
    for i, word in enumerate(moved[:-1]):
        if word == "--out":
            moved[i + 1] = str(tmp_path / moved[i + 1])
    return moved


def test_every_command_shows_examples_and_they_are_collected() -> None:
    assert {command for command, _, _ in EXAMPLES} == set(COMMANDS)
    assert sum(_runs_here(c, w) for c, _, w in EXAMPLES if w[0] == "cookbook") >= 8  # the run-for-real set is real


@pytest.mark.parametrize(("command", "line", "words"), EXAMPLES, ids=[line for _, line, _ in EXAMPLES])
def test_example_parses_and_runs_where_it_can(command: str, line: str, words: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if words[0] == "kubectl":  # applies what the k8s example before it renders: that folder must be what it writes
        assert words[1:3] == ["apply", "-f"], line
        renders = [w for c, _, w in EXAMPLES if c == "k8s" and w[0] == "cookbook" and "--fleet" not in w]
        monkeypatch.chdir(tmp_path)
        assert main(_outs_into(renders[0], tmp_path)[1:]) == 0, capsys.readouterr().err
        assert (tmp_path / words[3]).is_dir(), f"{line}: `{' '.join(renders[0])}` does not write {words[3]}"
        return
    assert words[0] == "cookbook", line
    args = build_parser(command).parse_args(words[1:])  # argparse's own errors exit 2 here
    assert args.command == command
    if not _runs_here(command, words):
        return
    monkeypatch.chdir(ROOT)
    code = main(_outs_into(words, tmp_path)[1:])
    comment = line.partition("#")[2]
    allowed = {0, 1} if "exit 1" in comment else {0}  # `doctor RECIPE`: exit 1 when this box cannot run it
    assert code in allowed, f"{line}: exit {code}: {capsys.readouterr().err.strip()}"


def _help_texts() -> dict[str, str]:
    texts = {}
    for command in COMMANDS:
        parser = build_parser(command)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        texts[command] = sub.format_help() + "".join(p.format_help() for a in nested for p in a.choices.values())
    return texts


def test_every_param_example_in_a_help_text_is_a_parameter_its_reader_takes() -> None:
    from cookbook.batch import plan
    from cookbook.cli._common import parse_params
    from cookbook.cli.verify import parse_params as check_params

    shown = {command: re.findall(r"e\.g\. --param (\S+=\S+?)[;,)]?(?:\s|$)", " ".join(text.split()))
             for command, text in _help_texts().items()}
    assert shown["run"] and shown["demo"] and shown["verify"], shown
    for command, items in shown.items():
        for item in items:
            if command in ("run", "demo"):
                plan(None, parse_params([item], upper_case_keys=True))  # a key no notebook declares raises here
            else:
                check_params([item])  # a key no check declares, or a value of the wrong type, raises here
