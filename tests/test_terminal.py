"""tests/terminal.py: a session started in the background takes Ctrl-C back, and so do the children it starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A child's view of SIGINT, as this process sees it in a grandchild: what a test's Ctrl-C would meet
SHOW_CHILD_SIGINT = """
import subprocess, sys
sys.path.insert(0, {tests!r})
if {take_back}:
    from terminal import take_ctrl_c_back
    take_ctrl_c_back()
show = "import signal; h = signal.getsignal(signal.SIGINT); print('ignored' if h == signal.SIG_IGN else h.__name__)"
subprocess.run([sys.executable, "-c", show], check=True)
"""


def _child_sigint_of_a_background_session(take_back: bool) -> str:
    """A session run as a non-interactive shell runs a background command (SIGINT and SIGQUIT ignored): its child's SIGINT."""
    code = SHOW_CHILD_SIGINT.format(tests=str(Path(__file__).resolve().parent), take_back=take_back)
    return subprocess.run(["bash", "-c", '"$0" -c "$1" & wait', sys.executable, code], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def test_a_background_session_passes_sigint_ignored_to_its_children() -> None:
    assert _child_sigint_of_a_background_session(take_back=False) == "ignored"  # the trap this module exists for


def test_a_session_that_takes_ctrl_c_back_gives_it_to_its_children() -> None:
    assert _child_sigint_of_a_background_session(take_back=True) == "default_int_handler"
