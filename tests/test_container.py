"""The container (issue 11, item 6): `docker run` rendered from a recipe, parsed back as a shell would (shlex,
`bash -n`, and bash itself running it against a stand-in `docker` that prints its argv), secrets by name only."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cookbook import container
from cookbook.cli import main
from cookbook.errors import CookbookError
from cookbook.recipes import RECIPES_DIR, load_recipe, load_recipe_file, serve_argv

SEEDS = ["Qwen/Qwen-AgentWorld-35B-A3B", "Qwen/Qwen3-Coder-Next", "Qwen/Qwen3.5-122B-A10B-FP8"]
# The interpreter by absolute path: a stand-in named python3 must not find itself through `env`.
ARGV_PRINTER = f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]))\n"


def stand_ins(folder: Path, *names: str) -> dict[str, str]:
    """Executables that print their own argv as JSON, first on PATH: nothing real runs."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text(ARGV_PRINTER)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def options(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def hostile_recipe(tmp_path: Path) -> Path:
    data = yaml.safe_load((RECIPES_DIR / "Qwen/Qwen3-Coder-Next/recipe.yaml").read_text())
    data["environment"].update({
        "HF_TOKEN": "hf_live_value_1234", "MY_API_KEY": "sk-live-5678",
        "ODD_VALUE": f"$(touch {tmp_path}/pwned) `id`; rm -rf x 'q' \"d\"", "SPACED": "a b  c",
    })
    data["serve"]["flags"]["api-key"] = "sk-flag-9999"
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "recipe.yaml"


@pytest.mark.parametrize("recipe_id", SEEDS)
def test_rendered_run_parses_back_to_its_argv(recipe_id: str, tmp_path: Path) -> None:
    recipe = load_recipe(recipe_id)
    spec = container.ContainerSpec(checkout=Path("/srv/my cookbook"), hf_cache=Path("/data/hf"), port=8123)
    text = container.render_docker_run(recipe, spec)
    argv = container.docker_run_argv(recipe, spec)
    # shlex has no line continuation: parse the options line by line (each ends in " \\" outside any quote),
    # then the quoted script, whose own continuations are inside the quotes.
    head, _, tail = text.partition("\n  bash -c ")
    words = [w for line in head.removesuffix(" \\").split(" \\\n") for w in shlex.split(line)]
    assert words + shlex.split("bash -c " + tail) == argv
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    inner = tmp_path / "inner.sh"
    inner.write_text(argv[-1])
    assert subprocess.run(["bash", "-n", str(inner)], capture_output=True).returncode == 0

    assert argv[:3] == ["docker", "run", "--rm"] and "--runtime=habana" in argv and "--ipc=host" in argv
    env = options(argv, "-e")
    visible = next(e for e in env if e.startswith("HABANA_VISIBLE_DEVICES="))
    assert visible == "HABANA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(recipe.hardware.cards))
    assert options(argv, "-v") == [f"/data/hf:{container.CONTAINER_HF_HOME}", f"/srv/my cookbook:{container.CONTAINER_COOKBOOK}:ro"]
    assert f"COOKBOOK={container.CONTAINER_COOKBOOK}" in env and options(argv, "-p") == ["127.0.0.1:8123:8000"]
    assert [e for e in env if "=" in e and e.split("=")[0] in recipe.environment] == [f"{k}={v}" for k, v in recipe.environment.items()]
    assert argv[-4] == f"vllm-gaudi:{recipe.image.tag}" and argv[-3:-1] == ["bash", "-c"]


@pytest.mark.parametrize("recipe_id", SEEDS)
def test_bash_runs_the_rendered_command_and_the_launch_steps(recipe_id: str, tmp_path: Path) -> None:
    """bash itself reads the command (a stand-in docker prints what it got), then the container's script (stand-in
    python3 and vllm): the fix step and `vllm serve` exactly as the recipe's argv."""
    recipe = load_recipe(recipe_id)
    env = stand_ins(tmp_path / "bin", "docker", "python3", "vllm")
    text = container.render_docker_run(recipe)
    got = json.loads(subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, check=True).stdout)
    assert got == container.docker_run_argv(recipe)
    ran = subprocess.run(["bash", "-c", got[-1]], env={**env, "COOKBOOK": "/cookbook"}, capture_output=True, text=True, check=True)
    fix, serve = (json.loads(line) for line in ran.stdout.splitlines())
    assert fix == ["python3", "/cookbook/fixes/apply_all.py", "--profile", recipe.fixes.profile, *recipe.fixes.opt_in]
    assert serve == serve_argv(recipe)


def test_secrets_go_by_name_never_by_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = load_recipe_file(hostile_recipe(tmp_path))
    text = container.render_docker_run(recipe)
    for value in ("hf_live_value_1234", "sk-live-5678", "sk-flag-9999"):
        assert value not in text
    argv = container.docker_run_argv(recipe)
    env = options(argv, "-e")
    assert {"HF_TOKEN", "MY_API_KEY", "VLLM_API_KEY"} <= set(env)  # by name: docker copies the host's value
    assert "--api-key" not in argv[-1]
    # Hostile values arrive byte for byte as one word each, and run nothing.
    assert f"ODD_VALUE=$(touch {tmp_path}/pwned) `id`; rm -rf x 'q' \"d\"" in env and "SPACED=a b  c" in env
    stub = stand_ins(tmp_path / "bin", "docker")
    got = json.loads(subprocess.run(["bash", "-c", text], env=stub, capture_output=True, text=True, check=True).stdout)
    assert got == argv and not (tmp_path / "pwned").exists()
    assert main(["recipe", "container", str(recipe.path)]) == 0
    assert "sk-live-5678" not in capsys.readouterr().out


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cases: list[tuple[list[str], str]] = [
        (["HuggingFaceTB/SmolLM2-135M-Instruct"], "not a container"),
        (["Qwen/Qwen3-Coder-Next", "--devices", "0,1"], "--devices: the recipe needs 4"),
        (["Qwen/Qwen3-Coder-Next", "--devices", "0,0,1,2"], "--devices"),
        (["Qwen/Qwen3-Coder-Next", "--devices", "a,b"], "--devices"),
        (["Qwen/Qwen3-Coder-Next", "--port", "70000"], "--port"),
    ]
    for args, message in cases:
        assert main(["recipe", "container", *args]) != 0
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_devices_and_image_are_the_callers() -> None:
    recipe = load_recipe("Qwen/Qwen-AgentWorld-35B-A3B")
    argv = container.docker_run_argv(recipe, container.ContainerSpec(devices=[6, 7], image="registry.local/vg:0.26"))
    assert "HABANA_VISIBLE_DEVICES=6,7" in argv and argv[-4] == "registry.local/vg:0.26"
    with pytest.raises(CookbookError):
        container.visible_devices(recipe, [-1, 0])
