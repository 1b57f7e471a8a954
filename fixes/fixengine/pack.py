"""The pack on disk: profiles, fixes and each profile's ORDER, read and cross-checked into plain dataclasses.

The one reader of the pack: ``cookbook.fixpack`` builds its typed models from what this module loads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from .base import EXIT_USAGE, FIX_ID_RE, FixError, KINDS, PACK_DIR, PROOF_LABELS, SHA_RE, safe_rel, sha256
from .diff import parse_diff


@dataclass
class Target:
    path: str
    pre: str | None   # sha256 in the pristine image; None: the fix creates the file
    post: str | None  # sha256 after this fix alone on the pristine file; None: unknown (no payload) or deleted


@dataclass
class Fix:
    id: str
    profile: str
    title: str
    kind: str
    opt_in: bool
    depends_on: list[str]
    conflicts: list[str]
    targets: list[Target] | None  # None: the target files are not known
    payload_path: Path | None     # None: the payload is not in this pack
    meta: dict[str, Any]
    source: Path                  # its fix.json

    @property
    def has_payload(self) -> bool:
        return self.payload_path is not None

    def payload(self) -> bytes:
        assert self.payload_path is not None
        return self.payload_path.read_bytes()

    def payload_sha256(self) -> str:
        return sha256(self.payload()) or ""


@dataclass
class Pin:
    what: str
    dist: str
    version: str | None = None
    version_prefix: str | None = None
    commit: str | None = None
    required: bool = True


@dataclass
class Profile:
    name: str
    title: str
    image: str
    anchor: str
    pins: list[Pin]
    files: dict[str, str | None]  # package-relative path -> pristine sha256 (None: must be absent)
    fixes: list[Fix]              # in the profile's order
    order_file: Path | None = None  # its ORDER
    meta: dict[str, Any] = field(default_factory=dict)  # profile.json as read

    def fix(self, fix_id: str) -> Fix | None:
        return next((f for f in self.fixes if f.id == fix_id), None)


@dataclass
class Pack:
    root: Path
    order: list[str]  # every profile's ORDER, profile after profile (names are unique in the pack)
    profiles: dict[str, Profile]

    def all_fixes(self) -> list[Fix]:
        fixes = [f for p in self.profiles.values() for f in p.fixes]
        return sorted(fixes, key=lambda f: self.order.index(f.id))


def _pack_error(where: Path | str, message: str) -> FixError:
    return FixError(EXIT_USAGE, f"pack error: {where}: {message}")


def _require(obj: dict[str, Any], key: str, typ: type | tuple[type, ...], where: Path) -> Any:
    if key not in obj:
        raise _pack_error(where, f"missing field '{key}'")
    if not isinstance(obj[key], typ):
        raise _pack_error(where, f"field '{key}' has the wrong type")
    return obj[key]


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _pack_error(path, f"unreadable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _pack_error(path, "not a JSON object")
    return data


def _load_fix(path: Path, profile: str, checks: Collection[str] | None = None) -> Fix:
    meta = _load_json(path)
    fix_id = _require(meta, "id", str, path)
    if not FIX_ID_RE.match(fix_id) or fix_id != path.parent.name:
        raise _pack_error(path, f"id '{fix_id}' must be lower-case and equal the folder name")
    for key in ("title", "why", "origin", "remove_when"):
        _require(meta, key, str, path)
    kind = _require(meta, "kind", str, path)
    if kind not in KINDS:
        raise _pack_error(path, f"kind '{kind}' is not one of {', '.join(KINDS)}")
    _require(meta, "upstream", list, path)
    opt_in = _require(meta, "opt_in", bool, path)
    depends = _require(meta, "depends_on", list, path)
    conflicts = _require(meta, "conflicts", list, path)
    check = _require(meta, "check", (str, dict), path)
    if isinstance(check, dict) and not isinstance(check.get("probe"), str):
        raise _pack_error(path, "check must be a check name or {\"probe\": \"<command>\"}")
    if isinstance(check, str) and checks is not None and check not in checks:
        raise _pack_error(path, f"field 'check': '{check}' is not a check of the verification suite "
                                f"(checks: {', '.join(sorted(checks))})")
    proof = meta.get("proof")
    if proof is not None:
        if not isinstance(proof, dict) or proof.get("shown") not in PROOF_LABELS:
            raise _pack_error(path, f"field 'proof.shown' must be one of {', '.join(PROOF_LABELS)}")
        for key in ("test", "summary"):
            if not isinstance(proof.get(key), str) or not proof[key]:
                raise _pack_error(path, f"field 'proof.{key}' must be a non-empty string")
        if proof.get("hook") is not None and not isinstance(proof["hook"], str):
            raise _pack_error(path, "field 'proof.hook' must be a string or null")
        if set(proof) - {"shown", "hook", "test", "summary"}:
            raise _pack_error(path, f"field 'proof' has unknown keys {sorted(set(proof) - {'shown', 'hook', 'test', 'summary'})}")
    raw_targets = meta.get("targets")
    targets: list[Target] | None = None
    if raw_targets is not None:
        if not isinstance(raw_targets, list):
            raise _pack_error(path, "targets must be a list or null (unknown)")
        targets = []
        for t in raw_targets:
            if not isinstance(t, dict) or not isinstance(t.get("path"), str):
                raise _pack_error(path, "each target needs a 'path'")
            if not safe_rel(t["path"]):
                raise _pack_error(path, f"target '{t['path']}' is not a path inside a package "
                                        f"(no '..', '.', empty or absolute parts)")
            for key in ("pre", "post"):
                if t.get(key) is not None and not SHA_RE.match(str(t[key])):
                    raise _pack_error(path, f"target {t['path']}: '{key}' is not a sha256")
            targets.append(Target(t["path"], t.get("pre"), t.get("post")))
    payload_name = meta.get("payload")
    payload_path: Path | None = None
    if payload_name is not None:
        if not isinstance(payload_name, str) or "/" in payload_name:
            raise _pack_error(path, "payload must be a file name in the fix folder, or null")
        payload_path = path.parent / payload_name
        if not payload_path.is_file():
            raise _pack_error(path, f"payload {payload_name} is missing")
        if not targets:
            raise _pack_error(path, "a fix with a payload must list its targets")
        try:
            patches = parse_diff(payload_path.read_bytes(), str(payload_path))
        except ValueError as exc:
            raise _pack_error(path, str(exc)) from None
        diff_paths = sorted(p.path for p in patches)
        if diff_paths != sorted(t.path for t in targets):
            raise _pack_error(path, f"payload touches {diff_paths}, targets list {[t.path for t in targets]}")
        for t in targets:
            if t.post is None and any(p.path == t.path and p.new_path is not None for p in patches):
                raise _pack_error(path, f"target {t.path}: a fix with a payload needs its post sha256")
    return Fix(fix_id, profile, meta["title"], kind, opt_in, list(depends), list(conflicts), targets,
               payload_path, meta, path)


def read_order(order_file: Path) -> list[str]:
    """A profile's ORDER: one fix id a line, ``#`` starts a comment, each id once."""
    try:
        lines = order_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise _pack_error(order_file, f"unreadable ({exc.strerror})") from None
    order = [x for x in (ln.split("#", 1)[0].strip() for ln in lines) if x]
    if len(set(order)) != len(order):
        raise _pack_error(order_file, "a fix id appears twice")
    return order


def load_pack(root: Path = PACK_DIR, checks: Collection[str] | None = None) -> Pack:
    """Read and cross-check the whole pack; any inconsistency is a one-line pack error.

    Each profile keeps its own order (``<profile>/ORDER``).  ``checks``: the verification suite's check names (the
    cookbook passes its check registry's); a fix whose ``check`` names another is a pack error.  The engine itself
    passes none: a bare image has no registry."""
    if (root / "ORDER").exists():
        raise _pack_error(root / "ORDER", "the pack has no global order: each profile keeps its own "
                                          "(<profile>/ORDER); move these lines there")
    profiles: dict[str, Profile] = {}
    seen: dict[str, Fix] = {}
    pack_order: list[str] = []
    for pfile in sorted(root.glob("*/profile.json")):
        meta = _load_json(pfile)
        name = _require(meta, "name", str, pfile)
        if name != pfile.parent.name:
            raise _pack_error(pfile, f"name '{name}' must equal the folder name")
        order_file = pfile.parent / "ORDER"
        order = read_order(order_file)
        pins = []
        for raw in _require(meta, "pins", list, pfile):
            if not isinstance(raw, dict) or not isinstance(raw.get("dist"), str):
                raise _pack_error(pfile, "each pin needs a 'dist'")
            pins.append(Pin(raw.get("what", raw["dist"]), raw["dist"], raw.get("version"),
                            raw.get("version_prefix"), raw.get("commit"), bool(raw.get("required", True))))
        files = _require(meta, "files", dict, pfile)
        fixes = []
        for ffile in sorted(pfile.parent.glob("*/fix.json")):
            fix = _load_fix(ffile, name, checks)
            if fix.id in seen:
                raise _pack_error(ffile, f"fix id '{fix.id}' is also in profile {seen[fix.id].profile}")
            if fix.id not in order:
                raise _pack_error(order_file, f"fix '{fix.id}' is not listed")
            for t in fix.targets or []:
                if t.path not in files:
                    raise _pack_error(ffile, f"target {t.path} is not in {name}'s image files")
                if t.pre != files[t.path]:
                    raise _pack_error(ffile, f"target {t.path}: pre sha256 differs from the profile's")
            seen[fix.id] = fix
            fixes.append(fix)
        for rel, digest in files.items():  # after the fixes, so a bad target path is named in its fix.json
            if not safe_rel(rel):
                raise _pack_error(pfile, f"file '{rel}' is not a path inside a package "
                                         f"(no '..', '.', empty or absolute parts)")
            if digest is not None and not SHA_RE.match(str(digest)):
                raise _pack_error(pfile, f"file {rel}: not a sha256")
        ids = {f.id for f in fixes}
        for fix_id in order:
            if fix_id not in ids:
                raise _pack_error(order_file, f"'{fix_id}' names no fix of profile {name}")
        for fix in fixes:
            for dep in fix.depends_on:
                if dep not in ids:
                    raise _pack_error(fix.source, f"depends on unknown fix '{dep}'")
                if order.index(dep) > order.index(fix.id):
                    raise _pack_error(order_file, f"'{fix.id}' depends on '{dep}', which comes later")
        fixes.sort(key=lambda f: order.index(f.id))
        pack_order.extend(order)
        profiles[name] = Profile(name, meta.get("title", name), meta.get("image", ""),
                                 _require(meta, "anchor", str, pfile), pins, files, fixes, order_file, meta)
    for fix in seen.values():
        for other in fix.conflicts:
            if other not in seen:
                raise _pack_error(fix.source, f"conflicts with unknown fix '{other}'")
    return Pack(root, pack_order, profiles)
