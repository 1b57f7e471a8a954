"""A test module's own real server (a defect, another model): one per module-scoped fixture."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cookbook.endpoint import Endpoint
from cookbook.launch import Server, attach, free_port, session_pids
from cookbook.recipes import Recipe


@contextlib.contextmanager
def started_server(recipe: Recipe, run_dir: Path, extra_flags: dict[str, Any] | None = None) -> Iterator[Server]:
    """The recipe's server on a free port, stopped at the end with nothing of its process tree left behind."""
    server = Server(recipe, port=free_port(), run_dir=run_dir, say=lambda _line: None, extra_flags=extra_flags)
    server.start()
    assert server.process is not None
    sid = server.process.pid
    try:
        yield server
    finally:
        server.stop()
        leftovers = session_pids(sid)
        assert not leftovers, f"processes left after stopping {recipe.id}: {leftovers}"


def own_server(
    recipe: Recipe, tmp_path_factory: pytest.TempPathFactory, env_var: str, extra_flags: dict[str, Any] | None = None
) -> Iterator[Endpoint]:
    """Attached through `env_var` while developing (a server started with the same settings), else started on a
    free port and stopped, without orphans, when the module is done."""
    attached = os.environ.get(env_var)
    if attached:
        yield attach(attached, recipe.served_model_name)
        return
    with started_server(recipe, tmp_path_factory.mktemp(recipe.id.replace("/", "--")), extra_flags) as server:
        yield server.endpoint
