"""environment.yml installs what pyproject.toml requires (issue 23, item 6): the same packages with the same bounds
([project] dependencies and the dev extra, which holds the notebook extra), a Python that requires-python allows, and
the cookbook itself from its pip section, so conda or mamba alone builds a working environment."""
from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _by_name(requirements: list[str]) -> dict[str, tuple[frozenset[str], SpecifierSet]]:
    parsed = [Requirement(text) for text in requirements]
    assert len({canonicalize_name(r.name) for r in parsed}) == len(parsed), f"a package listed twice: {requirements}"
    return {canonicalize_name(r.name): (frozenset(r.extras), r.specifier) for r in parsed}


def _environment() -> tuple[str, list[str], list[str]]:
    """The Python spec, the conda requirements (without python and pip) and the pip section of environment.yml."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"][0] == "conda-forge"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    python = next(d for d in conda if d.split("=")[0] == "python")
    return python, [d for d in conda if d.split("=")[0].split(">")[0].split("<")[0] not in ("python", "pip")], pip


def test_environment_file_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _by_name([*project["dependencies"], *project["optional-dependencies"]["dev"]])
    python, conda, pip = _environment()
    given = _by_name([*conda, *[p for p in pip if not p.startswith("-e ")]])
    assert given.keys() - wanted.keys() == set(), "environment.yml lists what pyproject.toml does not require"
    assert wanted.keys() - given.keys() == set(), "environment.yml misses what pyproject.toml requires"
    differ = {name: (str(given[name][1]), str(wanted[name][1])) for name in wanted if given[name] != wanted[name]}
    assert differ == {}, f"environment.yml and pyproject.toml bound these differently (env, pyproject): {differ}"
    assert all(not Requirement(c).extras for c in conda), "an extra is pip's: put that package in the pip section"
    notebook = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["notebook"]}
    assert notebook <= wanted.keys(), "the dev extra must hold the notebook extra (environment.yml installs dev)"
    assert SpecifierSet(project["requires-python"]).contains(python.split("=", 1)[1]), python


def test_environment_file_installs_the_project_itself() -> None:
    _, _, pip = _environment()
    assert "-e .[dev]" in pip, "the pip section must install the cookbook (editable, with its dev extra)"


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.lock: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_requirement_within_its_bounds() -> None:
    """requirements.lock (what the venv resolved) holds a version of every package pyproject.toml requires, each one
    its bounds allow; a pyproject change without `make lock` fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _lock()
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name == "gaudi-cookbook":
            continue
        assert name in pins, f"requirements.lock: no pin for {requirement.name} (run make lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock: {requirement.name}=={pins[name]} is outside pyproject.toml's {requirement.specifier}")


def test_the_venv_is_keyed_by_the_lock_and_built_with_it() -> None:
    script = (ROOT / "scripts" / "in-env.sh").read_text()
    key_line = next(line for line in script.splitlines() if line.startswith("key="))
    assert "pyproject.toml" in key_line and "requirements.lock" in key_line
    assert '-c "$here/requirements.lock"' in script
