"""The flock that keeps two runs on the same packages (two containers sharing a volume) from interleaving."""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from .base import EXIT_IO, FixError


class Lock:
    """An flock next to the ledger, so two containers sharing a volume cannot interleave.

    Where the lock file cannot be created (a read-only image), runs that need no write still work; one that needs
    to write then stops with the read-only error before touching anything."""

    def __init__(self, state: Path, timeout: float, exclusive: bool = True) -> None:
        self.path = state / "lock"
        self.timeout = timeout
        self.exclusive = exclusive
        self.fd: int | None = None

    def _open(self) -> int | None:
        if self.exclusive:
            try:
                self.path.parent.mkdir(exist_ok=True)
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                pass
        try:
            return os.open(self.path, os.O_RDONLY)  # flock works on a read-only descriptor too
        except OSError:
            return None

    def __enter__(self) -> "Lock":
        self.fd = self._open()
        if self.fd is None:
            return self
        op = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fcntl.flock(self.fd, op | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise FixError(EXIT_IO, f"another apply_all.py run holds {self.path}; "
                                            f"gave up after {self.timeout:g} s (--lock-timeout)") from None
                if not told:
                    print(f"apply_all: waiting for {self.path} (another run holds it)", file=sys.stderr)
                    told = True
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
