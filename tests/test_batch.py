"""Batch runs: notebook selection, parameters, run folders (no server), and a batch in which one notebook fails
while the others and the summary survive (small synthetic notebooks, real papermill kernels, the real server)."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from cookbook import batch
from cookbook.cli.run import parse_params
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.recipes import load_recipe
from cookbook.results import Hardware, parse_hardware, read_results

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"

PARAMS = 'RECIPE = None\nBASE_URL = None\nOUT_DIR = None\nHARDWARE = None\nINTERACTIVE = False'
WRITES_PART = '''
from pathlib import Path
from cookbook.results import CheckResult, Hardware, RunResults, write_results
part = RunResults(recipe=RECIPE, model="m", hardware=Hardware(kind="cpu", description="test cpu"),
                  checks=[CheckResult(name="{name}", label="{name} label", status="pass", result="ok")])
write_results(part, Path(OUT_DIR) / "parts" / "{name}.json")
print("wrote {name}")'''


def make_notebook(folder: Path, name: str, code: str) -> Path:
    book = nbformat.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    book.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params, nbformat.v4.new_code_cell(code)]
    path = folder / f"{name}.ipynb"
    nbformat.write(book, str(path))
    return path


def test_resolve_notebooks_by_name_short_name_and_path(tmp_path: Path) -> None:
    default = batch.resolve_notebooks(None)
    assert [p.stem for p in default] == list(batch.BATCH_NOTEBOOKS)
    assert [p.stem for p in batch.resolve_notebooks(["verify", "02_launch"])] == ["03_verify", "02_launch"]
    own = make_notebook(tmp_path, "mine", "pass")
    assert batch.resolve_notebooks([own]) == [own]
    with pytest.raises(CookbookError, match="--notebooks: unknown notebook 'nope'"):
        batch.resolve_notebooks(["nope"])
    with pytest.raises(CookbookError, match="--notebooks: no such notebook"):
        batch.resolve_notebooks([tmp_path / "absent.ipynb"])


def test_plan_gives_each_notebook_only_its_own_parameters() -> None:
    planned = batch.plan(["verify", "needles"], {"CHECKS": ["seed"], "LENGTHS": [1000]})
    verify, needles = planned.values()
    assert "CHECKS" in verify and "LENGTHS" not in verify
    assert "LENGTHS" in needles and "CHECKS" not in needles
    assert {"RECIPE", "BASE_URL", "OUT_DIR", "HARDWARE", "INTERACTIVE"} <= verify & needles


def test_parse_params_and_hardware() -> None:
    assert parse_params(["CONCURRENCY=4", "LENGTHS=[1000, 2000]", "NAME=abc"]) == {
        "CONCURRENCY": 4, "LENGTHS": [1000, 2000], "NAME": "abc"}
    with pytest.raises(CookbookError, match="--param"):
        parse_params(["lower=1"])
    assert parse_hardware("gaudi2:four Gaudi 2 cards") == Hardware(kind="gaudi2", description="four Gaudi 2 cards")
    assert parse_hardware(None) is None
    with pytest.raises(CookbookError, match="--hardware"):
        parse_hardware("gaudi2")


def test_a_dead_server_fails_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(CookbookError, match="127.0.0.1:9"):
        batch.run_recipe(load_recipe(CPU), "http://127.0.0.1:9", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_prepare_run_dir_refuses_a_folder_with_files(tmp_path: Path) -> None:
    recipe = load_recipe(CPU)
    assert batch.prepare_run_dir(recipe, tmp_path / "new") == tmp_path / "new"
    (tmp_path / "new" / "x").write_text("x")
    with pytest.raises(CookbookError, match="--out"):
        batch.prepare_run_dir(recipe, tmp_path / "new")


@pytest.mark.integration
def test_a_failing_notebook_keeps_its_error_and_the_others_still_run(cpu_server: Endpoint, tmp_path: Path) -> None:
    books = tmp_path / "books"
    books.mkdir()
    sources = [
        make_notebook(books, "01_first", WRITES_PART.format(name="first")),
        make_notebook(books, "02_broken", 'raise RuntimeError("planted failure")'),
        make_notebook(books, "03_last", WRITES_PART.format(name="last")),
    ]
    run_dir = tmp_path / "run"
    lines: list[str] = []
    summary = batch.run_batch(load_recipe(CPU), cpu_server.base_url, run_dir, sources, say=lines.append)

    assert [(n.name, n.status) for n in summary.notebooks] == [("01_first", "ok"), ("02_broken", "failed"), ("03_last", "ok")]
    assert summary.failed == ["02_broken"] and not summary.ok
    assert summary.notebooks[1].error == "RuntimeError: planted failure"
    # The failing notebook's executed copy holds the error; every notebook has its HTML report without code.
    broken = nbformat.read(str(run_dir / "02_broken.ipynb"), as_version=4)
    errors = [o for c in broken.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors and errors[0].evalue == "planted failure"
    for name in ("01_first", "02_broken", "03_last"):
        html = (run_dir / f"{name}.html").read_text()
        assert "write_results(part" not in html  # no code in the report
    assert "planted failure" in (run_dir / "02_broken.html").read_text()
    # The parts of the notebooks that ran are merged; the summary, page and index are written.
    results = read_results(run_dir / "results.json")
    assert [c.name for c in results.checks] == ["first", "last"]
    saved = json.loads((run_dir / "summary.json").read_text())
    assert [n["status"] for n in saved["notebooks"]] == ["ok", "failed", "ok"]
    assert "| first label | ok |" in (run_dir / "page.md").read_text()
    index = (run_dir / "index.html").read_text()
    assert "failed: 02_broken" in index and "02_broken.html" in index and "first label" in index
    assert any("02_broken: failed" in line for line in lines)
    assert kernels_in(run_dir) == []  # each notebook's kernel (started ahead of it) is stopped after it


def kernels_in(folder: Path) -> list[int]:
    """Kernel processes (ipykernel) running in `folder`: a batch starts each one there, ahead of its notebook."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.joinpath("cwd").resolve() == folder.resolve() and b"ipykernel" in proc.joinpath("cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.mark.integration
def test_an_interrupted_batch_leaves_no_kernel_running(cpu_server: Endpoint, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the second notebook: its kernel and the third one's, already started, are both stopped."""
    books = tmp_path / "books"
    books.mkdir()
    sources = [make_notebook(books, f"0{n}_part", WRITES_PART.format(name=f"part{n}")) for n in (1, 2, 3)]
    run_dir = tmp_path / "run"
    real = batch.execute_notebook
    calls: list[int] = []

    def interrupted(*args: object, **kwargs: object) -> object:
        calls.append(len(kernels_in(run_dir)))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(batch, "execute_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        batch.run_batch(load_recipe(CPU), cpu_server.base_url, run_dir, sources, say=lambda _line: None)
    assert calls[1] >= 1  # the second notebook's kernel was up when it was interrupted
    assert kernels_in(run_dir) == []


def test_run_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.cli import main

    assert main(["run"]) == 2
    assert "give a recipe id, or --all" in capsys.readouterr().err
    assert main(["run", CPU, "--all"]) == 2
    assert main(["run", CPU, "--param", "x=1"]) == 2
    assert "--param" in capsys.readouterr().err
    assert main(["run", "no/such-recipe"]) == 2
    assert main(["run", CPU, "--base-url", "http://127.0.0.1:9", "--hardware", "gaudi2"]) == 2
    assert "--hardware" in capsys.readouterr().err
    assert main(["run", CPU, "--base-url", "http://127.0.0.1:9", "--param", "NOPE=1"]) == 2
    assert "--param: NOPE is not a parameter of the notebooks run (they take: " in capsys.readouterr().err
    assert main(["run", CPU, "--base-url", "http://127.0.0.1:9", "--notebooks", "nope"]) == 2
    assert "--notebooks: unknown notebook 'nope'" in capsys.readouterr().err


def test_demo_refuses_a_used_out_folder_before_building_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.cli import main

    (tmp_path / "old.txt").write_text("x")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert f"--out: {tmp_path} exists and is not an empty folder" in capsys.readouterr().err
    assert main(["demo", "--out", str(tmp_path / "new"), "--notebooks", "nope"]) == 2
    assert not (tmp_path / "new").exists()


def test_verify_notebook_leaves_to_the_others_the_checks_they_run() -> None:
    """Issue 11: verify's default is every check that applies; in a batch, 03 leaves prefix-cache to 04, needles
    to 05 and the engine-states group to 07 (each runs with its own figure), so nothing runs twice; run alone, 03
    keeps its default."""
    from cookbook.checks import CHECKS
    from cookbook.checks.engine_states import GROUP

    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    every = batch.resolve_notebooks(None)
    chosen = batch.verify_checks(recipe, every)
    states = [n for n, spec in CHECKS.items() if spec.group == GROUP]
    assert chosen == [n for n in CHECKS if n not in ("prefix-cache", "needles", *states, *batch.BATCH_LEAVES_OUT)]
    assert "task-accuracy" not in chosen and set(batch.BATCH_LEAVES_OUT) <= set(CHECKS)
    assert "server-health" in chosen and "known-answer" in chosen and "oracle" in chosen
    assert list(batch.NOTEBOOK_CHECKS["07_engine_states"]) == states  # the group, whole and in order
    only_needles = batch.resolve_notebooks(["verify", "needles"])
    assert batch.verify_checks(recipe, only_needles) == [n for n in CHECKS if n not in ("needles", *batch.BATCH_LEAVES_OUT)]
    assert batch.verify_checks(recipe, batch.resolve_notebooks(["verify"])) is None
    assert batch.verify_checks(recipe, batch.resolve_notebooks(["needles"])) is None
