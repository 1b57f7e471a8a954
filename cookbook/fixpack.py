"""The fix pack's metadata (fixes/) as typed models, for recipe pages and validation; never apply anything.

The only way to change an image is ``fixes/apply_all.py``, which runs inside the bare image with the standard library
alone.  The pack has one reader, that tool's engine (``fixes/fixengine``): this module loads the pack through it and
types what it read, so recipes can be checked against the pack and pages can render their "Required fixes" tables
from the recipe's per-model reason plus each fix's own metadata.
"""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import FixPackError

FIXES_DIR = Path(__file__).resolve().parent.parent / "fixes"
ENGINE_DIR = FIXES_DIR / "fixengine"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Probe(_Model):
    """A small shell command that demonstrates the bug (exits non-zero while the bug is there)."""

    probe: str


class Target(_Model):
    path: str = Field(description="Package-relative path, e.g. vllm/compilation/decorators.py (the engine refuses "
                                  "'..', '.', empty or absolute parts)")
    pre: str | None = Field(description="sha256 in the pristine image; None: the fix creates the file")
    post: str | None = Field(description="sha256 after this fix alone; None: unknown (no payload) or deleted")


class Proof(_Model):
    """What was shown of a fix, and where: the test that shows it, and whether that test reproduces the bug itself."""

    shown: Literal["cpu", "gaudi-only"] = Field(
        description="cpu: the test fails on the pristine module with the symptom and passes with the payload; "
                    "gaudi-only: only a Gaudi card shows the bug, the test checks what the payload promises")
    hook: str | None = Field(default=None, description="The bug lives in vLLM: which vLLM function the payload "
                                                       "wraps, and from which vllm_gaudi file")
    test: str = Field(description="tests/<file>.py::test_<fix id with - as _>, the test that shows it")
    summary: str = Field(description="The symptom on the pristine file, and what the test shows with the payload")


class Fix(_Model):
    id: str
    profile: str
    title: str
    why: str = Field(description="Generic symptom and cause; the per-model reason lives in each recipe")
    kind: Literal["bugfix", "backport", "workaround"]
    origin: str
    upstream: list[str]
    remove_when: str
    opt_in: bool
    depends_on: list[str]
    conflicts: list[str]
    check: str | Probe
    targets: list[Target] | None = Field(description="None: the files this fix touches are not known")
    has_payload: bool
    notes: str = ""
    proof: Proof | None = Field(default=None, description="What was shown and where; None: nothing yet (no payload, "
                                                          "or a profile proven by serving, as cpu-0.32.0)")

    @property
    def proof_label(self) -> str:
        """What was shown of this fix, and where, in the words `apply_all.py --list` uses."""
        proof = None if self.proof is None else self.proof.model_dump()
        return str(engine().base.proof_label(proof, self.has_payload))

    @property
    def symptom(self) -> str:
        """The first sentence of ``why``: what a user sees."""
        first = self.why.split(". ")[0].rstrip(".")
        return first + "."

    @property
    def check_label(self) -> str:
        return self.check if isinstance(self.check, str) else f"probe: {self.check.probe}"


class Pin(_Model):
    what: str
    dist: str
    version: str | None = None
    version_prefix: str | None = None
    commit: str | None = None
    required: bool = True


class Profile(_Model):
    name: str
    title: str
    image: str
    anchor: str
    pins: list[Pin]
    files: dict[str, str | None] = Field(description="Path -> pristine sha256 (None: must be absent)")
    fixes: list[str] = Field(description="Every fix of the profile, opt-in ones included, in pack order")
    notes: str = ""


class RequiredFix(_Model):
    """One row of a recipe page's Required fixes table."""

    id: str
    opt_in: bool
    why: str = Field(description="Why this model needs it (the recipe's reason, else the fix's symptom)")
    fix: Fix


class FixPack(_Model):
    root: Path
    order: list[str]
    fixes: dict[str, Fix]
    profiles: dict[str, Profile]

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            raise FixPackError(f"unknown fix profile {name!r} (profiles: {', '.join(self.profiles)})") from None

    def fix(self, fix_id: str) -> Fix:
        try:
            return self.fixes[fix_id]
        except KeyError:
            raise FixPackError(f"unknown fix {fix_id!r}") from None

    def selection(self, profile: str, opt_in: list[str] | tuple[str, ...] = ()) -> list[Fix]:
        """What ``apply_all.py --profile PROFILE OPT_IN...`` applies, in order; the same errors, as FixPackError."""
        prof = self.profile(profile)
        for name in opt_in:
            fix = self.fixes.get(name)
            if fix is None or fix.profile != prof.name:
                raise FixPackError(f"unknown fix {name!r} for profile {prof.name}")
            if not fix.opt_in:
                raise FixPackError(f"fix {name!r} is not opt-in: profile {prof.name} already applies it")
        chosen = [self.fixes[f] for f in prof.fixes if not self.fixes[f].opt_in or f in opt_in]
        ids = {f.id for f in chosen}
        for fix in chosen:
            missing = [d for d in fix.depends_on if d not in ids]
            if missing:
                raise FixPackError(f"fix {fix.id!r} depends on {missing[0]!r}: name it too")
            clash = [c for c in fix.conflicts if c in ids]
            if clash:
                raise FixPackError(f"fix {fix.id!r} conflicts with {clash[0]!r}")
        return chosen

    def required_fixes(self, profile: str, opt_in: list[str] | tuple[str, ...] = (),
                       why: dict[str, str] | None = None) -> list[RequiredFix]:
        """Rows for a page's Required fixes table: the recipe's per-model ``why`` in its own order when it has one
        (every name must be applied by the selection), else every selected fix with its symptom."""
        selected = {f.id: f for f in self.selection(profile, opt_in)}
        if why:
            unknown = [name for name in why if name not in selected]
            if unknown:
                raise FixPackError(f"{unknown[0]!r} is not applied by profile {profile} "
                                   f"{' '.join(opt_in)}".rstrip())
            return [RequiredFix(id=n, opt_in=selected[n].opt_in, why=text, fix=selected[n]) for n, text in why.items()]
        return [RequiredFix(id=f.id, opt_in=f.opt_in, why=f.symptom, fix=f) for f in selected.values()]


def engine() -> ModuleType:
    """The pack's engine, ``fixes/fixengine``, loaded by path under its own name (the module apply_all.py loads).

    By path because ``fixes/`` must not go on ``sys.path``: its folders would shadow installed packages."""
    loaded = sys.modules.get("fixengine")
    if loaded is not None and Path(loaded.__file__ or "").resolve().parent == ENGINE_DIR:
        return loaded
    spec = importlib.util.spec_from_file_location("fixengine", ENGINE_DIR / "__init__.py",
                                                  submodule_search_locations=[str(ENGINE_DIR)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fixengine"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("fixengine", None)
        raise
    return module


def _where(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def load_pack(root: Path | None = None, checks: Collection[str] | None = None) -> FixPack:
    """Read fixes/ (or ``root``) with the engine's loader and type it; any error is a FixPackError naming the file.

    ``checks``: the check registry's names (``cookbook.checks.CHECKS``); given, a fix whose ``check`` names another
    check is an error naming its fix.json and the field.  Passed in by the caller, because the checks import the
    recipes, which read this pack."""
    fixengine = engine()
    try:
        raw: Any = fixengine.load_pack(FIXES_DIR if root is None else Path(root), checks)
    except fixengine.FixError as exc:
        raise FixPackError(str(exc).removeprefix("pack error: ")) from None
    fixes: dict[str, Fix] = {}
    profiles: dict[str, Profile] = {}
    for name, raw_profile in raw.profiles.items():
        for raw_fix in raw_profile.fixes:
            meta = {k: v for k, v in raw_fix.meta.items() if k != "payload"}
            meta.update(profile=name, has_payload=raw_fix.has_payload)
            try:
                fixes[raw_fix.id] = Fix.model_validate(meta)
            except ValidationError as exc:
                raise FixPackError(f"{raw_fix.source}: {_where(exc)}") from None
        try:
            profiles[name] = Profile.model_validate({**raw_profile.meta, "fixes": [f.id for f in raw_profile.fixes]})
        except ValidationError as exc:
            raise FixPackError(f"{raw.root / name / 'profile.json'}: {_where(exc)}") from None
    return FixPack(root=raw.root, order=raw.order, fixes=fixes, profiles=profiles)
