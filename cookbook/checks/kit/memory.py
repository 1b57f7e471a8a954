"""The server's memory while a probe's request runs: its process tree's RSS from /proc when it listens on this
machine, else the API server's own `process_resident_memory_bytes` from /metrics."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from pydantic import BaseModel, Field

from ...endpoint import Endpoint, metric_value
from ...errors import CookbookError


class MemorySample(BaseModel):
    source: str = Field(description="'process tree RSS from /proc' (local server) or '/metrics process_resident_memory_bytes'")
    before_mib: float | None
    peak_mib: float | None
    after_mib: float | None
    samples: int


def _listening_inode(port: int) -> str | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return fields[9]
    return None


def server_pids(base_url: str) -> list[int]:
    """The processes of the session serving `base_url` when it listens on this machine (else [])."""
    from urllib.parse import urlparse

    from ...launch import session_pids

    parsed = urlparse(base_url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
        return []
    inode = _listening_inode(parsed.port)
    if inode is None:
        return []
    target = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if fd.readlink().as_posix() == target:
                    if int(entry.name) == os.getpid():  # a proxy in this process: its memory is not the server's
                        return []
                    stat = (entry / "stat").read_text()
                    sid = int(stat[stat.rfind(")") + 2 :].split()[3])
                    return session_pids(sid)
        except OSError:
            continue
    return []


def rss_bytes(pids: list[int]) -> int | None:
    total, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
        except OSError:
            continue
    return total if seen else None


class MemoryWatch:
    """Samples the server's memory every `interval_s` on a thread while a request runs."""

    def __init__(self, endpoint: Endpoint, interval_s: float = 0.25) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.pids = server_pids(endpoint.base_url)
        self.source = "process tree RSS from /proc" if self.pids else "/metrics process_resident_memory_bytes (API server process only)"
        self.values: list[int] = []
        self.before: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> int | None:
        if self.pids:
            return rss_bytes(self.pids)
        try:
            value = metric_value(self.endpoint.metrics(), "process_resident_memory_bytes")
        except CookbookError:
            return None
        return int(value) if value is not None else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self.read()
            if value is not None:
                self.values.append(value)

    def __enter__(self) -> "MemoryWatch":
        self.before = self.read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> MemorySample:
        after = self.read()
        peak = max(self.values + [v for v in (self.before, after) if v is not None], default=None)
        return MemorySample(source=self.source, before_mib=_mib(self.before), peak_mib=_mib(peak), after_mib=_mib(after),
                            samples=len(self.values))


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)
