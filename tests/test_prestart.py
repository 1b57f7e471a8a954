"""The next notebook's kernel, started ahead: it runs, has the cookbook imported, is handed over once and stopped;
a start that fails leaves nothing running and says why."""
from __future__ import annotations

from pathlib import Path

from jupyter_core.utils import run_sync

from cookbook._prestart import StartedKernel

# ipykernel's own kernel of this interpreter: there whether or not `make setup` installed gaudi-cookbook's
KERNEL = "python3"


def test_a_started_kernel_has_the_cookbook_imported_and_is_stopped_after(tmp_path: Path) -> None:
    started = StartedKernel(KERNEL, tmp_path, ["--IPKernelApp.log_level=CRITICAL"])
    manager = started.take()
    assert manager is not None and started.error == ""
    assert run_sync(manager.is_alive)()
    seen: list[str] = []
    client = manager.blocking_client()
    client.start_channels()
    try:
        reply = client.execute_interactive(
            "import os, sys; print(os.getcwd(), 'cookbook.session' in sys.modules, 'matplotlib.pyplot' in sys.modules)",
            timeout=60, output_hook=lambda msg: seen.append(msg["content"].get("text", "")))
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok"
    assert "".join(seen).split() == [str(tmp_path), "True", "False"]  # its cwd, the preload, no backend chosen
    started.shutdown_in_background().join()
    assert not run_sync(manager.is_alive)()
    started.shutdown()  # a second shutdown (the batch's caller) is a no-op


def test_a_kernel_that_cannot_start_is_none_and_says_why(tmp_path: Path) -> None:
    started = StartedKernel("no-such-kernel-spec", tmp_path, [])
    assert started.take() is None and "no-such-kernel-spec" in started.error
    started.shutdown()
