"""tests/terminal.py: a child started from a run that inherited SIGINT ignored still takes Ctrl-C."""
from __future__ import annotations

import shlex
import subprocess
import sys

from terminal import from_a_terminal

SHOW_SIGINT = [sys.executable, "-c", "import signal; handler = signal.getsignal(signal.SIGINT); "
               "print('ignored' if handler == signal.SIG_IGN else getattr(handler, '__name__', handler))"]


def _in_the_background(argv: list[str]) -> str:
    """`argv` as a non-interactive shell runs a background command (SIGINT and SIGQUIT ignored), its output."""
    return subprocess.run(["bash", "-c", f"{shlex.join(argv)} & wait"], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_a_background_run_passes_sigint_ignored_to_its_children() -> None:
    assert _in_the_background(SHOW_SIGINT).split() == ["ignored"]  # the trap this module exists for


def test_a_child_started_from_a_terminal_takes_ctrl_c_again() -> None:
    assert _in_the_background(from_a_terminal(SHOW_SIGINT)).split() == ["default_int_handler"]
