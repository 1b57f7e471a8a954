"""A child started as a terminal starts a command, for the tests that send it Ctrl-C.

A non-interactive shell starts a background command (`cmd &`: scripts/test-lanes.sh its lanes 2..N, a CI script or
a nohup'd loop its test run) with SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across exec. A
Python child of such a run never raises KeyboardInterrupt: a test that sends it Ctrl-C proves nothing and waits out
its deadline. So these children start through a one-line `exec` that puts both signals back to their default first,
as an interactive shell does for a foreground command (Popen's `preexec_fn` could do it too, but is unsafe in a
process with threads, which the test session has).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

_RESET_THEN_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                    "signal.signal(signal.SIGQUIT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])")


def from_a_terminal(argv: Sequence[str]) -> list[str]:
    """`argv`, run with SIGINT and SIGQUIT at their default whatever this process inherited."""
    return [sys.executable, "-I", "-S", "-c", _RESET_THEN_EXEC, *argv]
