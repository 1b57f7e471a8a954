"""Progress: the one callback long work reports through, and a child process that reports its output through it.

A producer (server start-up, image and model set-up, the checks, the benchmarks, the batch) calls a `Progress`
with an `Event`; the CLI renders events with tqdm on stderr (`cookbook.cli._progress`), the notebooks with an
ipywidgets bar (`cookbook.ui`), a log or a test with `LineRenderer` or a list's `append`. Log lines that are not
progress (the command run, the ready line) stay plain `say(str)` calls. Standard library only: every layer may
import it.

    task = Task(progress, "checks", total=len(specs))
    for spec in specs:
        task.step(spec.name)        # Event(task="checks", detail=name, done=i, total=N, elapsed_s=...)
    task.finish()
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

# How often a waiting producer reports though nothing changed, so that elapsed time keeps moving.
HEARTBEAT_S = 1.0
# How long a child process's session gets between SIGTERM and SIGKILL when its work is interrupted.
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Event:
    """Where one task stands: its name, what it is doing now, how far along (when known), for how long."""

    task: str
    detail: str = ""
    done: int | None = None
    total: int | None = None
    elapsed_s: float = 0.0
    finished: bool = False

    def line(self) -> str:
        """One plain line: `task [done/total] detail (12 s)`, `... done` at the end."""
        count = f" [{self.done}/{self.total}]" if self.done is not None and self.total else (
            f" [{self.done}]" if self.done is not None else "")
        detail = f" {self.detail}" if self.detail else ""
        end = ", done" if self.finished else ""
        return f"{self.task}{count}{detail} ({self.elapsed_s:.0f} s{end})"

    def __str__(self) -> str:  # so that `print` is a Progress too
        return self.line()


Progress = Callable[[Event], None]


def silent(_event: Event) -> None:
    """A Progress that shows nothing."""


class Task:
    """One task's events: stamps the elapsed time and counts the steps, so a producer only names them."""

    def __init__(self, progress: Progress | None, name: str, total: int | None = None) -> None:
        self.progress = progress or silent
        self.name = name
        self.total = total
        self.done = 0
        self.begun = 0  # steps begun with `step`; `update` only changes the detail
        self.detail = ""
        self.started = time.monotonic()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def _emit(self, finished: bool = False) -> None:
        counted = self.total is not None or self.begun > 0
        self.progress(Event(self.name, self.detail, self.done if counted else None, self.total,
                            round(self.elapsed_s, 1), finished))

    def step(self, detail: str) -> None:
        """A step begins: `done` counts the steps begun before it."""
        if self.begun:
            self.done += 1
        self.begun += 1
        self.detail = detail
        self._emit()

    def update(self, detail: str | None = None) -> None:
        """Same step, new detail (a log line) or only the time moving on."""
        if detail is not None:
            self.detail = detail
        self._emit()

    def finish(self, detail: str | None = None) -> None:
        self.done = self.total if self.total is not None else self.begun
        if detail is not None:
            self.detail = detail
        self._emit(finished=True)


class LineRenderer:
    """Events as plain lines (a log, CI, a pipe), few enough to read: a line when a task starts, a step begins or
    the task ends, the step's first detail (a child's first output line), then at most one line per `every_s`
    while only the detail (the last log line) or the time moves on."""

    def __init__(self, write: Callable[[str], None] | None = None, every_s: float = 5.0) -> None:
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every_s = every_s
        self._last: dict[str, tuple[int | None, int, float]] = {}  # task: done, lines at that step, when

    def __call__(self, event: Event) -> None:
        now = time.monotonic()
        done, lines, when = self._last.get(event.task, (None, 0, -float("inf")))
        if event.task not in self._last or event.done != done:
            lines = 0
        if event.finished or lines < 2 or now - when >= self.every_s:
            self.write(event.line())
            self._last[event.task] = (event.done, lines + 1, now)
        if event.finished:
            self._last.pop(event.task, None)


# ----------------------------------------------------------------------------------------------------------------
# Child processes


def session_pids(sid: int) -> list[int]:
    """Every live process in session `sid` (a child started in a session of its own and all it spawned)."""
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        # fields[0] is the state, [3] the session id; zombies are already gone for our purposes.
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def signal_session(sid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(sid, sig)
    except ProcessLookupError:
        pass
    for pid in session_pids(sid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_session(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> bool:
    """SIGTERM the child's whole session, SIGKILL what is left after `grace_s`; True when SIGKILL was needed."""
    sid = proc.pid
    signal_session(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and session_pids(sid):
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    killed = bool(session_pids(sid))
    signal_session(sid, signal.SIGKILL)
    end = time.monotonic() + 5
    while session_pids(sid) and time.monotonic() < end:
        time.sleep(0.05)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return killed


def end_by_eof(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """End a child that serves jobs read from its stdin: close the stdin (its loop ends), wait `grace_s`, then kill."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_reporting(
    argv: list[str],
    task: Task,
    log: IO[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    clean: Callable[[str], str] = lambda line: line,
) -> tuple[int, list[str]]:
    """Run a child in a session of its own, each output line (stdout and stderr, `clean`ed) to `log` and as the
    task's detail, the elapsed time at least every HEARTBEAT_S. Returns the exit code and the output's lines.

    On any interruption (Ctrl-C's KeyboardInterrupt included) the child's whole session is stopped before the
    exception goes on: nothing the child spawned outlives the caller's wait."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            lines.put(clean(raw.decode(errors="replace")))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    output: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                task.update()
                continue
            if line is None:
                break
            output.append(line.rstrip("\n"))
            if log is not None:
                log.write(line)
                log.flush()
            redrawn = [part.strip() for part in line.split("\r") if part.strip()]  # a bar drawn again with \r
            if redrawn:
                task.update(redrawn[-1][:200])  # its last state
        code = proc.wait()
    except BaseException:
        kill_session(proc)
        raise
    finally:
        reader.join(timeout=5)
    return code, output
