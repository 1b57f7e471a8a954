"""Read the fix pack's metadata (fixes/) for recipe pages and validation; never apply anything.

The only way to change an image is ``fixes/apply_all.py``, which runs inside the bare image with the standard library
alone.  This module reads the same files (ORDER, ``<profile>/profile.json``, ``<profile>/<fix>/fix.json``) into
typed models so recipes can be checked against the pack and pages can render their "Required fixes" tables from the
recipe's per-model reason plus each fix's own metadata.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import FixPackError

FIXES_DIR = Path(__file__).resolve().parent.parent / "fixes"

# Names of the verification suite's checks a fix may point at to demonstrate its bug.
CHECK_NAMES = frozenset({
    "known-answer", "known-answer-concurrent", "tool-call-auto", "tool-call-streamed", "tool-result",
    "top-logprobs", "prompt-logprobs", "json-schema", "logit-bias", "min-p", "min-tokens", "bad-words", "seed",
    "sampling-concurrent", "prefix-cache", "needles", "server-health",
    "same-step-prefix", "preemption", "chunked-prompt-logprobs", "batch-composition",
})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Probe(_Model):
    """A small shell command that demonstrates the bug (exits non-zero while the bug is there)."""

    probe: str


def _inside_package(rel: str) -> str:
    """A pack path must stay inside site-packages (apply_all.py refuses the same paths): no '..', '.', empty or
    absolute parts."""
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{rel!r} is not a path inside a package")
    return rel


class Target(_Model):
    path: str = Field(description="Package-relative path, e.g. vllm/compilation/decorators.py")
    pre: str | None = Field(description="sha256 in the pristine image; None: the fix creates the file")
    post: str | None = Field(description="sha256 after this fix alone; None: unknown (no payload) or deleted")

    @field_validator("path")
    @classmethod
    def _path_inside(cls, path: str) -> str:
        return _inside_package(path)


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

    @field_validator("files")
    @classmethod
    def _files_inside(cls, files: dict[str, str | None]) -> dict[str, str | None]:
        for rel in files:
            _inside_package(rel)
        return files


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


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FixPackError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise FixPackError(f"{path}: not a JSON object")
    return data


def load_pack(root: Path | None = None) -> FixPack:
    """Read fixes/ (or ``root``): the same cross-checks as apply_all.py, raised as FixPackError naming the file."""
    root = FIXES_DIR if root is None else Path(root)
    order_file = root / "ORDER"
    try:
        order = [ln.split("#", 1)[0].strip() for ln in order_file.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise FixPackError(f"{order_file}: unreadable ({exc.strerror})") from None
    order = [x for x in order if x]
    fixes: dict[str, Fix] = {}
    profiles: dict[str, Profile] = {}
    for pfile in sorted(root.glob("*/profile.json")):
        raw = _read_json(pfile)
        name = raw.get("name")
        if name != pfile.parent.name:
            raise FixPackError(f"{pfile}: name {name!r} must equal the folder name")
        ids = []
        for ffile in sorted(pfile.parent.glob("*/fix.json")):
            meta = _read_json(ffile)
            payload = meta.pop("payload", None)
            meta.update(profile=name, has_payload=payload is not None)
            try:
                fix = Fix.model_validate(meta)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                raise FixPackError(f"{ffile}: {where}: {err['msg']}") from None
            if fix.id != ffile.parent.name:
                raise FixPackError(f"{ffile}: id {fix.id!r} must equal the folder name")
            if fix.id in fixes:
                raise FixPackError(f"{ffile}: fix id {fix.id!r} is also in profile {fixes[fix.id].profile}")
            if fix.id not in order:
                raise FixPackError(f"{order_file}: fix {fix.id!r} is not listed")
            if payload is not None and not (ffile.parent / payload).is_file():
                raise FixPackError(f"{ffile}: payload {payload} is missing")
            fixes[fix.id] = fix
            ids.append(fix.id)
        ids.sort(key=order.index)
        try:
            profiles[name] = Profile.model_validate({**raw, "fixes": ids})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise FixPackError(f"{pfile}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    for fix_id in order:
        if fix_id not in fixes:
            raise FixPackError(f"{order_file}: {fix_id!r} names no fix")
    for fix in fixes.values():
        for dep in fix.depends_on:
            if dep not in fixes or fixes[dep].profile != fix.profile:
                raise FixPackError(f"fix {fix.id!r}: depends on unknown fix {dep!r}")
            if order.index(dep) > order.index(fix.id):
                raise FixPackError(f"{order_file}: {fix.id!r} depends on {dep!r}, which comes later")
        for other in fix.conflicts:
            if other not in fixes:
                raise FixPackError(f"fix {fix.id!r}: conflicts with unknown fix {other!r}")
        for target in fix.targets or []:
            pristine = profiles[fix.profile].files
            if target.path not in pristine or pristine[target.path] != target.pre:
                raise FixPackError(f"fix {fix.id!r}: target {target.path} disagrees with profile {fix.profile}")
    return FixPack(root=root, order=order, fixes=fixes, profiles=profiles)
