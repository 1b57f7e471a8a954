"""Where the project's shared reference material is: `../shared` beside the checkout (as on every developer's
machine and in CI), or $COOKBOOK_SHARED. Tests that compare with it skip without it on a laptop, and fail in CI,
where a missing seed would otherwise hide a broken comparison."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("COOKBOOK_SHARED") or Path(__file__).resolve().parents[2] / "shared")
SEED_FILES = {
    "Qwen/Qwen-AgentWorld-35B-A3B": "000_c9adc83f83a96933.txt",
    "Qwen/Qwen3-Coder-Next": "002_d893177716e81e09.txt",
    "Qwen/Qwen3.5-122B-A10B-FP8": "003_a4b5bef3ace35abf.txt",
}


def shared_file(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        message = f"{path} not found (set COOKBOOK_SHARED to the shared/ folder)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def seed_text(recipe_id: str) -> str:
    return shared_file(f"seeds/{SEED_FILES[recipe_id]}").read_text()
