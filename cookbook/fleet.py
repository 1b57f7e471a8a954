"""A fleet: many servers validated at once from one client machine, one combined answer.

A fleet file lists recipe + server URL (attach) or recipe + `launch: true` (start it here). Every entry runs as its
own `cookbook run` process into its own run folder, exactly as a single run would, so one entry's crash, hang or
dead server cannot take the others down; the fleet only schedules, watches and reads back what each run wrote.
How many run at once is bounded by what one client machine can drive (`CLIENT_MAX_STREAMS`, measured by
benchmarks/client_scale.py), so the client never becomes the bottleneck of the figures it reports.
"""
from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from .endpoint import Endpoint
from .errors import CookbookError, UsageError
from .pages import write_atomic
from .fleet_file import Fleet, FleetServer, entry_labels
from .recipes import Recipe, load_recipe
from .results import RunResults, check_output_path, now, read_results
from .run_folder import BatchSummary
from .secrets import strip_url_credentials

Say = Callable[[str], None]

# Streams one client machine drives with its timing error still small (benchmarks/client_scale.py, README "How far
# one client goes": at 256, p99 TTFT error 70 to 89 ms and a third of a core; at 2,000 a whole core and over a second
# of TTFT error): the fleet never has more runs in flight than fit under it.
CLIENT_MAX_STREAMS = 256
HEALTH_POLL_S = 2.0
HEALTH_WAIT_EVERY_S = 10.0
DOWN_AFTER_FAILED_POLLS = 2

EntryStatus = Literal["passed", "checks not met", "unreachable", "died mid-run", "failed", "interrupted"]


class FleetEntry(BaseModel):
    """How one entry of the fleet ended, read back from its run folder."""

    label: str
    recipe: str
    base_url: str | None = Field(None, description="The server, credentials stripped (None: launched here)")
    launched: bool = False
    status: EntryStatus
    why: str = Field("", description="One line: what went wrong, or the run's headline")
    exit_code: int | None = None
    seconds: float = 0.0
    down_after_s: float | None = Field(None, description="Seconds into the run when the server stopped answering /health")
    run_dir: str = Field("", description="The entry's run folder, relative to the fleet folder")
    log: str = Field("", description="The entry's `cookbook run` output, relative to the fleet folder")
    hardware: str = ""
    image: str = ""


class FleetSummary(BaseModel):
    started_at: str = ""
    finished_at: str = ""
    wall_s: float = 0.0
    concurrency: int = 1
    concurrency_note: str = ""
    entries: list[FleetEntry] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(e.status == "passed" for e in self.entries)


def streams_per_run(recipe: Recipe, params: dict[str, Any]) -> int:
    """The most streams one run keeps in flight: the bench's N-stream workload (the recipe's --max-num-seqs, or
    the CONCURRENCY parameter when given)."""
    given = params.get("CONCURRENCY")
    values = given if isinstance(given, list) else [given] if given else [recipe.max_num_seqs]
    return max(int(v) for v in values)


def fleet_concurrency(fleet: Fleet, max_streams: int = CLIENT_MAX_STREAMS) -> tuple[int, str]:
    """Runs in flight at once, and a sentence saying why: the fleet's own `concurrency`, capped so that the runs in
    flight never keep more streams open than one client drives."""
    widest = max(streams_per_run(load_recipe(s.recipe), fleet.params) for s in fleet.servers)
    fits = max(1, max_streams // widest)
    wanted = fleet.concurrency or len(fleet.servers)
    chosen = min(wanted, fits, len(fleet.servers))
    note = f"{chosen} run(s) at once: up to {widest} streams each, one client drives {max_streams}"
    if fleet.concurrency and chosen < fleet.concurrency:
        note += f" (the fleet file asked for {fleet.concurrency})"
    return chosen, note


class _HealthWatch:
    """Polls an attached server's /health while its run goes on and remembers when it stopped answering."""

    def __init__(self, base_url: str, model: str, poll_s: float = HEALTH_POLL_S) -> None:
        self.endpoint = Endpoint(base_url, model)
        self.poll_s = poll_s
        self.started = time.monotonic()
        self.down_after_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "_HealthWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.endpoint.close()

    def _watch(self) -> None:
        failed = 0
        while not self._stop.wait(self.poll_s):
            if self.endpoint.healthy(timeout_s=max(1.0, self.poll_s * 2), slow_retry_s=0):
                failed = 0
                continue
            failed += 1
            if failed >= DOWN_AFTER_FAILED_POLLS:
                self.down_after_s = round(time.monotonic() - self.started - self.poll_s * (failed - 1), 1)
                return


def run_command(server: FleetServer, run_dir: Path, fleet: Fleet) -> list[str]:
    """The `cookbook run` one entry executes: the same command a person would type for that server alone."""
    argv = [sys.executable, "-m", "cookbook", "run", server.recipe, "--out", str(run_dir)]
    argv += ["--base-url", server.base_url] if server.base_url else ["--launch"]
    if server.hardware:
        argv += ["--hardware", server.hardware]
    if fleet.notebooks:
        argv += ["--notebooks", ",".join(fleet.notebooks)]
    for key, value in fleet.params.items():
        argv += ["--param", f"{key}={json.dumps(value)}"]
    return argv


class FleetRunner:
    """Runs a fleet's entries as `cookbook run` processes, at most `concurrency` at once."""

    def __init__(self, fleet: Fleet, out: Path, say: Say = print, max_streams: int = CLIENT_MAX_STREAMS) -> None:
        self.fleet = fleet
        self.out = Path(out)
        self.say = say
        self.concurrency, self.concurrency_note = fleet_concurrency(fleet, max_streams)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def run(self) -> FleetSummary:
        check_output_path(self.out, "--out", folder=True)
        if self.out.exists() and any(self.out.iterdir()):
            raise UsageError(f"--out: {self.out} exists and is not an empty folder")
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        summary = FleetSummary(started_at=now(), concurrency=self.concurrency, concurrency_note=self.concurrency_note)
        started = time.monotonic()
        self.say(f"fleet: {len(self.fleet.servers)} server(s); {self.concurrency_note}")
        labels = entry_labels(self.fleet)
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="fleet")
        futures = [pool.submit(self._one, label, server) for label, server in zip(labels, self.fleet.servers)]
        try:
            summary.entries = [f.result() for f in futures]
        except KeyboardInterrupt:
            self._interrupt()
            pool.shutdown(wait=True, cancel_futures=True)
            summary.entries = [f.result() if f.done() and not f.cancelled() else _never_ran(label, server, "interrupted")
                               for f, label, server in zip(futures, labels, self.fleet.servers)]
            self._finish(summary, started)
            raise
        pool.shutdown(wait=True)
        self._finish(summary, started)
        return summary

    def _finish(self, summary: FleetSummary, started: float) -> None:
        summary.finished_at = now()
        summary.wall_s = round(time.monotonic() - started, 1)
        write_atomic(self.out / "fleet.json", summary.model_dump_json(indent=2) + "\n")
        write_fleet_index(self.out, summary)

    def _one(self, label: str, server: FleetServer) -> FleetEntry:
        if self._interrupted.is_set():
            return _never_ran(label, server, "interrupted")
        recipe = load_recipe(server.recipe)
        base = FleetEntry(label=label, recipe=recipe.id, base_url=strip_url_credentials(server.base_url or "") or None,
                          launched=server.launch, status="failed", run_dir=label, log=f"logs/{label}.log")
        if server.base_url and not self._reachable(label, server.base_url, recipe.served_model_name):
            waited = f" within {self.fleet.wait_for_health_s:.0f} s" if self.fleet.wait_for_health_s else ""
            self.say(f"fleet: {label}: unreachable ({base.base_url}/health does not answer 200{waited})")
            return base.model_copy(update={"status": "unreachable", "why": f"{base.base_url}/health does not answer 200{waited} before the run"})
        self.say(f"fleet: {label}: started ({base.base_url or 'launched here'})")
        started = time.monotonic()
        log_path = self.out / base.log
        with open(log_path, "wb") as log:
            argv = run_command(server, self.out / label, self.fleet)
            if server.base_url:
                with _HealthWatch(server.base_url, recipe.served_model_name) as watch:
                    code = self._wait(label, argv, log)
                down_after = watch.down_after_s
            else:
                code = self._wait(label, argv, log)
                down_after = None
        entry = _read_back(self.out, base, code, down_after, round(time.monotonic() - started, 1), log_path)
        self.say(f"fleet: {label}: {entry.status} in {entry.seconds:.0f} s" + (f" ({entry.why})" if entry.why else ""))
        return entry

    def _reachable(self, label: str, base_url: str, model: str) -> bool:
        """/health answers 200, at once or within the fleet's `wait_for_health_s` (polled every few seconds)."""
        deadline = time.monotonic() + self.fleet.wait_for_health_s
        probe = Endpoint(base_url, model)
        try:
            while not self._interrupted.is_set():
                if probe.healthy(timeout_s=10.0, slow_retry_s=0):
                    return True
                if time.monotonic() >= deadline:
                    return False
                self.say(f"fleet: {label}: waiting for {strip_url_credentials(base_url)}/health")
                self._interrupted.wait(min(HEALTH_WAIT_EVERY_S, max(0.0, deadline - time.monotonic())))
            return False
        finally:
            probe.close()

    def _wait(self, label: str, argv: list[str], log: Any) -> int:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        with self._lock:
            self._procs[label] = proc
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._procs.pop(label, None)

    def _interrupt(self) -> None:
        """Ctrl-C: every run in flight gets SIGINT (it stops its own server and writes what it has), then SIGKILL."""
        self._interrupted.set()
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            _signal_group(proc, signal.SIGINT)
        deadline = time.monotonic() + 30
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _never_ran(label: str, server: FleetServer, status: EntryStatus) -> FleetEntry:
    return FleetEntry(label=label, recipe=server.recipe, base_url=strip_url_credentials(server.base_url or "") or None,
                      launched=server.launch, status=status, why="the fleet run was interrupted before this entry ran")


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def _read_back(out: Path, base: FleetEntry, code: int, down_after: float | None, seconds: float, log: Path) -> FleetEntry:
    """What the entry's run folder says, judged: a server that stopped answering is 'died mid-run' whatever the
    checks say after it; an exit with no summary is 'failed' with the log's last error line."""
    update: dict[str, Any] = {"exit_code": code, "seconds": seconds, "down_after_s": down_after}
    run_dir = out / base.label
    summary_path = run_dir / "summary.json"
    summary = BatchSummary.model_validate_json(summary_path.read_text()) if summary_path.is_file() else None
    results = _results(run_dir, summary)
    if results is not None:
        update["hardware"] = results.hardware.description
        update["image"] = results.image
    if down_after is not None or (results is not None and "server down" in results.stopped):
        when = f"{down_after:.0f} s into the run" if down_after is not None else results.stopped  # type: ignore[union-attr]
        update.update(status="died mid-run", why=f"the server stopped answering /health {when}")
    elif code == 130:
        update.update(status="interrupted", why="interrupted")
    elif summary is None:
        update.update(status="failed", why=_last_line(log) or f"`cookbook run` exited {code} without a summary")
    elif summary.checks_not_met or not summary.ok:
        update.update(status="checks not met", why=summary.headline)
    elif code != 0:
        update.update(status="failed", why=_last_line(log) or f"`cookbook run` exited {code}")
    else:
        update.update(status="passed", why=summary.headline)
    return base.model_copy(update=update)


def _results(run_dir: Path, summary: BatchSummary | None) -> RunResults | None:
    path = run_dir / (summary.results if summary and summary.results else "results.json")
    if not path.is_file():
        return None
    try:
        return read_results(path)
    except CookbookError:
        return None


def run_fleet(fleet: Fleet, out: Path, say: Say = print, max_streams: int = CLIENT_MAX_STREAMS) -> FleetSummary:
    """Validate every server of the fleet at once (bounded), each into out/<label>/, then out/index.html."""
    return FleetRunner(fleet, out, say, max_streams).run()


# ---------------------------------------------------------------------------------------------------------------
# The combined index

_STATUS_CLASS = {"pass": "ok", "known limitation": "ok", "skipped": "muted", "not run": "muted", "inconclusive": "muted"}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 90em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } .ok { color: #1b5e20; } .failed { color: #b00020; font-weight: bold; } .muted { color: #777; }
"""


def _side_by_side(runs: dict[str, RunResults | None],
                  cells_of: Callable[[RunResults], list[tuple[str, Any]]]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Row keys in first-seen order across the entries, and per entry label: key -> cell (the Verified matrix:
    check name -> (status, result); Performance: row label -> result)."""
    keys: list[str] = []
    table: dict[str, dict[str, Any]] = {}
    for label, results in runs.items():
        table[label] = dict(cells_of(results)) if results else {}
        keys += [key for key in table[label] if key not in keys]
    return keys, table


def write_fleet_index(out: Path, summary: FleetSummary) -> Path:
    """out/index.html: each entry's server, image and outcome; recipes by checks; Performance side by side."""
    esc = html.escape
    entries = summary.entries
    good = sum(e.status == "passed" for e in entries)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>cookbook fleet run</title>",
             f"<style>{_STYLE}</style></head><body><h1>Fleet run</h1>",
             f"<p class='{'ok' if summary.ok else 'failed'}'>{good} of {len(entries)} servers passed; "
             f"{esc(summary.concurrency_note)}; {summary.wall_s:.0f} s wall time, started {esc(summary.started_at)}.</p>"]
    rows = "".join(
        f"<tr><td><a href='{esc(e.run_dir)}/index.html'>{esc(e.label)}</a></td><td>{esc(e.recipe)}</td>"
        f"<td><code>{esc(e.base_url or 'launched here')}</code></td><td>{esc(e.hardware)}</td><td>{esc(e.image)}</td>"
        f"<td class='{'ok' if e.status == 'passed' else 'failed'}'>{esc(e.status)}</td><td>{esc(e.why)}</td>"
        f"<td>{e.seconds:.0f} s</td><td><a href='{esc(e.log)}'>log</a></td></tr>" for e in entries)
    parts.append("<h2>Servers</h2><table><thead><tr><th>Entry</th><th>Recipe</th><th>Server</th><th>Hardware</th>"
                 f"<th>Image</th><th>Outcome</th><th>Why</th><th>Time</th><th>Log</th></tr></thead><tbody>{rows}</tbody></table>")
    runs = {e.label: _results(out / e.label, None) for e in entries}  # each run folder read once
    names, cells = _side_by_side(runs, lambda r: [(c.name, (c.status, c.result)) for c in r.checks])
    if names:
        head = "".join(f"<th>{esc(e.label)}</th>" for e in entries)
        body = []
        for name in names:
            tds = []
            for e in entries:
                status, result = cells[e.label].get(name, ("", ""))
                css = _STATUS_CLASS.get(status, "failed") if status else "muted"
                tds.append(f"<td class='{css}'>{esc(status or '-')}" + (f"<br><small>{esc(result)}</small>" if result else "") + "</td>")
            body.append(f"<tr><th>{esc(name)}</th>{''.join(tds)}</tr>")
        parts.append(f"<h2>Verified</h2><table><thead><tr><th>Check</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    figures, perf = _side_by_side(runs, lambda r: [(f.label, f.result) for f in r.performance])
    if figures:
        head = "".join(f"<th>{esc(e.label)}<br><small>{esc(e.hardware)}</small></th>" for e in entries)
        rows = "".join(f"<tr><th>{esc(f)}</th>" + "".join(f"<td>{esc(perf[e.label].get(f, '-'))}</td>" for e in entries) + "</tr>"
                       for f in figures)
        parts.append("<h2>Performance</h2><p>Each column was measured on the hardware its heading names.</p>"
                     f"<table><thead><tr><th>Test</th>{head}</tr></thead><tbody>{rows}</tbody></table>")
    parts.append("</body></html>\n")
    return write_atomic(out / "index.html", "\n".join(parts))
