"""Ctrl-C for the test session and every child it starts, however the session itself was started.

A non-interactive shell starts a background command (`cmd &`: scripts/test-lanes.sh its lanes 2..N, a CI script or
a nohup'd loop its test run) with SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across exec. A
Python child of such a run never raises KeyboardInterrupt, so a test that sends a child Ctrl-C (the guard's child
runs, `cookbook serve` starting up, the registry's launchers) proved nothing and waited out its deadline. The
session puts both back as an interactive shell does for a foreground command, once, before it starts any child
(tests/conftest.py); the children inherit that.
"""
from __future__ import annotations

import signal


def take_ctrl_c_back() -> None:
    """SIGINT raises KeyboardInterrupt and SIGQUIT is at its default in this process, hence in every child it execs
    from now on. Only an inherited SIG_IGN is replaced: a handler somebody installed stays."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
