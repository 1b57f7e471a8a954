"""Whether a process a test started is still running, for the tests that prove nothing was left behind."""
from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and has not exited: a zombie (exited, not yet reaped) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
