"""Lab as a newcomer meets it (issue 23, item 7).

The user-level `gaudi-cookbook` kernel follows the checkout that runs scripts/in-env.sh: `install-kernel.sh
--if-missing` (what in-env.sh calls every time) re-points a kernel another checkout wrote, and leaves one that
already points here alone; two fake checkouts and a fake venv in a temporary folder, so neither the real venv's copy
nor the user's is touched. And with `INTERACTIVE = True`, Run All ends at the panel's cell: the cells below it, which
run the suite headless, do not run behind the panel.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cookbook.endpoint import Endpoint

REPO = Path(__file__).resolve().parent.parent
KERNEL = "gaudi-cookbook"


def _checkout(root: Path, name: str) -> Path:
    """A folder holding this checkout's install-kernel.sh, as another clone of the cookbook would."""
    scripts = root / name / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "install-kernel.sh", scripts / "install-kernel.sh")
    return root / name


def _install(checkout: Path, venv: Path, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "JUPYTER_DATA_DIR": str(data)}
    done = subprocess.run(["bash", str(checkout / "scripts" / "install-kernel.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def test_if_missing_re_points_a_kernel_of_another_checkout(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    data = tmp_path / "jupyter"
    first, second = _checkout(tmp_path, "clone-a"), _checkout(tmp_path, "clone-b")
    spec = data / "kernels" / KERNEL / "kernel.sh"

    _install(first, venv, data)
    assert f"written by {first}/scripts/install-kernel.sh" in spec.read_text()
    assert f"'{first}'" in next(line for line in spec.read_text().splitlines() if line.startswith("export PYTHONPATH"))

    moved = _install(second, venv, data, "--if-missing")  # before: kept clone-a, the first installer, for good
    text = spec.read_text()
    assert f"written by {second}/scripts/install-kernel.sh" in text and str(first) not in text
    assert f"'{second}'" in next(line for line in text.splitlines() if line.startswith("export PYTHONPATH"))
    assert f"pointed at {first}; re-pointing it at {second}" in moved.stderr

    written = (spec.read_bytes(), spec.stat().st_mtime_ns)
    again = _install(second, venv, data, "--if-missing")
    assert again.stderr == "" and (spec.read_bytes(), spec.stat().st_mtime_ns) == written  # already here: untouched
    # The venv's own copy (what papermill finds first) follows the same rule.
    assert f"written by {second}/" in (venv / "share" / "jupyter" / "kernels" / KERNEL / "kernel.sh").read_text()


def test_if_missing_re_points_a_kernel_of_another_venv(tmp_path: Path) -> None:
    data = tmp_path / "jupyter"
    checkout = _checkout(tmp_path, "clone")
    venvs = [tmp_path / "venv-old", tmp_path / "venv-new"]
    for venv in venvs:
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(sys.executable)
    _install(checkout, venvs[0], data)
    _install(checkout, venvs[1], data, "--if-missing")
    assert f"exec '{venvs[1]}/bin/python'" in (data / "kernels" / KERNEL / "kernel.sh").read_text()


def _code_cells(path: Path) -> list[str]:
    book = json.loads(path.read_text())
    return ["".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code"]


def test_every_panel_cell_ends_run_all_when_cells_below_would_run() -> None:
    """A panel cell followed by any cell that does more than the interactive-guarded close must stop Run All."""
    checked = 0
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = _code_cells(path)
        panels = [i for i, code in enumerate(cells) if code.startswith("if INTERACTIVE:") and "display(ui." in code]
        for i in panels:
            below = [code for code in cells[i + 1:] if not code.startswith("if not INTERACTIVE:")]
            if below:
                checked += 1
                assert cells[i].rstrip().splitlines()[-1].strip().startswith("ui.stop_run_all()"), (
                    f"{path.name}: with INTERACTIVE = True, Run All would run {len(below)} cells below the panel")
    assert checked >= 6  # 01 and 03 to 07 have headless cells below their panel


def test_the_stop_shows_one_line_not_a_traceback() -> None:
    from cookbook import ui

    with pytest.raises(ui.RunAllStopsHere) as caught:
        ui.stop_run_all()
    assert caught.value._render_traceback_() == [ui.STOP_MESSAGE] and "INTERACTIVE = False" in ui.STOP_MESSAGE


@pytest.mark.integration
def test_run_all_with_interactive_stops_at_the_panel(cpu_server: Endpoint, tmp_path: Path) -> None:
    """03_verify executed top to bottom (as Run All does) with INTERACTIVE = True: the panel shows, then nothing runs
    the checks (no verify part is written, the run_checks cell never executes)."""
    import papermill as pm

    out = tmp_path / "03.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as caught:
        pm.execute_notebook(str(REPO / "notebooks" / "03_verify.ipynb"), str(out), kernel_name=KERNEL,
                            parameters={"INTERACTIVE": True, "BASE_URL": cpu_server.base_url,
                                        "OUT_DIR": str(tmp_path / "run"), "CHECKS": ["server-health"]},
                            progress_bar=False)
    assert caught.value.ename == "RunAllStopsHere"
    book = json.loads(out.read_text())
    code = [c for c in book["cells"] if c["cell_type"] == "code"]
    ran = ["".join(c["source"]) for c in code if c.get("execution_count") is not None]
    assert any("display(ui.verify_panel" in c for c in ran)
    assert not any("run_checks(" in c for c in ran), ran
    assert not list((tmp_path / "run").rglob("*verify*"))
