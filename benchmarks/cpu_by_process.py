"""Where the CPU goes while a command runs: every process's CPU seconds (the whole machine's,
not only the command's), read from /proc once a second, summed by
what the process is (a vLLM server's API server, engine core and worker, lm-eval, a notebook kernel, Chromium, the
reproducers, pytest itself, ...) and, for the vLLM servers, by server.

    scripts/in-env.sh python benchmarks/cpu_by_process.py -- make test
    scripts/in-env.sh python benchmarks/cpu_by_process.py --json runs/cpu.json -- scripts/test-lanes.sh 2 -m integration

The suite's lanes keep both cores busy (docs/testing.md), so its wall time is its CPU work over the cores: this says
which work that is. Wall time per test (benchmarks/suite_time.py) cannot, since a server's start-up and the tests of
another lane run at the same time. A process that lives less than a second between two reads is missed: the table's
last line says how much CPU the machine spent that no read saw.

A vLLM server is named by its `--port` and `--served-model-name`. With COOKBOOK_TEST_TIMES set it takes the registry's
server name, but only from a registry record already written: tests/servers.py writes a server's record (its port
included) when the server stops, so a server still running when it is first read keeps its port name."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
# (what the process is, a regular expression its command line matches), the first match wins
SPAWNED = "vllm (spawned, before its title: importing)"
KINDS: list[tuple[str, str]] = [
    ("vllm engine core", r"^VLLM::EngineCore"),
    ("vllm worker", r"^VLLM::Worker"),
    ("vllm api server", r"\bvllm serve\b|/bin/vllm serve"),
    (SPAWNED, r"multiprocessing[.](spawn|forkserver)"),
    # Before the catch-all "vllm" below: these run an image's interpreter, whose path names vLLM too.
    ("reproducers (simulated image)", r"_repro_zygote|repro_v0_26_0|gaudi_sim|vllm-gaudi-[^/ ]*-sim/"),
    ("transformers reference (fp32)", r"_reference_forward|_prepare_model"),
    ("lm-eval", r"-m lm_eval\b"),
    ("the CPU image's python (fix step, image probe, vllm CLI)", r"vllm"),
    ("notebook kernel", r"ipykernel_launcher|ipykernel"),
    ("chromium", r"chrom"),
    ("server launcher (tests/_serve.py, cookbook serve)", r"tests/_serve\.py|-m cookbook serve|cookbook serve"),
    ("mypy, ruff", r"\bmypy\b|\bruff\b"),
    ("pytest", r"pytest"),
    ("papermill, cookbook command", r"papermill|cookbook"),
    ("other python", r"python"),
]


@dataclass
class Proc:
    pid: int
    sid: int
    kind: str
    server: str | None
    cpu_s: float = 0.0


@dataclass
class Tally:
    by_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_server: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    seen: dict[tuple[int, float], Proc] = field(default_factory=dict)  # (pid, start time) -> process
    machine_s: float = 0.0
    wall_s: float = 0.0


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(session id, start time in ticks, CPU seconds so far) of a live process, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[3]), float(fields[19]), (int(fields[11]) + int(fields[12])) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _kind(cmdline: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    return "other"


RETITLED = {SPAWNED, "other python", "other"}


def _machine_busy_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields[:8]]
    return (sum(values) - values[3] - values[4]) / TICK


def server_label(cmdline: str, names_by_port: dict[str, str]) -> str | None:
    """The server a vLLM API server's command line serves: the registry's name for its port, else port and model."""
    port = re.search(r"--port[ =](\d+)", cmdline)
    model = re.search(r"--served-model-name[ =](\S+)", cmdline)
    if port is None:
        return None
    if port.group(1) in names_by_port:
        return names_by_port[port.group(1)]
    return f":{port.group(1)} {model.group(1) if model else ''}".strip()


def _registry_ports(times: Path | None) -> dict[str, str]:
    """port -> registry server name, from the suite's time log (tests/servers.py notes each server's port)."""
    ports: dict[str, str] = {}
    if times is None or not times.is_file():
        return ports
    for line in times.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "server" in record and "port" in record:
            ports[str(record["port"])] = record["server"]
    return ports


def sample(tally: Tally, sessions: dict[int, str], times: Path | None, first: bool = False) -> None:
    """One read of every process: the CPU each spent since the last read, added to its kind and server (`first`:
    only note the processes already running, so that what they spent before the command started is not counted)."""
    ports = _registry_ports(times)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None:
            continue
        sid, started, cpu = stat
        key = (pid, started)
        proc = tally.seen.get(key)
        if proc is None:
            cmdline = _cmdline(pid)
            kind = _kind(cmdline)
            server = server_label(cmdline, ports) if kind == "vllm api server" else None
            if server is not None:
                sessions[sid] = server
            proc = tally.seen[key] = Proc(pid, sid, kind, server)
        elif proc.kind in RETITLED:  # a spawned process sets its title once it has imported
            proc.kind = _kind(_cmdline(pid))
        elif proc.kind == "vllm api server" and proc.server and proc.server.startswith(":"):
            proc.server = server_label(_cmdline(pid), ports) or proc.server  # the log names it once it is ready
            sessions[sid] = proc.server
        delta = cpu - proc.cpu_s
        proc.cpu_s = cpu
        if first or delta <= 0:
            continue
        tally.by_kind[proc.kind] += delta
        server = proc.server or sessions.get(proc.sid)
        if server is not None and (proc.kind.startswith("vllm") or proc.sid in sessions):
            tally.by_server[server][proc.kind] += delta


def report(tally: Tally) -> str:
    seen = sum(tally.by_kind.values())
    lines = [f"wall {tally.wall_s:.0f} s; the machine's busy CPU {tally.machine_s:.0f} s "
             f"({tally.machine_s / max(tally.wall_s, 1e-9) / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores)", "",
             f"{'what':<52} {'CPU s':>8} {'share':>6}"]
    for kind, cpu in sorted(tally.by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"{kind:<52} {cpu:>8.0f} {cpu / max(tally.machine_s, 1e-9):>6.0%}")
    lines.append(f"{'(not seen: processes shorter than a read, the kernel)':<52} {max(tally.machine_s - seen, 0):>8.0f}")
    if tally.by_server:
        columns = [("api", "vllm api server"), ("spawned", SPAWNED), ("engine", "vllm engine core"),
                   ("worker", "vllm worker")]
        lines += ["", f"{'vLLM server (CPU s)':<28} " + " ".join(f"{label:>8}" for label, _ in columns) + f" {'all':>8}"]
        for server, kinds in sorted(tally.by_server.items(), key=lambda kv: -sum(kv[1].values())):
            lines.append(f"{server[:28]:<28} " + " ".join(f"{kinds.get(kind, 0):>8.0f}" for _, kind in columns)
                         + f" {sum(kinds.values()):>8.0f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between reads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the tallies here")
    parser.add_argument("command", nargs="+", help="after --: the command to run and measure")
    args = parser.parse_args()
    if args.every <= 0:
        parser.error("--every: must be a positive number of seconds")
    times = Path(os.environ["COOKBOOK_TEST_TIMES"]) if os.environ.get("COOKBOOK_TEST_TIMES") else None
    tally, sessions = Tally(), {}
    sample(tally, sessions, times, first=True)
    busy0, started = _machine_busy_s(), time.monotonic()
    try:
        child = subprocess.Popen(args.command)
    except OSError as exc:
        parser.error(f"command: {exc}")
    try:
        while child.poll() is None:
            sample(tally, sessions, times)
            time.sleep(args.every)
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        child.wait()
    sample(tally, sessions, times)
    tally.machine_s, tally.wall_s = _machine_busy_s() - busy0, time.monotonic() - started
    print(report(tally))
    if args.json:
        args.json.write_text(json.dumps({"wall_s": tally.wall_s, "machine_s": tally.machine_s,
                                         "by_kind": tally.by_kind, "by_server": tally.by_server}, indent=1))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
