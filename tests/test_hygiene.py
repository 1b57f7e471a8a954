"""Hygiene as tooling: ruff and mypy find nothing (their findings are the failure message), notebooks are stripped
by a git clean filter as they are staged (tested in a real temporary repository), the pre-commit hook strips the
same way, and every notebook's paired text form (notebooks/text/*.py) is in step with it."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from scripts_under_test import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "notebook_hygiene.py"
# What `make lint` checks; ruff reads its rules and mypy its files and flags from pyproject.toml.
RUFF_PATHS = ["cookbook", "fixes", "scripts", "tests", "benchmarks", "notebooks/text"]
hygiene = load_script(SCRIPT)


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _with_outputs(path: Path) -> dict:
    """A committed notebook as a run leaves it: outputs, counts, timings, widget state, the kernel's language_info."""
    book = json.loads(path.read_text(encoding="utf-8"))
    for number, cell in enumerate(c for c in book["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = number + 1
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": [f"ran {number}\n"]}]
        cell["metadata"]["execution"] = {"iopub.status.busy": "2026-12-01T10:00:00Z"}
        cell["metadata"]["papermill"] = {"duration": 1.5, "status": "completed"}
    book["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    book["metadata"]["language_info"] = {"name": "python", "version": "3.11.9", "mimetype": "text/x-python"}
    return book


def _assert_committable(book: dict, name: str) -> None:
    """What tests/test_notebooks.py requires of a committed notebook, plus no volatile metadata."""
    nbformat.validate(nbformat.from_dict(book))
    for cell in book["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{name}: a committed cell has outputs"
            assert cell["execution_count"] is None, f"{name}: a committed cell has an execution count"
        assert not set(cell["metadata"]) & set(hygiene.VOLATILE_CELL_METADATA), (name, cell["metadata"])
    assert not set(book["metadata"]) & set(hygiene.VOLATILE_NOTEBOOK_METADATA), (name, book["metadata"])
    assert book["metadata"]["language_info"] == {"name": "python"}


# --- lint and type-check --------------------------------------------------------------------------------------

def test_ruff_finds_nothing() -> None:
    proc = _run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", *RUFF_PATHS], ROOT)
    assert proc.returncode == 0, f"ruff (pyproject.toml [tool.ruff]; `make lint`):\n{proc.stdout}{proc.stderr}"


def test_mypy_finds_nothing() -> None:
    # Its cache (MYPY_CACHE_DIR, in the cache folder: scripts/in-env.sh) makes a later run, in any clone, take seconds.
    proc = _run([sys.executable, "-m", "mypy"], ROOT)
    assert proc.returncode == 0, f"mypy (pyproject.toml [tool.mypy]; `make lint`):\n{proc.stdout}{proc.stderr}"
    assert "no issues found" in proc.stdout


def test_make_lint_runs_what_the_suite_runs() -> None:
    proc = _run(["make", "-n", "lint"], ROOT)
    assert proc.returncode == 0, proc.stderr
    assert f"ruff check {' '.join(RUFF_PATHS)}" in proc.stdout and "mypy" in proc.stdout


# --- stripping --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_committed_notebooks_are_what_the_filter_stores(path: Path) -> None:
    """A fixed point of the filter: otherwise every clean checkout would show the notebook modified."""
    text = path.read_text(encoding="utf-8")
    assert hygiene.clean_text(text) == text, f"{path.name}: run `make notebooks-sync` (it strips the notebooks)"


def test_clean_strips_outputs_and_volatile_metadata_and_keeps_the_rest() -> None:
    path = ROOT / "notebooks" / "03_verify.ipynb"
    committed = json.loads(path.read_text(encoding="utf-8"))
    cleaned = json.loads(hygiene.clean_text(json.dumps(_with_outputs(path))))
    _assert_committable(cleaned, path.name)
    assert cleaned == committed  # sources, tags (`parameters`), ids, kernelspec: all kept
    assert hygiene.clean_text("<<<<<<< HEAD\n{") == "<<<<<<< HEAD\n{"  # a conflicted file passes untouched


def test_strip_hook_in_place_and_check(tmp_path: Path) -> None:
    book = tmp_path / "run.ipynb"
    book.write_text(json.dumps(_with_outputs(ROOT / "notebooks" / "02_launch.ipynb")), encoding="utf-8")
    check = _run([sys.executable, str(SCRIPT), "strip", "--check", str(book)], tmp_path)
    assert check.returncode == 1 and "run.ipynb" in check.stdout
    assert json.loads(book.read_text(encoding="utf-8"))["cells"][1]["outputs"]  # --check changed nothing
    assert _run([sys.executable, str(SCRIPT), "strip", str(book)], tmp_path).returncode == 0
    _assert_committable(json.loads(book.read_text(encoding="utf-8")), book.name)
    assert _run([sys.executable, str(SCRIPT), "strip", "--check", str(book)], tmp_path).returncode == 0


@pytest.fixture
def git_env(tmp_path: Path) -> dict[str, str]:
    """git isolated from this machine's configuration: only what the repository's own config says applies."""
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com"}


def _repo_like_this_one(repo: Path, env: dict[str, str]) -> None:
    """A repository holding what the filter needs: .gitattributes, the Makefile's `hooks`, the script."""
    (repo / "scripts").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    for name in (".gitattributes", "Makefile", "scripts/notebook_hygiene.py"):
        shutil.copy2(ROOT / name, repo / name)
    assert _run(["git", "init", "-q"], repo, env=env).returncode == 0


def test_git_filter_commits_stripped_and_keeps_the_working_copy(tmp_path: Path, git_env: dict[str, str]) -> None:
    repo = tmp_path / "repo"
    _repo_like_this_one(repo, git_env)
    for _ in range(2):  # idempotent: run twice, one value each
        made = _run(["make", "-s", "hooks"], repo, env=git_env)
        assert made.returncode == 0, made.stderr
    clean = _run(["git", "config", "--get-all", "filter.nbstrip.clean"], repo, env=git_env).stdout.splitlines()
    assert clean == ["python3 scripts/notebook_hygiene.py clean"]

    run = _with_outputs(ROOT / "notebooks" / "03_verify.ipynb")
    book = repo / "notebooks" / "03_verify.ipynb"
    book.write_text(json.dumps(run, indent=1), encoding="utf-8")
    assert _run(["git", "add", "-A"], repo, env=git_env).returncode == 0
    committed = _run(["git", "commit", "-qm", "a notebook with outputs"], repo, env=git_env)
    assert committed.returncode == 0, committed.stderr

    stored = _run(["git", "show", "HEAD:notebooks/03_verify.ipynb"], repo, env=git_env).stdout
    _assert_committable(json.loads(stored), "the committed blob")
    assert stored == (ROOT / "notebooks" / "03_verify.ipynb").read_text(encoding="utf-8")
    assert json.loads(book.read_text(encoding="utf-8")) == run  # the working copy keeps its outputs
    # ... and is not "modified": a re-run notebook shows up only when its sources change.
    assert _run(["git", "status", "--porcelain"], repo, env=git_env).stdout == ""
    edited = copy.deepcopy(run)
    edited["cells"][-1]["source"] = ["print('changed')"]
    book.write_text(json.dumps(edited, indent=1), encoding="utf-8")
    diff = _run(["git", "diff"], repo, env=git_env).stdout
    assert "print('changed')" in diff and "ran " not in diff and "execution_count\": 1" not in diff


def test_hooks_target_never_fails_a_fresh_clone_or_a_plain_folder(tmp_path: Path, git_env: dict[str, str]) -> None:
    repo = tmp_path / "repo"
    _repo_like_this_one(repo, git_env)
    assert _run(["git", "add", "-A"], repo, env=git_env).returncode == 0
    assert _run(["git", "commit", "-qm", "init"], repo, env=git_env).returncode == 0
    clone = tmp_path / "clone"
    assert _run(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env=git_env).returncode == 0
    assert _run(["make", "-s", "hooks"], clone, env=git_env).returncode == 0
    assert _run(["git", "config", "filter.nbstrip.smudge"], clone, env=git_env).stdout.strip() == "cat"
    plain = tmp_path / "plain"  # an unpacked archive: no git, nothing to configure, no failure
    plain.mkdir()
    shutil.copy2(ROOT / "Makefile", plain / "Makefile")
    env = {**git_env, "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    assert _run(["make", "-s", "hooks"], plain, env=env).returncode == 0


def test_pre_commit_config_runs_the_same_script() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert hooks["notebook-strip"]["entry"] == "python3 scripts/notebook_hygiene.py strip"
    assert hooks["notebook-text-sync"]["entry"].endswith("scripts/notebook_hygiene.py check-sync")
    for hook in hooks.values():
        assert hook["language"] == "system"
        program = next(w for w in hook["entry"].split() if "/" in w)
        assert (ROOT / program).is_file(), f"{hook['id']}: {program} does not exist"


# --- paired text form -------------------------------------------------------------------------------------------

def test_every_notebook_has_its_text_form_in_step() -> None:
    assert hygiene.out_of_sync() == [], "run `make notebooks-sync`"
    assert sorted(p.stem for p in (ROOT / "notebooks" / "text").glob("*.py")) == sorted(
        p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_a_changed_cell_without_its_pair_is_caught_and_synced(tmp_path: Path) -> None:
    books = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", books)
    assert hygiene.out_of_sync(books) == []
    path = books / "04_prefix_cache.ipynb"
    book = nbformat.read(str(path), as_version=4)
    book.cells[-1].source += "\nprint('one more line')"
    nbformat.write(book, str(path))
    (books / "text" / "99_gone.py").write_text("# %%\n")
    problems = hygiene.out_of_sync(books)
    assert problems == ["notebooks/text/04_prefix_cache.py: differs from 04_prefix_cache.ipynb (make notebooks-sync)",
                        "notebooks/text/99_gone.py: no notebook of that name (delete it)"]
    assert sorted(p.name for p in hygiene.sync(books)) == ["04_prefix_cache.py", "99_gone.py"]
    assert hygiene.out_of_sync(books) == []
    assert "print('one more line')" in (books / "text" / "04_prefix_cache.py").read_text()
