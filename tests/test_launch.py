"""cookbook/launch.py against the real CPU server: start, health, KV pool, stop, start-up failure, no orphans."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from cookbook.endpoint import Endpoint
from cookbook.errors import LaunchError
from cookbook.launch import Server, free_port, session_pids
from cookbook.recipes import load_recipe

from servers import Registry, Running

pytestmark = pytest.mark.integration


def test_session_server_is_healthy_with_a_kv_pool(cpu_launch: Running) -> None:
    """The session's SmolLM2, started by the library's foreground path (tests/_serve.py): its ready line."""
    if cpu_launch.cli is None or cpu_launch.log_path is None:
        pytest.skip("attached to an external server")
    ready_line = cpu_launch.ready_line
    endpoint = cpu_launch.endpoint
    assert endpoint.healthy()
    assert endpoint.served_models() == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    # The pool parsed from the log agrees with vllm:cache_config_info in /metrics.
    assert cpu_launch.kv_pool_tokens is not None and cpu_launch.kv_pool_tokens > 8192
    assert endpoint.kv_pool_tokens() == cpu_launch.kv_pool_tokens
    assert "ready: http://127.0.0.1:" in ready_line and f"{cpu_launch.kv_pool_tokens:,} tokens" in ready_line
    log = cpu_launch.log_path.read_text()
    assert "apply_all.py --profile cpu-0.32.0" in log
    assert "vllm serve" in log


def test_one_chat_request_gets_a_correct_answer(cpu_server: Endpoint) -> None:
    """The known-answer check's prompt: the bare question's greedy first token is a near-tie for this model
    ('L' -1.83 against 'The' -1.96 in bf16 on a 2-vCPU AMX box, which then answers "L'Étoile"); this one leads by 1.5."""
    reply = cpu_server.openai().chat.completions.create(
        model=cpu_server.model,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        temperature=0,
        max_tokens=20,
    )
    assert "paris" in reply.choices[0].message.content.lower()


@pytest.fixture(scope="module")
def failed_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[LaunchError, Path, str]:
    """One start-up that vLLM refuses (an unknown flag), with a secret in the environment and in a flag: the two tests
    below read the same failure (one refused start, not two: each costs vLLM's import)."""
    secret = "hf_planted_secret_value_0123456789"
    run_dir = tmp_path_factory.mktemp("refused")
    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    # The launcher's own deadline: had it not seen the exit at once, it would report "did not answer /health".
    server = Server(recipe, port=free_port(), run_dir=run_dir, startup_timeout_s=120,
                    extra_flags={"api-key": secret, "no-such-flag": "1"}, say=lambda _l: None)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_TOKEN", secret)
        with pytest.raises(LaunchError) as info:
            server.start()
    return info.value, run_dir, secret


@pytest.mark.own_server
def test_bad_flag_fails_start_up_with_the_log_tail(failed_start: tuple[LaunchError, Path, str]) -> None:
    error, _, _ = failed_start
    assert "exited during start-up (exit " in str(error) and "(exit 0)" not in str(error)
    assert "did not answer /health" not in str(error)
    assert 0 < len(error.log_tail) <= 20


@pytest.mark.own_server
def test_secret_in_the_environment_never_reaches_the_log(failed_start: tuple[LaunchError, Path, str]) -> None:
    error, run_dir, secret = failed_start
    text = (run_dir / "server.log").read_text()
    assert "--api-key '***'" in text  # shell-quoted: the logged command is copyable and `***` would glob
    assert secret not in text
    assert all(secret not in line for line in error.log_tail)


def test_cookbook_serve_stops_on_sigint_without_orphans(hybrid_launch: Running, servers: Registry) -> None:
    """The foreground command: one ready line, then SIGINT stops the whole process tree within the launcher's stop
    deadline, by SIGTERM alone (it says when it had to SIGKILL what was left after the grace). The command is the
    session's hybrid server (the registry starts it with `cookbook serve`); this test, run last, is its stop."""
    proc = hybrid_launch.cli
    if proc is None:
        pytest.skip("attached to an external hybrid server: its process is not ours to stop")
    ready_line = hybrid_launch.ready_line
    port = hybrid_launch.endpoint.base_url.rsplit(":", 1)[1]
    assert f"http://127.0.0.1:{port}/v1" in ready_line and "kv_pool=" in ready_line and "tokens" in ready_line
    server_pids = [int(p) for p in _children(proc.pid)]
    assert server_pids, "the server's processes should be visible before stopping"
    sids = {os.getsid(p) for p in server_pids}
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=40)  # a guard against a hang: the launcher bounds the stop itself
    servers.forget("hybrid")
    rest = hybrid_launch.output_after_ready()
    assert proc.returncode == 0, rest
    assert "stopped" in rest.splitlines() and "SIGKILL" not in rest, rest  # not "stopped (SIGKILL: ...)"
    for sid in sids:
        assert session_pids(sid) == []


def _children(pid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return out.split()
