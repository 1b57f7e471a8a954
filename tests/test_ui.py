"""The library imports cleanly without ipywidgets; only cookbook.ui needs it, and its panels build and run."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cookbook.endpoint import Endpoint

BLOCK_WIDGETS = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "ipywidgets" or name.startswith("ipywidgets."):
                raise ImportError(f"blocked for the test: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import cookbook
    for info in pkgutil.walk_packages(cookbook.__path__, "cookbook."):
        if info.name != "cookbook.ui" and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert "ipywidgets" not in sys.modules
    try:
        import cookbook.ui
    except ImportError as exc:
        print("ui:", exc)
    """
)


def test_library_imports_without_ipywidgets() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCK_WIDGETS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ui: cookbook.ui needs ipywidgets" in proc.stdout


def test_no_module_but_ui_pulls_in_ipywidgets() -> None:
    code = ("import importlib, pkgutil, sys, cookbook\n"
            "[importlib.import_module(i.name) for i in pkgutil.walk_packages(cookbook.__path__, 'cookbook.')"
            " if i.name != 'cookbook.ui' and not i.name.endswith('__main__')]\n"
            "print('ipywidgets' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_panels_build() -> None:
    pytest.importorskip("ipywidgets")
    from cookbook import ui

    panel = ui.verify_panel("HuggingFaceTB/SmolLM2-135M-Instruct", None, None)
    picker, server = panel.children[0], panel.children[1]
    assert picker.value == "HuggingFaceTB/SmolLM2-135M-Instruct" and "Qwen/Qwen3-Coder-Next" in picker.options
    assert server.value == ""
    assert ui.recipe_picker("no/such").value == picker.options[0]


@pytest.mark.integration
def test_launch_panel_click_runs_against_the_server(
    cpu_server: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ipywidgets")
    from cookbook import ui

    panel = ui.launch_panel("HuggingFaceTB/SmolLM2-135M-Instruct", cpu_server.base_url, str(tmp_path))
    button = panel.children[-2]
    button.click()  # outside a kernel the Output widget passes what it shows through to stdout
    shown = capsys.readouterr().out
    assert "KV pool (tokens)" in shown and "error:" not in shown
    assert not button.disabled
