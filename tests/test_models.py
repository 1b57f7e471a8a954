"""cookbook/models.py: checkpoints are verified by manifest; a half-written or altered one is rebuilt."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cookbook import models
from cookbook.image import cpu_image_ready
from cookbook.models import MANIFEST, ModelSpec, _write_manifest, verify_model


def _checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    _write_manifest(folder, ModelSpec("x", "test"))
    return folder


def test_complete_checkpoint_verifies(tmp_path: Path) -> None:
    assert verify_model(_checkpoint(tmp_path)) is None


def test_half_written_checkpoint_is_detected(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.truncate(500)
    assert "checksum differs" in str(verify_model(folder))


def test_missing_file_and_missing_manifest_are_detected(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    (folder / "config.json").unlink()
    assert "missing" in str(verify_model(folder))
    (folder / MANIFEST).unlink()
    assert "no manifest" in str(verify_model(folder))


@pytest.mark.integration
def test_damaged_tiny_hybrid_is_rebuilt_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerating the seeded Qwen3-Next gives the same bytes, and a damaged copy is rebuilt on the next use."""
    if not cpu_image_ready():
        pytest.skip("the CPU image is built by `cookbook setup` (the test command does it first)")
    shared = models.ensure_model("tiny-qwen3-next")
    image_cache = models.cache_dir()
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    (tmp_path / "images").symlink_to(image_cache / "images")
    smol = models.models_dir() / "smollm2-135m-instruct"
    smol.parent.mkdir(parents=True)
    os.symlink(shared.parent / "smollm2-135m-instruct", smol)
    rebuilt = models.ensure_model("tiny-qwen3-next", progress=lambda _m: None)
    assert (rebuilt / MANIFEST).read_text() == (shared / MANIFEST).read_text()
    with open(rebuilt / "model.safetensors", "r+b") as handle:
        handle.truncate(1000)
    assert verify_model(rebuilt) is not None
    again = models.ensure_model("tiny-qwen3-next", progress=lambda _m: None)
    assert verify_model(again) is None
    shutil.rmtree(again)
