"""The test session's guard (tests/servers.py): stops every server session it still holds when pytest goes away.

Run as `python _reaper.py PID`, in a session of its own, reading `add SID` / `del SID` lines on stdin. Its stdin
closes when pytest exits in any way (its teardown, a timeout's os._exit, SIGKILL): then every session still held
gets SIGTERM, and SIGKILL after a grace. Standard library only: it must outlive a broken test environment."""
from __future__ import annotations

import os
import signal
import sys
import time

GRACE_S = 20.0


def _alive(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _signal(sid: int, sig: signal.Signals) -> None:
    for pid in _alive(sid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def main() -> int:
    held: set[int] = set()
    for line in sys.stdin:
        verb, _, sid = line.partition(" ")
        if verb == "add":
            held.add(int(sid))
        elif verb == "del":
            held.discard(int(sid))
    left = [sid for sid in held if _alive(sid)]
    if not left:
        return 0
    print(f"test guard: pytest {sys.argv[1]} ended with {len(left)} server session(s) running: stopping {left}",
          file=sys.stderr)
    for sid in left:
        _signal(sid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_alive(sid) for sid in left):
        time.sleep(0.2)
    for sid in left:
        _signal(sid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
