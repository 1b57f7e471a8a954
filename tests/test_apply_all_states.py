"""fixes/apply_all.py in unclear states (issue 15 items 6 and 8): damaged ledgers and journals, a ledger of a
profile this pack does not have, drift before a revert, bad --lock-timeout values, symlinked targets and pack
paths that leave site-packages.  Each state is built on a synthetic installed package (tests/fixpack_helpers.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from fixpack_helpers import (
    PRISTINE,
    STATE,
    FixSpec,
    make_pack,
    make_site,
    run_tool,
    runner_script,
    snapshot,
    standard_fixes,
)

PROFILE = ["--profile", "toy-1.0"]


@pytest.fixture
def applied(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """A toy image with f1..f3 applied; returns the pack, the site and the pristine snapshot."""
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 0, r.stderr
    return pack, site, before


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("apply_all: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# -- a ledger that is valid JSON but misses a key or has a wrong type ----------------------------------------

LEDGER_BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no-applied": (lambda d: d.pop("applied"), "'applied'"),
    "applied-not-list": (lambda d: d.update(applied={"id": "f1"}), "'applied'"),
    "applied-id-missing": (lambda d: d["applied"][0].pop("id"), "'applied[0].id'"),
    "applied-id-int": (lambda d: d["applied"][1].update(id=7), "'applied[1].id'"),
    "no-files": (lambda d: d.pop("files"), "'files'"),
    "files-list": (lambda d: d.update(files=[]), "'files'"),
    "current-int": (lambda d: d["files"]["toypkg/a.py"].update(current=5), "'files.toypkg/a.py.current'"),
    "pristine-missing": (lambda d: d["files"]["toypkg/b.py"].pop("pristine"), "'files.toypkg/b.py.pristine'"),
    "profile-int": (lambda d: d.update(profile=3), "'profile'"),
    "outside-path": (lambda d: d["files"].update({"../evil.py": {"pristine": None, "current": None}}),
                     "'files.../evil.py'"),
}


@pytest.mark.parametrize("breakage", sorted(LEDGER_BREAKAGES))
def test_ledger_missing_key_or_wrong_type_is_one_line_exit_3(applied: tuple[Path, Path, dict[str, bytes]],
                                                             breakage: str) -> None:
    pack, site, before = applied
    change, field = LEDGER_BREAKAGES[breakage]
    _edit_json(site / STATE / "ledger.json", change)
    patched = snapshot(site)
    for args in (PROFILE, ["--status", *PROFILE], ["--list"], ["--list", *PROFILE], ["--status"]):
        r = run_tool(pack, site, *args)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        line = _one_line_error(r, "ledger.json", field)
        assert "--revert" in line  # the advice names the command that works
    assert snapshot(site) == patched  # nothing was written by the refusals
    as_json = run_tool(pack, site, "--list", "--json")
    data = json.loads(as_json.stdout)
    assert as_json.returncode == 3 and data["exit_code"] == 3 and not data["ok"] and field in data["error"]
    # The advice works: --revert restores every original from the blob store.
    r = run_tool(pack, site, "--revert", *PROFILE)
    assert r.returncode == 0, r.stderr
    assert "restored" in r.stdout
    assert snapshot(site) == before
    assert not (site / STATE / "ledger.json").exists() and not (site / STATE / "blobs").exists()
    assert run_tool(pack, site, *PROFILE).returncode == 0  # and the image can be patched again


@pytest.mark.parametrize("damage", ["not-json", "removed"])
def test_unreadable_or_removed_ledger_revert_restores_from_the_blobs(applied: tuple[Path, Path, dict[str, bytes]],
                                                                     damage: str) -> None:
    """Issue 15: following the old advice ("repair or remove it by hand") left three files patched while --revert
    said "nothing to revert"; the originals sat unused in the blob store."""
    pack, site, before = applied
    ledger = site / STATE / "ledger.json"
    if damage == "not-json":
        ledger.write_text('{"format": 1, "profile": "toy-1.0", "appl')
        r = run_tool(pack, site, *PROFILE)
        assert r.returncode == 3
        line = _one_line_error(r, "ledger.json")
        assert "--revert --profile toy-1.0" in line and "by hand" not in line
    else:
        ledger.unlink()
        r = run_tool(pack, site, *PROFILE)  # the files differ from the pristine image: a mismatch, with the way back
        assert r.returncode == 2
        assert "--revert --profile toy-1.0" in r.stderr.splitlines()[0]
        status = run_tool(pack, site, "--status", *PROFILE)
        assert "--revert --profile toy-1.0" in status.stdout
    r = run_tool(pack, site, "--revert")  # the profile is found without the ledger: one candidate here
    assert r.returncode == 0, r.stderr
    assert "restored 3 files from the saved originals" in r.stdout
    assert snapshot(site) == before


def test_revert_from_the_blobs_killed_midway_is_finished_by_the_next_revert(
        applied: tuple[Path, Path, dict[str, bytes]]) -> None:
    pack, site, before = applied
    (site / STATE / "ledger.json").write_text("{")
    inject = (f"    orig(src, dst)\n"
              f"    if '{STATE}' not in str(dst):\n"
              f"        os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.run(runner_script(pack, site, ["--revert", *PROFILE], inject), capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert (site / STATE / "journal.json").exists()
    r = run_tool(pack, site, "--revert")
    assert r.returncode == 0, r.stderr
    assert snapshot(site) == before
    assert sorted(p.name for p in (site / STATE).iterdir()) == ["lock"]


def test_revert_from_the_blobs_refuses_a_file_it_cannot_account_for(applied: tuple[Path, Path, dict[str, bytes]]
                                                                    ) -> None:
    pack, site, _ = applied
    (site / STATE / "ledger.json").write_text("garbage")
    (site / "toypkg/b.py").write_bytes(b"# someone else's version of b\n")
    patched = snapshot(site)
    r = run_tool(pack, site, "--revert", *PROFILE)
    assert r.returncode == 3
    _one_line_error(r, "toypkg/b.py", "--force")
    assert snapshot(site) == patched  # all or nothing
    r = run_tool(pack, site, "--revert", "--force", *PROFILE)
    assert r.returncode == 0, r.stderr
    assert snapshot(site)["toypkg/b.py"] == PRISTINE["toypkg/b.py"]


def test_partial_revert_with_an_unreadable_ledger_is_refused(applied: tuple[Path, Path, dict[str, bytes]]) -> None:
    pack, site, _ = applied
    (site / STATE / "ledger.json").write_text("[]")
    r = run_tool(pack, site, "--revert", "f3", *PROFILE)
    assert r.returncode == 3
    _one_line_error(r, "ledger.json", "--revert --profile toy-1.0")


# -- a journal that is valid JSON but misses a key or has a wrong type ----------------------------------------

def _kill_after_first_file(pack: Path, site: Path) -> None:
    inject = (f"    orig(src, dst)\n"
              f"    if '{STATE}' not in str(dst):\n"
              f"        os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.run(runner_script(pack, site, PROFILE, inject), capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert (site / STATE / "journal.json").exists()


JOURNAL_BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no-files": (lambda d: d.pop("files"), "'files'"),
    "files-dict": (lambda d: d.update(files={}), "'files'"),
    "before-missing": (lambda d: d["files"][0].pop("before"), "'files[0].before'"),
    "path-int": (lambda d: d["files"][0].update(path=1), "'files[0].path'"),
    "path-outside": (lambda d: d["files"][0].update(path="toypkg/../../evil.py"), "'files[0].path'"),
    "mode-str": (lambda d: d["files"][0].update(mode="rw"), "'files[0].mode'"),
    "ledger-before-list": (lambda d: d.update(ledger_before=[]), "'ledger_before'"),
}


@pytest.mark.parametrize("breakage", sorted(JOURNAL_BREAKAGES))
def test_journal_missing_key_or_wrong_type_is_one_line_exit_3(tmp_path: Path, breakage: str) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    before = snapshot(site)
    _kill_after_first_file(pack, site)
    change, field = JOURNAL_BREAKAGES[breakage]
    _edit_json(site / STATE / "journal.json", change)
    partial = snapshot(site)
    for args in (PROFILE, ["--status", *PROFILE], PROFILE + ["--dry-run"]):
        r = run_tool(pack, site, *args)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        line = _one_line_error(r, "journal.json", field)
        assert "--revert --profile toy-1.0" in line
    assert snapshot(site) == partial
    assert not (tmp_path.parent / "evil.py").exists()
    r = run_tool(pack, site, "--revert", *PROFILE)  # the way back: every original is in the blob store
    assert r.returncode == 0, r.stderr
    assert snapshot(site) == before
    assert not (site / STATE / "journal.json").exists()


# -- a ledger naming a profile this pack does not have ---------------------------------------------------------

def test_ledger_of_an_unknown_profile(applied: tuple[Path, Path, dict[str, bytes]]) -> None:
    pack, site, _ = applied
    _edit_json(site / STATE / "ledger.json", lambda d: d.update(profile="toy-0.9"))
    status = run_tool(pack, site, "--status")
    assert status.returncode == 3
    line = _one_line_error(status, "ledger.json", "'toy-0.9'", "not in this pack")
    assert "no ledger found" not in line
    revert = run_tool(pack, site, "--revert")
    assert revert.returncode == 3  # never "nothing to revert" while files are patched
    _one_line_error(revert, "'toy-0.9'")


# -- drift, then --revert --------------------------------------------------------------------------------------

def test_drift_then_revert_says_how_to_recover(applied: tuple[Path, Path, dict[str, bytes]]) -> None:
    pack, site, before = applied
    target = site / "toypkg/b.py"
    target.write_bytes(target.read_bytes() + b"# someone else's change\n")
    r = run_tool(pack, site, "--revert")
    assert r.returncode == 3
    line = _one_line_error(r, "drift", "toypkg/b.py")
    assert "to recover" in line and "--revert --force --profile toy-1.0" in line
    forced = run_tool(pack, site, "--revert", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "discarded the change to toypkg/b.py" in forced.stdout
    assert snapshot(site) == before


def test_force_is_only_for_revert(applied: tuple[Path, Path, dict[str, bytes]]) -> None:
    pack, site, _ = applied
    r = run_tool(pack, site, *PROFILE, "--force")
    assert r.returncode == 1
    _one_line_error(r, "--force")


# -- --lock-timeout ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf", "abc"])
def test_lock_timeout_must_be_a_finite_number(tmp_path: Path, value: str) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    r = run_tool(pack, site, *PROFILE, f"--lock-timeout={value}", timeout=30)
    assert r.returncode == 1  # usage, as every bad flag of this tool (exit 2 means an image mismatch here)
    _one_line_error(r, "--lock-timeout")
    assert not (site / STATE).exists()


# -- symlinked targets ---------------------------------------------------------------------------------------------

def _symlinked_site(tmp_path: Path, outside: bool = False) -> tuple[Path, Path]:
    site = make_site(tmp_path)
    link = site / "toypkg/a.py"
    real_dir = (tmp_path / "elsewhere") if outside else (site / "toypkg/_store")
    real_dir.mkdir(parents=True)
    real = real_dir / "a_impl.py"
    real.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(os.path.relpath(real, link.parent))
    return site, real


def test_symlinked_target_stays_a_symlink_after_apply_and_revert(tmp_path: Path) -> None:
    site, real = _symlinked_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    link = site / "toypkg/a.py"
    target = os.readlink(link)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == target
    assert real.read_bytes() != PRISTINE["toypkg/a.py"] and b"fixed by f1" in real.read_bytes()
    assert run_tool(pack, site, *PROFILE).returncode == 0  # a no-op
    r = run_tool(pack, site, "--revert")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == target
    assert real.read_bytes() == PRISTINE["toypkg/a.py"]
    assert not list(site.rglob("*.cbfix-tmp"))


def test_symlinked_target_stays_a_symlink_through_a_killed_run_and_its_repair(tmp_path: Path) -> None:
    site, real = _symlinked_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    link = site / "toypkg/a.py"
    _kill_after_first_file(pack, site)
    assert link.is_symlink()
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 0 and "repaired an interrupted run" in r.stdout, r.stderr
    assert link.is_symlink() and b"fixed by f1" in real.read_bytes()
    assert run_tool(pack, site, "--revert").returncode == 0
    assert link.is_symlink() and real.read_bytes() == PRISTINE["toypkg/a.py"]


def test_symlinked_target_leaving_site_packages_is_refused(tmp_path: Path) -> None:
    site, real = _symlinked_site(tmp_path, outside=True)
    pack = make_pack(tmp_path, standard_fixes())
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 4
    _one_line_error(r, "toypkg/a.py", "symlink", "outside")
    assert snapshot(site) == before and real.read_bytes() == PRISTINE["toypkg/a.py"]
    assert (site / "toypkg/a.py").is_symlink()


# -- pack paths that leave site-packages ------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["toypkg/../../evil.py", "../evil.py", "/tmp/cbfix-evil-absolute.py",
                                 "toypkg/./x.py", "toypkg//x.py"])
def test_pack_target_outside_the_package_is_refused(tmp_path: Path, rel: str) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, [FixSpec("evil", {rel: b"print('pwned')\n"})])
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 1
    _one_line_error(r, "pack error", "fix.json", rel)
    assert snapshot(site) == before and not (site / STATE).exists()
    assert not (tmp_path / "evil.py").exists() and not Path("/tmp/cbfix-evil-absolute.py").exists()


def test_profile_file_outside_the_package_is_refused(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes(), extra_files={"../outside.py": None})
    r = run_tool(pack, site, "--list")
    assert r.returncode == 1
    _one_line_error(r, "pack error", "profile.json", "../outside.py")
