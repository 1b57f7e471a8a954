"""scripts/in-env.sh: every checkout that shares the cached environment runs its own code."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported_from(checkout: Path) -> Path:
    out = subprocess.run(
        [str(checkout / "scripts" / "in-env.sh"), "python", "-c", "import cookbook; print(cookbook.__file__)"],
        cwd="/", capture_output=True, text=True, timeout=600, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    return Path(out.stdout.strip().splitlines()[-1]).resolve()


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="in-env.sh keys the environment with sha256sum")
def test_two_checkouts_sharing_one_environment_each_import_their_own_code(tmp_path: Path) -> None:
    other = tmp_path / "other-clone"
    other.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", other / "pyproject.toml")  # same dependencies: the same cached env
    shutil.copy2(ROOT / "requirements.lock", other / "requirements.lock")  # and the same pins: the same key
    shutil.copytree(ROOT / "scripts", other / "scripts")
    shutil.copytree(ROOT / "cookbook", other / "cookbook", ignore=shutil.ignore_patterns("__pycache__"))

    try:
        assert _imported_from(other) == (other / "cookbook" / "__init__.py").resolve()
        # Running the other clone first must not re-point this checkout's commands at it, nor the other way round.
        assert _imported_from(ROOT) == (ROOT / "cookbook" / "__init__.py").resolve()
        assert _imported_from(other) == (other / "cookbook" / "__init__.py").resolve()
    finally:  # in-env.sh re-pointed the shared Jupyter kernel at the temporary clone: point it back here
        _imported_from(ROOT)
