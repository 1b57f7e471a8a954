"""The next notebook's kernel, started while the current notebook runs.

A batch runs each notebook in a fresh kernel. Starting one and importing the cookbook in it took about 3 s of every
notebook of the demo (measured on a 2-vCPU machine: 3.7 s for the fix-pack notebook, 0.55 s with its kernel
already up), while the notebook before it mostly waits on the server. So the batch starts the next kernel in a
thread, has it import the modules every notebook's first cell imports, and hands it to papermill (nbclient's `km`);
each kernel still runs exactly one notebook and is shut down after it. When a start fails, the notebook starts its
own kernel as before.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

# What every batch notebook imports first (`cookbook.session` pulls in most of the library); nothing that picks a
# matplotlib backend or runs a notebook's own code.
PRELOAD = "import pandas, cookbook.report, cookbook.session"
READY_TIMEOUT_S = 120.0


class StartedKernel:
    """One kernel started in a thread: `take()` waits for it and returns its manager (None if the start failed),
    `shutdown()` stops it (also when it was never taken)."""

    def __init__(self, kernel_name: str, cwd: Path, extra_arguments: list[str]) -> None:
        self.error = ""
        self._manager: Any = None
        self._lock = threading.Lock()  # one shutdown, however many callers (a batch's own and its caller's)
        self._thread = threading.Thread(target=self._start, args=(kernel_name, str(cwd), extra_arguments),
                                        name="next-kernel", daemon=True)
        self._thread.start()

    def _start(self, kernel_name: str, cwd: str, extra_arguments: list[str]) -> None:
        from jupyter_client.manager import AsyncKernelManager

        manager = AsyncKernelManager(kernel_name=kernel_name)
        self._manager = manager

        async def start() -> None:
            await manager.start_kernel(cwd=cwd, extra_arguments=extra_arguments)
            client = manager.client()
            client.start_channels()
            try:
                await client.wait_for_ready(timeout=READY_TIMEOUT_S)
                msg_id = client.execute(PRELOAD, silent=True, store_history=False)
                while True:
                    reply = await client.get_shell_msg(timeout=READY_TIMEOUT_S)
                    if reply["parent_header"].get("msg_id") == msg_id:
                        break
                if reply["content"].get("status") != "ok":
                    raise RuntimeError(f"{PRELOAD!r} failed: {reply['content'].get('ename')}")
            finally:
                client.stop_channels()

        try:
            asyncio.run(start())
        except Exception as exc:  # the notebook then starts a kernel of its own
            self.error = f"{type(exc).__name__}: {exc}"[:200]

    def take(self) -> Any:
        """The started kernel's manager, or None (the start failed: it is shut down, and `error` says why)."""
        self._thread.join()
        if self.error:
            self.shutdown()
            return None
        return self._manager

    def shutdown_in_background(self) -> threading.Thread:
        """`shutdown` in a thread of its own (a graceful exit lets the kernel's atexit hooks run, which takes about a
        second): the next notebook need not wait for it; the caller joins the thread before it is done."""
        thread = threading.Thread(target=self.shutdown, name="kernel-shutdown", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop the kernel (a no-op when none runs); never raises, a batch must not fail on a kernel's exit."""
        self._thread.join()
        with self._lock:
            manager, self._manager = self._manager, None
        if manager is None:
            return
        try:
            from jupyter_core.utils import run_sync

            if run_sync(manager.is_alive)():
                run_sync(manager.shutdown_kernel)(now=False)
            run_sync(manager.cleanup_resources)()
        except Exception:  # already gone
            pass
