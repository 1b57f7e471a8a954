"""The test session's real vLLM servers: one registry, by recipe and flags, for every test that needs a server.

Each server is declared once here (`SPECS`), started at most once per test session, ahead of the tests that need it
(in the background while earlier tests run, at most `AHEAD` starts at a time), and stopped, with nothing of its
process tree left behind, when the last test that needs it is done. A guard process (`_reaper.py`) holds the list of
running server sessions and stops them if pytest dies without its teardown (a timeout's `os._exit`, a SIGKILL).

Set a spec's `attach_var` (COOKBOOK_TEST_BASE_URL for SmolLM2, ...) to attach to a server already running with the
same settings instead of starting one: handy while developing, never used by CI.

COOKBOOK_TEST_TIMES=FILE appends one JSON line per server (start requested, ready, stopped, who waited) and per test
(benchmarks/suite_time.py reads them)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cookbook.endpoint import Endpoint
from cookbook.haystack import prime_prefill_pace
from cookbook.image import cpu_flags
from cookbook.launch import attach, free_port, launch_flags, session_pids
from cookbook.recipes import REPO_ROOT, Recipe, load_recipe

CPU_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
HYBRID_RECIPE = "cookbook/tiny-qwen3-next"
GEMMA_RECIPE = "cookbook/tiny-gemma3"
TESTS = Path(__file__).resolve().parent
BATCH_DEFECT_PLUGIN = TESTS / "defects" / "batch_logit_shift"
BATCH_DEFECT_DELTA = "3.0"  # nats: past the reference tie margin even as calibrated (bf16 flip noise 0.62, allowed ~0.94)
LONG_CONTEXT = 16384  # twice SmolLM2's 8,192 positions

PACE_TOKENS = 32
PACE_TTL_S = 60.0  # a pace older than this is measured again
# Seconds per token of `measure_pace` on this project's 2-vCPU machine, quiet (2026-12-02), by served model name: the
# pace a deadline written for a quiet machine assumes (another model: the fastest figure, so its slack is not low).
QUIET_PACE_S_PER_TOKEN = {CPU_RECIPE: 0.02, HYBRID_RECIPE: 0.02, GEMMA_RECIPE: 0.02}
SESSION_SERVERS = {"smol", "hybrid"}  # shared by the whole session; every other server is one module's own
AHEAD = 1  # background starts at a time: a start is three processes importing vLLM, mostly one core each
MAX_ALIVE = 4  # servers up at once, at most, counting the ones starting
# A test server runs vLLM's engine and its model in one process: the engine core steps the model itself, one OpenMP
# thread, on whichever core is free. vLLM's CPU launch runs the model in a worker process of its own, which costs a
# third process's imports at every start and an engine core that spins on `sched_yield` through every step; neither
# is anything a test asserts. Measured on the 2-vCPU Xeon (benchmarks/engine_layout.py, docs/testing.md): the same
# tokens and logprobs to the last bit, a start about 9 s shorter, and the whole suite's busy CPU 1,991 s -> 1,481 s.
# The recipes' own launches keep vLLM's layout, and so do the servers a spec marks `as_launched`.
ONE_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
# vLLM's CPU worker binds its OpenMP threads to one core, the same core for every server ("auto" takes core 0 on
# this 2-vCPU machine): a server starting ahead then computes on the core the tests' server is serving on. Each
# `as_launched` test server is given a core of its own choosing (the least taken, else not the last used server's)
# through this variable, unless the environment or its spec already sets it. (vLLM reads it in the worker process
# only: a one-process engine is not bound.)
BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
AHEAD_MIN_FREE_GIB = 7.0  # a start ahead waits for this much available memory (a SmolLM2 server holds ~4.7 GB with
#                           its 2 GiB KV pool, and vLLM refuses a pool the node cannot hold); a start a test waits for
#                           never waits for memory


@dataclass(frozen=True)
class Spec:
    """One distinct server: a recipe, what differs from the recipe's own launch for this test server, and why."""

    name: str
    recipe_id: str
    env: dict[str, str] = field(default_factory=dict)  # added to the recipe's environment
    flags: Callable[[Recipe], dict[str, Any]] = lambda _recipe: {}  # extra `vllm serve` flags
    attach_var: str | None = None
    via_cli: bool = False  # started by `cookbook serve` in the foreground, as a user does (its Ctrl-C test stops it)
    as_launched: bool = False  # vLLM's own process layout and binding, as the recipe's launch runs it; else the
    #                            engine and its model in one process (ONE_PROCESS_ENGINE)
    why: str = ""
    cpu_any: tuple[str, ...] = ()  # it starts only on a CPU with one of these /proc/cpuinfo flags (vLLM refuses else)
    cpu_refusal: str = ""  # what vLLM says on a CPU without them

    def unavailable(self, cpuinfo: str | None = None) -> str | None:
        """Why this server cannot start on this host, or None. Unknown flags: tried (the start then says why)."""
        flags = cpu_flags(cpuinfo)
        if not self.cpu_any or not flags or any(f in flags for f in self.cpu_any):
            return None
        return (f"{self.name}: this CPU has none of {', '.join(self.cpu_any)}, and vllm-cpu refuses the server on it "
                f"({self.cpu_refusal!r})")

    def server_env(self) -> dict[str, str]:
        """What this test server's launch adds to the recipe's environment: `env`, and the one-process engine unless
        the server runs as the recipe launches."""
        return dict(self.env) if self.as_launched else {**ONE_PROCESS_ENGINE, **self.env}

    def recipe(self) -> Recipe:
        """The recipe this server serves (its environment changed as `env` says)."""
        recipe = load_recipe(self.recipe_id)
        if self.env:
            recipe = recipe.model_copy(update={"environment": {**recipe.environment, **self.env}})
        return recipe


# The deliberate batch-only defect (tests/defects/batch_logit_shift, a vLLM general plugin on the server's PYTHONPATH).
BATCH_DEFECT_ENV = {"PYTHONPATH": str(BATCH_DEFECT_PLUGIN), "VLLM_PLUGINS": "cookbook_batch_logit_shift_defect",
                    "COOKBOOK_DEFECT_BATCH_LOGIT_DELTA": BATCH_DEFECT_DELTA}

# The numerics oracle's real defects (tests/test_reference_integration.py): extra flags on the SmolLM2 recipe.
ORACLE_DEFECT_FLAGS: dict[str, dict[str, Any]] = {
    # The RoPE base overridden ten times smaller than the checkpoint's 100,000 (transformers 5 keeps it under
    # rope_parameters; a flat rope_theta override is ignored by vLLM 0.32's rotary embedding).
    "rope-theta": {"hf-overrides": json.dumps({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})},
    # A sliding window the model never had: every layer attends to the last 256 tokens only.
    "sliding-window": {"hf-overrides": json.dumps({"sliding_window": 256, "layer_types": ["sliding_attention"] * 30})},
    # A KV cache dtype the model was not calibrated for (fp8 without scales).
    "kv-cache-fp8": {"kv-cache-dtype": "fp8"},
}


# What a defect's server needs of the CPU: vllm-cpu 0.32.0's attention backend (cpu_attn.py) refuses an FP8 KV cache
# without AVX-512 or AMX (measured on an AVX2-only AMD EPYC, 2026-12-02).
ORACLE_DEFECT_CPU: dict[str, tuple[tuple[str, ...], str]] = {
    "kv-cache-fp8": (("avx512f", "amx_tile"), "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
}


def _oracle_defect(name: str) -> Spec:
    cpu_any, refusal = ORACLE_DEFECT_CPU.get(name, ((), ""))
    return Spec(f"oracle-{name}", CPU_RECIPE, flags=lambda _r, flags=ORACLE_DEFECT_FLAGS[name]: dict(flags),
                why=f"a real engine defect for the numerics oracle: {name}", cpu_any=cpu_any, cpu_refusal=refusal)


SPECS: dict[str, Spec] = {spec.name: spec for spec in [
    Spec("smol", CPU_RECIPE, attach_var="COOKBOOK_TEST_BASE_URL", why="the session's SmolLM2 CPU recipe"),
    Spec("hybrid", HYBRID_RECIPE, attach_var="COOKBOOK_TEST_HYBRID_URL", via_cli=True, as_launched=True,
         why="the session's tiny Qwen3-Next hybrid, started by `cookbook serve` (tests/test_launch.py's Ctrl-C stops it)"),
    # The suite's longest test (800 loglikelihood requests, prompt logprobs, so no prefix-cache hit: 13 min on an
    # AVX2-only host) on a SmolLM2 of its own, so a lane of its own can run it beside the session's tests. The claim
    # it checks is a number, and both layouts give the same tokens and logprobs to the last bit
    # (benchmarks/engine_layout.py), so it runs the one-process engine: vLLM's layout cost it a third process's
    # imports and an engine core spinning beside the other lane for its whole run.
    Spec("accuracy", CPU_RECIPE, attach_var="COOKBOOK_TEST_ACCURACY_URL",
         why="a second SmolLM2 CPU recipe, for the clean task-accuracy run alone"),
    Spec("small-pool", CPU_RECIPE, flags=lambda r: launch_flags(r, "engine-states"),
         why="a small KV pool and small prefill chunks: preemption and chunked prefill"),
    Spec("batch-defect", CPU_RECIPE, env=BATCH_DEFECT_ENV, attach_var="COOKBOOK_TEST_BATCHDEFECT_URL",
         why="a deliberate batch-only logit defect plugin"),
    Spec("too-long", CPU_RECIPE, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, flags=lambda _r: {"max-model-len": LONG_CONTEXT},
         attach_var="COOKBOOK_TEST_LONGCTX_URL", why="a context twice the model's positions"),
    Spec("gemma", GEMMA_RECIPE, attach_var="COOKBOOK_TEST_SLIDING_URL",
         why="another model, with sliding-window layers"),
    *[_oracle_defect(name) for name in sorted(ORACLE_DEFECT_FLAGS)],
]}


@dataclass
class Running:
    """A server of the registry as the tests see it: its endpoint, and how it was started (None when attached)."""

    spec: Spec
    endpoint: Endpoint
    cli: subprocess.Popen[str] | None = None  # its process (`cookbook serve`, or tests/_serve.py); None when attached
    ready_line: str = ""
    cli_output: list[str] = field(default_factory=list)
    sessions: set[int] = field(default_factory=set)  # the process sessions it runs in (the guard's to stop)
    run_dir: Path | None = None
    _drain: threading.Thread | None = None

    def output_after_ready(self) -> str:
        """What `cookbook serve` printed after its ready line, once it has exited (its stop lines)."""
        if self._drain is not None:
            self._drain.join(timeout=10)
        at = self.cli_output.index(self.ready_line) if self.ready_line in self.cli_output else len(self.cli_output)
        return "".join(self.cli_output[at + 1:])

    def slack(self) -> float:
        """This server's measured slowdown now (`slack`)."""
        return slack(self.endpoint)

    def deadline(self, quiet_s: float) -> float:
        """`quiet_s` (a deadline that holds on a quiet machine) stretched by the server's measured slowdown."""
        return quiet_s * self.slack()

    @property
    def startup_s(self) -> float:
        """The launcher's own start-up time, from its ready line (0 when attached)."""
        found = re.search(r" startup=([\d.]+)s", self.ready_line)
        return float(found.group(1)) if found else 0.0

    @property
    def kv_pool_tokens(self) -> int | None:
        """The KV pool the launcher read from the server's log, from its ready line."""
        found = re.search(r" kv_pool=([\d,]+) tokens", self.ready_line)
        return int(found.group(1).replace(",", "")) if found else None

    @property
    def log_path(self) -> Path | None:
        return self.run_dir / "server.log" if self.run_dir is not None else None


class ServerFailed(RuntimeError):
    """A server of the registry did not start; every test that needs it errors with this."""


class _Guard:
    """The reaper process: told of each server session as it starts and ends; stops the rest if pytest dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None:
                self._proc = subprocess.Popen([sys.executable, str(TESTS / "_reaper.py"), str(os.getpid())],
                                              stdin=subprocess.PIPE, text=True, start_new_session=True)
            assert self._proc.stdin is not None
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()

    def add(self, sid: int) -> None:
        self._send(f"add {sid}")

    def remove(self, sid: int) -> None:
        self._send(f"del {sid}")

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


class Registry:
    """Every server of one test session, started once, ahead of use, stopped after its last user."""

    def __init__(self, base_dir: Path, times: Path | None = None, max_alive: int = MAX_ALIVE,
                 cores: list[int] | None = None) -> None:
        self.base_dir = base_dir
        self.times = times
        self.max_alive = max_alive  # a lane of a run split in lanes (tests/lanes.py) holds fewer
        self.cores = cores  # the cores this registry's servers may bind to (default: every core this process may use)
        self.guard = _Guard()
        self._lock = threading.Condition()
        self._running: dict[str, Running] = {}
        self._starting: dict[str, threading.Thread] = {}
        self._failed: dict[str, BaseException] = {}
        self._stopped: set[str] = set()
        self._order: list[str] = []  # first use, in the order the tests run
        self._users: dict[str, int] = {}  # tests still to run that need each server
        self._record: dict[str, dict[str, Any]] = {}
        self._cores: dict[str, int] = {}  # the core each started server's worker is bound to (when the registry chose)
        self._last_used: str | None = None
        self._cpu_seen: dict[str, float] = {}  # each server's CPU-seconds at the last cpu_since_last

    # -- the plan ------------------------------------------------------------------------------------------------

    def plan(self, needs: Iterable[list[str]]) -> None:
        """The tests that will run, in order, each as the servers it needs: who starts first, who stops when."""
        for names in needs:
            for name in names:
                if SPECS[name].unavailable() is not None:
                    continue  # never started: its tests skip with why (registry_server)
                if name not in self._users:
                    self._order.append(name)
                self._users[name] = self._users.get(name, 0) + 1

    def test_done(self, names: Iterable[str]) -> None:
        for name in names:
            self._users[name] = self._users.get(name, 1) - 1

    def still_needed(self, name: str) -> bool:
        return self._users.get(name, 0) > 0

    def look_ahead(self) -> None:
        """Start, in the background, the next servers the plan needs (at most AHEAD starting, max_alive up)."""
        with self._lock:
            for name in self._order:
                if len(self._starting) >= AHEAD or len(self._running) + len(self._starting) >= self.max_alive:
                    return
                if _available_gib() < AHEAD_MIN_FREE_GIB:
                    return
                if name in self._running or name in self._starting or name in self._failed or name in self._stopped:
                    continue
                if not self.still_needed(name) or self._attached_url(SPECS[name]):
                    continue
                # The recipe is loaded here, on the tests' thread: loading reads the fix pack through its engine,
                # which tests reload (tests/fixpack_helpers.py), so never from a start-up thread.
                try:
                    recipe = SPECS[name].recipe()
                except Exception:  # the test that needs it starts it itself, and reports why it cannot
                    continue
                thread = threading.Thread(target=self._start_in_background, args=(name, recipe),
                                          name=f"start-{name}", daemon=True)
                self._starting[name] = thread
                self._note(name, requested=time.time(), background=True)
                thread.start()

    # -- use -----------------------------------------------------------------------------------------------------

    def get(self, name: str) -> Running:
        """The running server `name`: started now if nobody has started it, waited for if it is starting."""
        waited_from = time.time()
        with self._lock:
            while True:
                if name in self._running:
                    break
                if name in self._failed:
                    raise ServerFailed(f"the {name} server did not start: {self._failed[name]}") from self._failed[name]
                if name not in self._starting:
                    self._starting[name] = threading.current_thread()
                    self._note(name, requested=time.time(), background=False)
                    self._lock.release()
                    try:
                        self._start(name, None)
                    finally:
                        self._lock.acquire()
                    continue
                self._lock.wait(timeout=1.0)
        self._note_wait(name, time.time() - waited_from)
        self._last_used = name
        self.look_ahead()
        return self._running[name]

    def release(self, name: str) -> None:
        """A user of `name` is done: stop it (raising AssertionError on leftovers) once no test still needs it."""
        if not self.still_needed(name):
            self.stop(name)

    def stop(self, name: str) -> None:
        """Stop `name` now; AssertionError when any process of it is left afterwards."""
        with self._lock:
            running = self._running.pop(name, None)
            self._stopped.add(name)
        if running is None:
            return
        left = self._stop_running(running)
        self._note(name, stopped=time.time())
        self.look_ahead()
        assert not left, f"processes left after stopping the {name} server: {left}"

    def forget(self, name: str) -> None:
        """A test stopped `name` itself (the Ctrl-C test): the registry no longer holds it."""
        with self._lock:
            running = self._running.pop(name, None)
            self._stopped.add(name)
        if running is not None:
            for sid in running.sessions:
                self.guard.remove(sid)
        self._note(name, stopped=time.time())
        self.look_ahead()

    def close(self) -> list[str]:
        """Stop everything still up (the session's end); the problems found, one line each."""
        problems: list[str] = []
        for thread in list(self._starting.values()):  # only after an interruption: a start nobody will use
            if thread is not threading.current_thread():
                thread.join(timeout=10)  # one still going is the guard's: a session it reports later gets a new
                #                          guard, whose stdin closes, and so stops it, when this process exits
        for name in list(self._running):
            try:
                self.stop(name)
            except AssertionError as err:
                problems.append(str(err))
        self.guard.close()
        return problems

    # -- starting and stopping -----------------------------------------------------------------------------------

    def _attached_url(self, spec: Spec) -> str | None:
        return os.environ.get(spec.attach_var) if spec.attach_var else None

    def _start_in_background(self, name: str, recipe: Recipe) -> None:
        try:
            self._start(name, recipe)
        except BaseException:  # recorded by _start; the test that needs it reports it
            pass

    def _start(self, name: str, recipe: Recipe | None) -> None:
        spec = SPECS[name]
        try:
            running = self._launch(spec, recipe or spec.recipe())
        except BaseException as err:
            with self._lock:
                self._failed[name] = err
                self._starting.pop(name, None)
                self._lock.notify_all()
            self._note(name, failed=f"{type(err).__name__}: {err}"[:300])
            raise
        with self._lock:
            self._running[name] = running
            self._starting.pop(name, None)
            self._lock.notify_all()
        self._note(name, ready=time.time())

    def _launch(self, spec: Spec, recipe: Recipe) -> Running:
        attached = self._attached_url(spec)
        if attached:
            return Running(spec, attach(attached, recipe.served_model_name))
        run_dir = self.base_dir / spec.name
        run_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self._note(spec.name, port=port)  # benchmarks/cpu_by_process.py names a server's processes by it
        if spec.via_cli:
            if spec.server_env() or spec.flags(recipe):
                raise ValueError(f"{spec.name}: a `cookbook serve` server takes the recipe as it is")
            argv = [sys.executable, "-m", "cookbook", "serve", recipe.id, "--port", str(port), "--run-dir", str(run_dir)]
        else:
            launch = {"recipe": spec.recipe_id, "env": spec.server_env(), "flags": spec.flags(recipe), "port": port,
                      "run_dir": str(run_dir)}
            argv = [sys.executable, str(TESTS / "_serve.py"), json.dumps(launch)]
        # Its own process and session: the start reads the environment and modules that tests running meanwhile
        # change; the guard is told of it at once, and of the `vllm serve` session as soon as it runs.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        core = self._pick_core(spec) if spec.as_launched else None
        if core is not None:
            env[BIND_VAR] = str(core)
            self._note(spec.name, core=core)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                                env=env, start_new_session=True)
        self.guard.add(proc.pid)
        sessions = {proc.pid}
        assert proc.stdout is not None
        seen: list[str] = []
        for line in proc.stdout:  # ends when the command exits; the launcher bounds the start-up itself
            seen.append(line)
            if line.startswith("session "):
                sessions.add(int(line.split()[1]))
                self.guard.add(int(line.split()[1]))
            if line.startswith("ready:"):
                break
        else:
            proc.wait()
            for sid in sessions:
                self.guard.remove(sid)
            raise ServerFailed(f"{spec.name}: {' '.join(argv[1:3])} printed no ready line (exit {proc.returncode}); "
                               f"log: {run_dir / 'server.log'}\n" + "".join(seen[-30:]))
        for sid in {os.getsid(pid) for pid in _children(proc.pid)} - sessions:
            sessions.add(sid)
            self.guard.add(sid)
        running = Running(spec, Endpoint(f"http://127.0.0.1:{port}", recipe.served_model_name), cli=proc,
                          ready_line=seen[-1], cli_output=seen, sessions=sessions, run_dir=run_dir)
        running._drain = threading.Thread(target=_drain, args=(proc, running.cli_output), daemon=True)
        running._drain.start()
        # A fresh server's /metrics hold no prefill pace yet, so its first long request would get the fixed
        # per-token allowance; one cold prompt of ~700 tokens gives the checks its real pace (cookbook.haystack).
        try:
            prime_prefill_pace(running.endpoint)
        except Exception as exc:  # the server still serves; its checks then use the fixed allowance
            running.cli_output.append(f"(the prefill-pace prompt failed: {exc})\n")
        return running

    def own_server_env(self) -> dict[str, str]:
        """The binding for a vLLM a test starts outside the registry: a lane's one core (vLLM's own binding would put
        its worker on core 0, the other lane's), else nothing (vLLM's own)."""
        cores = self._bindable_cores()
        return {BIND_VAR: str(cores[0])} if self.cores is not None and len(cores) == 1 else {}

    def _bindable_cores(self) -> list[int]:
        """The cores this registry may bind a worker to; none where vLLM's own binding stands (one core only, or the
        variable already set)."""
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2 or BIND_VAR in os.environ:
            return []
        return [c for c in self.cores if c in allowed] if self.cores is not None else allowed

    def _pick_core(self, spec: Spec) -> int | None:
        """The core for a new server's worker: the one fewest live servers are bound to, and on a tie not the core of
        the server a test used last (the one most likely serving while this one starts). None leaves vLLM's own
        binding: one core only, or the variable already set."""
        cores = self._bindable_cores()
        if not cores or BIND_VAR in spec.env:
            return None
        with self._lock:
            live = set(self._running) | set(self._starting)
            load = {core: sum(1 for name, bound in self._cores.items() if bound == core and name in live) for core in cores}
            busy = self._cores.get(self._last_used) if self._last_used else None
            core = min(cores, key=lambda c: (load[c], c == busy, c))
            self._cores[spec.name] = core
        return core

    def _stop_running(self, running: Running) -> list[int]:
        """SIGINT its launcher (the foreground path's own stop: SIGTERM to the server, SIGKILL after the grace)."""
        if running.cli is not None:
            running.cli.send_signal(signal.SIGINT)
            try:
                running.cli.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(running.cli.pid, signal.SIGKILL)
                running.cli.wait()
        left = sorted({pid for sid in running.sessions for pid in session_pids(sid)})
        for sid in running.sessions:
            self.guard.remove(sid)
        return left

    # -- the time log --------------------------------------------------------------------------------------------

    def _note(self, name: str, **fields: Any) -> None:
        with self._lock:
            record = self._record.setdefault(name, {"server": name, "why": SPECS[name].why})
            record.update(fields)
            done = "stopped" in fields or "failed" in fields
        if done:
            self.write_time(dict(record))

    def cpu_since_last(self) -> dict[str, float]:
        """CPU-seconds each running server's processes spent since the last call (the time log's per-test figure:
        which test keeps which server busy)."""
        with self._lock:
            sessions = {sid: name for name, running in self._running.items() for sid in running.sessions}
        now = _session_cpu(sessions)
        out = {name: round(total - self._cpu_seen.get(name, 0.0), 2) for name, total in now.items()}
        self._cpu_seen.update(now)
        return {name: spent for name, spent in out.items() if spent > 0}

    def _note_wait(self, name: str, waited_s: float) -> None:
        with self._lock:
            record = self._record.setdefault(name, {"server": name})
            record["waited_s"] = round(record.get("waited_s", 0.0) + waited_s, 2)

    def write_time(self, record: dict[str, Any]) -> None:
        if self.times is None:
            return
        with self._lock, open(self.times, "a") as out:
            out.write(json.dumps(record) + "\n")


_PACES: dict[str, tuple[float, float]] = {}  # base URL -> (when measured, seconds per token)


def slack(endpoint: Endpoint) -> float:
    """How much slower `endpoint` answers now than this server did on a quiet machine (at least 1): a test's
    deadline is its quiet figure times this, so its outcome does not depend on the machine's load."""
    now = time.monotonic()
    seen = _PACES.get(endpoint.base_url)
    if seen is None or now - seen[0] > PACE_TTL_S:
        seen = _PACES[endpoint.base_url] = (now, measure_pace(endpoint))
    quiet = QUIET_PACE_S_PER_TOKEN.get(endpoint.model, min(QUIET_PACE_S_PER_TOKEN.values()))
    return max(1.0, seen[1] / quiet)


def deadline(endpoint: Endpoint, quiet_s: float) -> float:
    """`quiet_s`, a deadline that holds on a quiet machine, stretched by `endpoint`'s measured slowdown."""
    return quiet_s * slack(endpoint)


def measure_pace(endpoint: Endpoint) -> float:
    """Seconds per generated token of one short greedy request, the best of two (a loaded machine's pace)."""
    body = {"model": endpoint.model, "prompt": "Count: one, two, three,", "max_tokens": PACE_TOKENS,
            "temperature": 0, "ignore_eos": True}
    best = float("inf")
    for _ in range(2):
        started = time.monotonic()
        endpoint.post("/v1/completions", body, timeout_s=600)
        best = min(best, (time.monotonic() - started) / PACE_TOKENS)
    return best


def _session_cpu(sessions: dict[int, str]) -> dict[str, float]:
    """CPU-seconds (user and system) of the live processes in each session, summed by the name it maps to."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(sessions.values(), 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        name = sessions.get(int(fields[3])) if len(fields) > 12 else None
        if name is not None:
            totals[name] += (int(fields[11]) + int(fields[12])) / tick
    return totals


def _available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _drain(proc: subprocess.Popen[str], into: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line)


def uses_server(name: str | Any) -> Any:
    """Mark a fixture as the holder of registry server `name` (or of the one its parameter names, when callable):
    the registry then knows, from the collected tests, which servers the run needs, in which order, until when."""
    def mark(func: Any) -> Any:
        func.cookbook_server = name
        return func
    return mark


def registry_server(servers: Registry, name: str) -> Iterator[Running]:
    """A registry server for a fixture: got (started or waited for), then released (stopped after its last user)."""
    why = SPECS[name].unavailable()
    if why is not None:
        pytest.skip(why)
    running = servers.get(name)
    yield running
    servers.release(name)
