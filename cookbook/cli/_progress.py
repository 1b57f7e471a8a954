"""The CLI's rendering of `cookbook.progress` events: tqdm on a terminal's stderr, plain lines anywhere else.

On a terminal each task is one tqdm line: a bar when its total is known, a counter with the elapsed time when not,
the current step or the last log line as its postfix; a thread refreshes it every second, so the elapsed time
moves while a step waits. When stderr is not a terminal (a log, CI, a pipe) events are `LineRenderer` lines: one
per change, at most one per 5 s while only the time moves. stdout stays for the command's own output.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import IO, Any

from tqdm import tqdm

from ..progress import Event, LineRenderer, Progress

REFRESH_S = 1.0


class TqdmRenderer:
    """One tqdm bar per running task, closed when its task finishes."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._bars: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._refresh, daemon=True).start()

    def __call__(self, event: Event) -> None:
        with self._lock:
            bar = self._bars.get(event.task)
            if bar is None:
                counter = "{desc}: {n_fmt} step(s) done [{elapsed}]{postfix}"  # no total: how many, for how long
                bar = tqdm(total=event.total, desc=event.task, file=self.stream, leave=True, dynamic_ncols=True,
                           bar_format=None if event.total else counter if event.done is not None else "{desc} [{elapsed}]{postfix}")
                self._bars[event.task] = bar
            if event.total is not None and bar.total != event.total:
                bar.total = event.total
            if event.done is not None and event.done != bar.n:
                bar.n = event.done
            bar.set_postfix_str(event.detail[:120], refresh=False)
            bar.refresh()
            if event.finished:
                bar.close()
                del self._bars[event.task]

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                for bar in self._bars.values():
                    bar.refresh()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()


def cli_progress(stream: IO[str] | None = None) -> Progress:
    """The progress renderer for a command: tqdm when `stream` (default stderr) is a terminal, else plain lines."""
    stream = stream or sys.stderr
    if stream.isatty() and _columns(stream) != 0:  # a terminal of no width (a bare pty) would show nothing
        return TqdmRenderer(stream)
    return LineRenderer(lambda line: print(line, file=stream, flush=True))


def _columns(stream: IO[str]) -> int | None:
    """The terminal's width, None when the stream has no file descriptor to ask (io.UnsupportedOperation)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return None
