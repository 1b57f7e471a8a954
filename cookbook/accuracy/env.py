"""lm-eval's environment, built once in the cache folder beside the image it runs on, never in the cookbook's own.

A virtual environment made by the image's own Python, with the image's site-packages visible through a `.pth` file
(torch and transformers come from the image, unaltered) and `lm_eval[api]` installed on top from the package index.
One environment runs both lm-eval backends the accuracy check needs: `local-completions` against the served OpenAI
API, and `hf` on the same local checkpoint for the reference. Keyed by lm-eval's version and the image, built under
a cache lock, and marked complete (`.complete`, written last) only after lm-eval, torch and transformers import.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import SetupError
from ..image import ImageEnv, _run, build_once, cache_dir
from ..progress import LineRenderer, Progress, Task

LM_EVAL_VERSION = "0.4.13"
LM_EVAL_REQUIREMENT = f"lm_eval[api]=={LM_EVAL_VERSION}"
IMAGE_PTH = "_cookbook_image.pth"

_SITE_DIRS = "import json, site, sysconfig; print(json.dumps(list(dict.fromkeys([sysconfig.get_paths()['purelib'], " \
             "sysconfig.get_paths()['platlib'], *site.getsitepackages()]))))"
_VERSIONS = "import json, importlib.metadata as md; print(json.dumps({n: md.version(n) for n in " \
            "('lm_eval', 'torch', 'transformers', 'datasets')}))"


def lm_eval_env_dir(image: ImageEnv) -> Path:
    """$COOKBOOK_CACHE/envs/lm-eval-<version>-<key>: the key names the image (its interpreter and its build marker)."""
    identity = hashlib.sha256(f"{LM_EVAL_REQUIREMENT}\n{image.python}\n".encode())
    marker = image.python.parent.parent / ".complete"
    if marker.exists():
        identity.update(marker.read_bytes())
    return cache_dir() / "envs" / f"lm-eval-{LM_EVAL_VERSION}-{identity.hexdigest()[:12]}"


def lm_eval_env(image: ImageEnv) -> ImageEnv:
    root = lm_eval_env_dir(image)
    return ImageEnv(python=root / "bin" / "python", bin_dir=root / "bin", kind="lm-eval")


def lm_eval_versions(env: ImageEnv) -> dict[str, str]:
    """What the environment's .complete marker recorded: lm_eval, torch, transformers and datasets versions."""
    try:
        return dict(json.loads((env.python.parent.parent / ".complete").read_text()))
    except (OSError, ValueError):
        return {}


def ensure_lm_eval_env(image: ImageEnv, progress: Progress | None = None) -> ImageEnv:
    """Build lm-eval's environment on `image` once (about 2 minutes, 0.5 GB beside the image); later calls return at
    once. Safe from several processes at once (one builds, the others wait on the lock)."""
    root = lm_eval_env_dir(image)
    env = lm_eval_env(image)

    def build(log: Path) -> dict[str, str]:
        task = Task(progress or LineRenderer(), f"lm-eval {LM_EVAL_VERSION} environment", total=3)
        _run([str(image.python), "-m", "venv", str(root)], "creating lm-eval's virtual environment", log, task)
        site_dirs = _ask(image, _SITE_DIRS, "the image's site-packages")
        own = _ask(env, "import sysconfig; print(__import__('json').dumps(sysconfig.get_paths()['purelib']))", "site")
        (Path(own) / IMAGE_PTH).write_text("".join(f"{d}\n" for d in site_dirs if Path(d).is_dir()))
        pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", LM_EVAL_REQUIREMENT], f"pip install {LM_EVAL_REQUIREMENT}", log, task)
        task.step("importing lm_eval, torch and transformers")
        versions: dict[str, str] = _ask(env, _VERSIONS, "lm-eval's versions")
        done = subprocess.run([str(env.python), "-c", "import lm_eval.evaluator, torch, transformers"],
                              capture_output=True, text=True, env=env.env(), timeout=600)
        if done.returncode != 0:
            raise SetupError(f"{root}: built, but lm_eval does not import: {done.stderr.strip().splitlines()[-1:]}")
        task.finish(f"built in {root}")
        return versions

    build_once(root, build)
    return env


def _ask(env: ImageEnv, code: str, what: str) -> Any:
    try:
        out = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True, env=env.env(), timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{env.python}: cannot ask for {what}: {exc}") from None
    if out.returncode != 0:
        raise SetupError(f"{env.python}: asking for {what} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


if __name__ == "__main__":  # pragma: no cover - `python -m cookbook.accuracy.env` builds it on the CPU image
    from ..image import ensure_cpu_image

    print(ensure_lm_eval_env(ensure_cpu_image()).python)
    sys.exit(0)
