"""The v0.26.0 profile on the simulated vllm-gaudi v0.26.0 image (tests/gaudi_sim.py): the real b059f9c files, the
real fix tool, every payload of the profile.

Each fix's own reproducer lives in `tests/test_fixes_v0_26_0_*.py` (named `test_<fix id>`); this file holds what the
whole profile promises on that image: it applies (exit 0), every patched file compiles, `--status` reads each fix
applied and each file at its recorded post-hash, a second run is a no-op, `--revert` is byte-identical, a kill at any
file leaves an image the next run repairs, and the seed Launch block's fix step exits 0 on the image it names.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from cookbook.fixpack import load_pack
from cookbook.recipes import load_recipe, render_launch_block
from fixpack_helpers import APPLY_ALL, STATE, kill_after_file, load_apply_all, runner_script, sha, snapshot
from gaudi_sim import SimImage, apply_all, overlay

pytestmark = pytest.mark.sim_image

PROFILE = "v0.26.0"


def _profile_fixes() -> list:
    pack = load_pack()
    return [pack.fix(f) for f in pack.profile(PROFILE).fixes if not pack.fix(f).opt_in]


def test_every_fix_has_a_payload_its_targets_and_a_proof() -> None:
    pack = load_pack()
    for fix in [pack.fix(f) for f in pack.profile(PROFILE).fixes]:  # the two opt-ins too
        assert fix.has_payload, f"{fix.id}: no payload"
        assert fix.targets and all(t.post for t in fix.targets), f"{fix.id}: targets without post hashes"
        assert fix.proof is not None, f"{fix.id}: no proof"
        test_file, _, test_name = fix.proof.test.partition("::")
        assert test_name == f"test_{fix.id.replace('-', '_')}", f"{fix.id}: proof.test names {fix.proof.test}"
        source = (Path(__file__).parent.parent / test_file).read_text()
        assert f"def {test_name}(" in source, f"{fix.id}: {fix.proof.test} does not exist"


def test_the_profile_applies_compiles_reads_applied_and_reverts_byte_identical(
        sim_image: SimImage, tmp_path: Path) -> None:
    site = overlay(sim_image, tmp_path / "site")
    before = snapshot(site)
    first = apply_all(sim_image, "--profile", PROFILE, "--root", str(site))
    assert first.returncode == 0, first.stderr
    changed = {rel for rel, data in snapshot(site).items() if before.get(rel) != data}
    targets = {t.path for f in _profile_fixes() for t in f.targets or []}
    assert changed == targets

    compiled = sim_image.run(["-c", "import py_compile, sys\nfor p in sys.argv[1:]: py_compile.compile(p, doraise=True)",
                              *[str(site / rel) for rel in sorted(changed)]])
    assert compiled.returncode == 0, compiled.stderr

    status = apply_all(sim_image, "--status", "--json", "--profile", PROFILE, "--root", str(site))
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    states = {f["id"]: f["state"] for f in report["fixes"]}
    assert all(states[f.id] == "applied" for f in _profile_fixes()), states
    files = {f["path"]: f for f in report["files"]}
    for rel in changed:
        assert files[rel]["state"] == "applied" and files[rel]["sha256"] == sha((site / rel).read_bytes())
    for fix in _profile_fixes():  # a file touched by one fix only ends at that fix's recorded post-hash
        for target in fix.targets or []:
            touching = [f for f in _profile_fixes() if any(t.path == target.path for t in f.targets or [])]
            if touching == [fix]:
                assert sha((site / target.path).read_bytes()) == target.post, (fix.id, target.path)

    again = apply_all(sim_image, "--profile", PROFILE, "--root", str(site))
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr

    revert = apply_all(sim_image, "--revert", "--root", str(site))
    assert revert.returncode == 0, revert.stderr
    assert snapshot(site) == before
    pristine = json.loads((APPLY_ALL.parent / PROFILE / "profile.json").read_text())["files"]
    for rel, digest in pristine.items():
        path = site / rel
        assert (sha(path.read_bytes()) if path.exists() else None) == digest, rel


@pytest.mark.parametrize("k", [1, 3, 6])  # 6: every target renamed into place, the ledger not yet written
def test_a_kill_at_any_file_leaves_the_image_repairable(sim_image: SimImage, tmp_path: Path, k: int) -> None:
    site = overlay(sim_image, tmp_path / "site")
    before = snapshot(site)
    child = subprocess.run(runner_script(APPLY_ALL.parent, site, ["--profile", PROFILE], kill_after_file(k)),
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    status = apply_all(sim_image, "--status", "--profile", PROFILE, "--root", str(site))
    assert status.returncode == 3 and "partial state" in status.stdout
    repaired = apply_all(sim_image, "--profile", PROFILE, "--root", str(site))
    assert repaired.returncode == 0 and "repaired an interrupted run" in repaired.stdout, repaired.stderr
    assert apply_all(sim_image, "--revert", "--root", str(site)).returncode == 0
    assert snapshot(site) == before


@pytest.mark.parametrize("recipe_id, step", [
    ("Qwen/Qwen-AgentWorld-35B-A3B", "--profile v0.26.0"),
    ("Qwen/Qwen3-Coder-Next", "--profile v0.26.0 gdn-prefix-cache"),
    ("Qwen/Qwen3.5-122B-A10B-FP8", "--profile v0.26.0 gdn-prefix-cache fp8-moe-gather"),
])
def test_the_seed_launch_fix_step_exits_0_on_the_image_it_names_and_reverts(
        sim_image: SimImage, tmp_path: Path, recipe_id: str, step: str) -> None:
    """Each seed's Launch block as rendered by the cookbook, its fix step run by the image's `python3` with nothing
    but the image on the path: the tool finds vllm_gaudi by `find_spec`, as in the container; then the tool's revert
    restores every file byte for byte."""
    site = overlay(sim_image, tmp_path / "site")
    before = snapshot(site)
    script = render_launch_block(load_recipe(recipe_id))
    line = next(line for line in script.splitlines() if "fixes/apply_all.py" in line)
    assert line.strip() == f'python3 "$COOKBOOK/fixes/apply_all.py" {step} || exit 1'
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"PATH": f"{sim_image.python.parent}:{env['PATH']}", "COOKBOOK": str(APPLY_ALL.parent.parent),
                "PYTHONPATH": str(site)})
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    ledger = json.loads((site / STATE / "ledger.json").read_text())
    assert [a["id"] for a in ledger["applied"]] == [f.id for f in load_pack().selection(PROFILE, step.split()[2:])]
    assert not (sim_image.site / STATE).exists()  # the overlay was patched, never the cached image
    assert apply_all(sim_image, "--revert", "--root", str(site)).returncode == 0
    assert snapshot(site) == before

def test_a_wrong_gaudi_sw_is_refused_before_anything_is_written(sim_image: SimImage, tmp_path: Path) -> None:
    site = overlay(sim_image, tmp_path / "site")
    plugin = next(site.glob("habana_torch_plugin-*.dist-info"))
    (plugin / "METADATA").write_text("Metadata-Version: 2.1\nName: habana_torch_plugin\nVersion: 1.23.0.695\n")
    r = apply_all(sim_image, "--profile", PROFILE, "--root", str(site))
    assert r.returncode == 2 and "MISMATCH  Gaudi SW 1.24.1" in r.stderr
    assert not (site / STATE).exists()


def test_every_payload_is_captured_back_from_the_pristine_file_with_that_fix(sim_image: SimImage, tmp_path: Path) -> None:
    """The engineer's path (docs/fixes.md, Writing a payload) on the real b059f9c files: for each fix, forget its
    payload and capture it from a copy holding the pristine files with that fix alone: the pack's payload.diff and
    fix.json come back byte-identical."""
    site = overlay(sim_image, tmp_path / "site")
    pack = tmp_path / "pack"
    shutil.copytree(APPLY_ALL.parent / PROFILE, pack / PROFILE)
    original = {p.relative_to(pack).as_posix(): p.read_bytes() for p in sorted(pack.rglob("*")) if p.is_file()}
    engine = load_apply_all()
    every = load_pack()
    for fix in [every.fix(f) for f in every.profile(PROFILE).fixes if every.fix(f).has_payload]:
        folder = pack / PROFILE / fix.id
        edited = tmp_path / f"edited-{fix.id}"
        for patch in engine.parse_diff((folder / "payload.diff").read_bytes(), fix.id):
            pristine = (site / patch.path).read_bytes() if (site / patch.path).exists() else None
            (edited / patch.path).parent.mkdir(parents=True, exist_ok=True)
            (edited / patch.path).write_bytes(engine.apply_file_patch(pristine, patch))
        meta = json.loads((folder / "fix.json").read_text())
        meta["targets"] = [{"path": t["path"], "pre": t["pre"], "post": None} for t in meta["targets"]]
        meta["payload"] = None
        (folder / "fix.json").write_text(json.dumps(meta, indent=2) + "\n")
        (folder / "payload.diff").unlink()
        r = subprocess.run([str(sim_image.python), str(APPLY_ALL), "--pack", str(pack), "--root", str(site),
                            "--profile", PROFILE, "--capture", fix.id, "--from", str(edited)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        now = {p.relative_to(pack).as_posix(): p.read_bytes() for p in sorted(pack.rglob("*")) if p.is_file()}
        assert now == original, fix.id
