"""cookbook/fixpack.py: the pack's metadata as the recipes and pages see it, and the v0.26.0 catalogue's facts."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cookbook import fixpack
from cookbook.checks import CHECKS
from cookbook.errors import FixPackError
from cookbook.recipes import load_recipe
from fixpack_helpers import load_apply_all
from shared_files import shared_file

REPO = Path(__file__).resolve().parent.parent
SEED_OPT_INS = {"gdn-prefix-cache", "fp8-moe-gather"}
SEED_FIXES = {
    "sampling-rows-refresh", "structured-output-rows", "bad-words-index", "logitsprocs-rows", "async-discard-counter",
    "hybrid-decode-pad", "gather-logprobs-int32", "prompt-logprobs", "logprobs-decode-guard", "rank-exception-fatal",
    "rope-cpu-cache", "prompt-order", "resumed-prefill-logits", "seeded-sampling",
} | SEED_OPT_INS


@pytest.fixture(scope="module")
def pack() -> fixpack.FixPack:
    return fixpack.load_pack()


def test_profiles_and_fixes(pack: fixpack.FixPack) -> None:
    assert set(pack.profiles) == {"v0.26.0", "cpu-0.32.0"}
    gaudi = pack.profile("v0.26.0")
    assert set(gaudi.fixes) == SEED_FIXES
    assert gaudi.fixes == [f for f in pack.order if f in SEED_FIXES]
    assert {f for f in gaudi.fixes if pack.fix(f).opt_in} == SEED_OPT_INS
    assert pack.fix("gdn-prefix-cache").depends_on == ["hybrid-decode-pad"]
    # Every fix has its payload and says what was shown where (tests/test_fixes_v0_26_0.py checks the tests exist).
    for f in gaudi.fixes:
        assert pack.fix(f).has_payload and pack.fix(f).proof is not None, f
    cpu = pack.profile("cpu-0.32.0")
    assert cpu.fixes[0] == "vllm-cpu-version"
    assert all(pack.fix(f).has_payload and pack.fix(f).targets for f in cpu.fixes)


def test_every_fix_names_a_known_check_or_a_probe(pack: fixpack.FixPack) -> None:
    fixpack.load_pack(checks=CHECKS)  # the loader's own check against the registry
    for fix in pack.fixes.values():
        if isinstance(fix.check, fixpack.Probe):
            assert fix.check.probe.strip(), fix.id
        else:
            assert fix.check in CHECKS, f"{fix.id}: unknown check {fix.check!r}"
    v026 = [pack.fix(f) for f in pack.profile("v0.26.0").fixes]
    assert all(isinstance(f.check, str) for f in v026)  # the Gaudi fixes point at suite checks


def test_metadata_is_complete(pack: fixpack.FixPack) -> None:
    for fix in pack.fixes.values():
        assert fix.title and fix.why and fix.origin and fix.remove_when, fix.id
        assert all(u.startswith("https://") for u in fix.upstream), fix.id
        if fix.targets is None:
            assert "Target unknown" in fix.notes, f"{fix.id}: unknown targets must say so"


def test_v026_pins_and_hashes_are_the_researched_ones(pack: fixpack.FixPack) -> None:
    research = shared_file("research/vllm-gaudi-v0.26.0.md")
    hashes = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", research.read_text(),
                                                                 re.MULTILINE))
    assert len(hashes) == 13
    profile = pack.profile("v0.26.0")
    assert {k: v for k, v in profile.files.items() if v is not None} == hashes
    assert profile.files["vllm_gaudi/ops/hpu_moe_combine.py"] is None  # created by fp8-moe-gather
    pins = {p.dist: p for p in profile.pins}
    assert pins["vllm-gaudi"].commit == "b059f9c95d6a07f19eb00aa06d1ec8b87b296437"
    assert pins["vllm"].commit == "568afb3a13806beb53bb2e6bd518269357b237c0"
    assert pins["habana-torch-plugin"].version_prefix == "1.24.1."
    fp8 = pack.fix("fp8-moe-gather")
    assert {t.path: t.pre for t in fp8.targets or []}["vllm_gaudi/ops/hpu_moe_combine.py"] is None


@pytest.mark.parametrize("recipe_id", ["Qwen/Qwen3-Coder-Next", "Qwen/Qwen3.5-122B-A10B-FP8"])
def test_pack_order_follows_the_seeds_required_fixes(pack: fixpack.FixPack, recipe_id: str) -> None:
    recipe = load_recipe(recipe_id)
    names = list(recipe.fixes.why)
    assert names == sorted(names, key=pack.order.index)


def test_selection_and_required_fixes_rows(pack: fixpack.FixPack) -> None:
    assert len(pack.selection("v0.26.0")) == 14
    assert len(pack.selection("v0.26.0", ["gdn-prefix-cache"])) == 15
    assert len(pack.selection("v0.26.0", ["gdn-prefix-cache", "fp8-moe-gather"])) == 16
    recipe = load_recipe("Qwen/Qwen3-Coder-Next")
    rows = pack.required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, dict(recipe.fixes.why))
    assert [r.id for r in rows] == list(recipe.fixes.why)
    assert [r.id for r in rows if r.opt_in] == ["gdn-prefix-cache"]
    generic = pack.required_fixes("cpu-0.32.0")
    assert [r.id for r in generic] == pack.profile("cpu-0.32.0").fixes
    assert all(r.why.endswith(".") for r in generic)


@pytest.mark.parametrize(("call", "message"), [
    (lambda p: p.profile("v9"), "unknown fix profile 'v9'"),
    (lambda p: p.fix("nope"), "unknown fix 'nope'"),
    (lambda p: p.selection("v0.26.0", ["hybrid-decode-pad"]), "is not opt-in"),
    (lambda p: p.selection("v0.26.0", ["vllm-cpu-version"]), "unknown fix 'vllm-cpu-version' for profile v0.26.0"),
    (lambda p: p.required_fixes("v0.26.0", [], {"gdn-prefix-cache": "x"}), "is not applied by profile"),
])
def test_errors_are_fixpack_errors(pack: fixpack.FixPack, call: object, message: str) -> None:
    with pytest.raises(FixPackError, match=message):
        call(pack)  # type: ignore[operator]


def _copy_pack(tmp_path: Path) -> Path:
    dst = tmp_path / "fixes"
    shutil.copytree(fixpack.FIXES_DIR, dst, ignore=shutil.ignore_patterns("__pycache__", "tools", "*.py"))
    return dst


@pytest.mark.parametrize("breakage", ["order-missing", "dep-later", "bad-kind", "bad-target", "outside-target"])
def test_broken_packs_fail_in_both_readers(tmp_path: Path, breakage: str) -> None:
    root = _copy_pack(tmp_path)
    order = root / "v0.26.0" / "ORDER"
    if breakage == "order-missing":
        order.write_text(order.read_text().replace("seeded-sampling\n", ""))
    elif breakage == "dep-later":
        lines = order.read_text().splitlines()
        lines.remove("hybrid-decode-pad")
        lines.append("hybrid-decode-pad")
        order.write_text("\n".join(lines) + "\n")
    else:
        path = root / "cpu-0.32.0" / "vllm-cpu-version" / "fix.json"
        meta = json.loads(path.read_text())
        if breakage == "bad-kind":
            meta["kind"] = "feature"
        elif breakage == "outside-target":  # a target path that would leave site-packages
            meta["targets"][0]["path"] = "vllm/../../evil.py"
            profile = root / "cpu-0.32.0" / "profile.json"
            pmeta = json.loads(profile.read_text())
            pmeta["files"]["vllm/../../evil.py"] = meta["targets"][0]["pre"]
            profile.write_text(json.dumps(pmeta))
        else:
            meta["targets"][0]["pre"] = "0" * 64
        path.write_text(json.dumps(meta))
    with pytest.raises(FixPackError):
        fixpack.load_pack(root)
    apply_all = load_apply_all()
    with pytest.raises(apply_all.FixError) as err:
        apply_all.load_pack(root)
    assert err.value.code == 1 and str(err.value).startswith("pack error: ")


def test_a_check_not_in_the_registry_is_an_error_naming_file_and_field(tmp_path: Path) -> None:
    root = _copy_pack(tmp_path)
    path = root / "cpu-0.32.0" / "vllm-cpu-version" / "fix.json"
    meta = json.loads(path.read_text())
    meta["check"] = "known-answers"  # a typo of a registered check
    path.write_text(json.dumps(meta))
    with pytest.raises(FixPackError) as err:
        fixpack.load_pack(root, checks=CHECKS)
    assert str(err.value).startswith(f"{path}: field 'check': 'known-answers' is not a check")
    apply_all = load_apply_all()
    with pytest.raises(apply_all.FixError) as raw_err:
        apply_all.load_pack(root, checks=set(CHECKS))
    assert raw_err.value.code == 1 and str(raw_err.value).startswith(f"pack error: {path}: field 'check'")
    fixpack.load_pack(root)  # without the registry (the bare image's case) the name is not judged


def test_the_order_is_per_profile(tmp_path: Path) -> None:
    assert not (fixpack.FIXES_DIR / "ORDER").exists()
    root = _copy_pack(tmp_path)
    stray = root / "v0.26.0" / "ORDER"
    stray.write_text(stray.read_text() + "vllm-cpu-version\n")  # a fix of another profile
    with pytest.raises(FixPackError, match=r"v0\.26\.0/ORDER: 'vllm-cpu-version' names no fix of profile v0\.26\.0"):
        fixpack.load_pack(root)
    stray.write_text(stray.read_text().replace("vllm-cpu-version\n", ""))
    (root / "ORDER").write_text("seeded-sampling\n")  # the old pack-wide file: refused, not half-read
    with pytest.raises(FixPackError, match="each profile keeps its own"):
        fixpack.load_pack(root)


def test_both_readers_agree_on_the_real_pack(pack: fixpack.FixPack) -> None:
    raw = load_apply_all().load_pack()
    assert list(raw.profiles) == list(pack.profiles)
    for name, profile in raw.profiles.items():
        assert [f.id for f in profile.fixes] == pack.profile(name).fixes
        assert {f.id: f.has_payload for f in profile.fixes} == {f.id: pack.fix(f.id).has_payload for f in profile.fixes}


def test_library_never_applies() -> None:
    source = Path(fixpack.__file__).read_text()
    for writer in ("subprocess", "os.replace", "write_bytes", "write_text", "open("):
        assert writer not in source, writer
    assert not any(name.startswith(("apply", "revert")) for name in dir(fixpack))
