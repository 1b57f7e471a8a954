#!/usr/bin/env python3
"""Apply the Gaudi Cookbook fix pack to the packages of a stock image, safely, at every container start.

Standalone on purpose: Python 3.10+ standard library only, no import of ``cookbook``, because it runs inside a
bare vllm-gaudi (or vllm-cpu) image before ``vllm serve``.  The pack lives next to this file:

    fixes/ORDER                         pack-wide order, one fix id a line
    fixes/<profile>/profile.json        image pins and the sha256 of every file the profile's fixes touch
    fixes/<profile>/<fix>/fix.json      metadata of one fix
    fixes/<profile>/<fix>/payload.diff  its payload (a unified diff of our own writing), if the pack has it

Guarantees: nothing is written unless the image matches and every selected payload applies; each file is written
via a temp file and an atomic rename; a failure restores every touched file; a journal written before the first
rename lets the next run repair a run that was killed; a ledger next to the package makes re-runs no-ops and
reverts byte-identical; when the ledger or journal cannot be trusted, a full revert restores the originals saved
before the first write (the blob store).  ``--capture`` is the authoring side: it writes a fix's payload and hashes
from an edited copy of the image's files.  See docs/fixes.md for the format, the ledger, recovery and exit codes.
"""
from __future__ import annotations

import argparse
import difflib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_IMAGE = 2
EXIT_STATE = 3
EXIT_IO = 4

KINDS = ("bugfix", "backport", "workaround")
STATE_DIR = ".cookbook-fixes"
LEDGER_FORMAT = 1
TMP_SUFFIX = ".cbfix-tmp"
FIX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
PACK_DIR = Path(__file__).resolve().parent


class FixError(Exception):
    """An expected failure: one line naming the fix, file or flag, plus the exit code it maps to."""

    def __init__(self, code: int, message: str, details: list[str] | None = None,
                 data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details or []
        self.data = data or {}


class StateError(FixError):
    """The ledger or the journal cannot be trusted: unreadable, or a field missing or of the wrong type (exit 3).

    ``problem`` is the one-line diagnosis; the message adds the command that gets the image back."""

    def __init__(self, path: Path, problem: str, hint: str = "") -> None:
        super().__init__(EXIT_STATE, f"{path}: {problem}" + (f"; {hint}" if hint else ""))
        self.path = path
        self.problem = problem


def safe_rel(rel: object) -> bool:
    """A package-relative path that cannot leave site-packages: no '..', '.', empty or absolute parts."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def short(digest: str | None) -> str:
    return "absent" if digest is None else digest[:12]


# --------------------------------------------------------------------------------------------------------------
# Unified diffs: a small, strict applier (exact context, no fuzz).
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, bytes]] = field(default_factory=list)  # (" " | "-" | "+", line with its newline)

    def old_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag in " -"]

    def new_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag in " +"]


@dataclass
class FilePatch:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _diff_path(raw: bytes) -> str | None:
    name = raw.split(b"\t", 1)[0].strip().decode("utf-8")
    if name == "/dev/null":
        return None
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def parse_diff(data: bytes, origin: str = "payload") -> list[FilePatch]:
    """Parse a unified diff; anything malformed is an error, never a guess."""
    patches: list[FilePatch] = []
    lines = data.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise ValueError(f"{origin}: '---' at line {i + 1} is not followed by '+++'")
        patch = FilePatch(_diff_path(line[4:]), _diff_path(lines[i + 1][4:]))
        if patch.old_path is None and patch.new_path is None:
            raise ValueError(f"{origin}: /dev/null on both sides at line {i + 1}")
        i += 2
        while i < len(lines) and lines[i].startswith(b"@@"):
            m = HUNK_RE.match(lines[i])
            if not m:
                raise ValueError(f"{origin}: bad hunk header at line {i + 1}")
            hunk = Hunk(int(m[1]), int(m[2] if m[2] is not None else 1),
                        int(m[3]), int(m[4] if m[4] is not None else 1))
            i += 1
            old_seen = new_seen = 0
            while i < len(lines) and (old_seen < hunk.old_len or new_seen < hunk.new_len):
                raw = lines[i]
                tag, text = raw[:1].decode("latin-1"), raw[1:]
                if raw in (b"\n", b"\r\n"):  # an empty context line whose leading space was stripped
                    tag, text = " ", raw
                if tag not in " -+":
                    raise ValueError(f"{origin}: unexpected line {i + 1} inside a hunk of {patch.path}")
                hunk.lines.append((tag, text))
                old_seen += tag in " -"
                new_seen += tag in " +"
                i += 1
                if i < len(lines) and lines[i].startswith(b"\\"):
                    t, last = hunk.lines[-1]
                    hunk.lines[-1] = (t, last.rstrip(b"\r\n"))
                    i += 1
            if old_seen != hunk.old_len or new_seen != hunk.new_len:
                raise ValueError(f"{origin}: hunk at line {i} of {patch.path} has wrong line counts")
            patch.hunks.append(hunk)
        if not patch.hunks:
            raise ValueError(f"{origin}: no hunks for {patch.path}")
        patches.append(patch)
    if not patches:
        raise ValueError(f"{origin}: no file patches found")
    return patches


class HunkMismatch(Exception):
    """A hunk's context or removed lines are not in the file exactly."""


def apply_file_patch(old: bytes | None, patch: FilePatch) -> bytes | None:
    """Apply one file's hunks.  Context must match byte for byte; a hunk may sit at another line only if its
    exact context occurs exactly once in the rest of the file (the case of two fixes stacked on one file)."""
    if patch.old_path is None:
        if old is not None:
            raise HunkMismatch(f"{patch.path} already exists; the patch creates it")
        return b"".join(text for h in patch.hunks for text in h.new_lines())
    if old is None:
        raise HunkMismatch(f"{patch.path} does not exist")
    src = old.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0
    for n, hunk in enumerate(patch.hunks, 1):
        want = hunk.old_lines()
        expected = hunk.old_start - 1 if hunk.old_len else hunk.old_start
        expected = max(expected, 0)
        if expected >= pos and src[expected:expected + len(want)] == want:
            at = expected
        else:
            hits = [k for k in range(pos, len(src) - len(want) + 1) if src[k:k + len(want)] == want]
            if len(hits) != 1 or not want:
                where = "not found" if not hits else f"found {len(hits)} times"
                raise HunkMismatch(f"hunk {n} of {patch.path} does not apply (context {where}, "
                                   f"expected at line {expected + 1})")
            at = hits[0]
        out.extend(src[pos:at])
        out.extend(hunk.new_lines())
        pos = at + len(want)
    out.extend(src[pos:])
    if patch.new_path is None:
        if out:
            raise HunkMismatch(f"{patch.path}: deletion patch leaves content")
        return None
    return b"".join(out)


# --------------------------------------------------------------------------------------------------------------
# The pack: profiles, fixes, order.
# --------------------------------------------------------------------------------------------------------------

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
    fixes: list[Fix]              # in pack order

    def fix(self, fix_id: str) -> Fix | None:
        return next((f for f in self.fixes if f.id == fix_id), None)


@dataclass
class Pack:
    root: Path
    order: list[str]
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


def _load_fix(path: Path, profile: str) -> Fix:
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


def load_pack(root: Path = PACK_DIR) -> Pack:
    """Read and cross-check the whole pack; any inconsistency is a one-line pack error."""
    order_file = root / "ORDER"
    try:
        order = [ln.split("#", 1)[0].strip() for ln in order_file.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise _pack_error(order_file, f"unreadable ({exc.strerror})") from None
    order = [x for x in order if x]
    if len(set(order)) != len(order):
        raise _pack_error(order_file, "a fix id appears twice")
    profiles: dict[str, Profile] = {}
    seen: dict[str, Fix] = {}
    for pfile in sorted(root.glob("*/profile.json")):
        meta = _load_json(pfile)
        name = _require(meta, "name", str, pfile)
        if name != pfile.parent.name:
            raise _pack_error(pfile, f"name '{name}' must equal the folder name")
        pins = []
        for raw in _require(meta, "pins", list, pfile):
            if not isinstance(raw, dict) or not isinstance(raw.get("dist"), str):
                raise _pack_error(pfile, "each pin needs a 'dist'")
            pins.append(Pin(raw.get("what", raw["dist"]), raw["dist"], raw.get("version"),
                            raw.get("version_prefix"), raw.get("commit"), bool(raw.get("required", True))))
        files = _require(meta, "files", dict, pfile)
        fixes = []
        for ffile in sorted(pfile.parent.glob("*/fix.json")):
            fix = _load_fix(ffile, name)
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
        fixes.sort(key=lambda f: order.index(f.id))
        profiles[name] = Profile(name, meta.get("title", name), meta.get("image", ""),
                                 _require(meta, "anchor", str, pfile), pins, files, fixes)
    for fix_id in order:
        if fix_id not in seen:
            raise _pack_error(order_file, f"'{fix_id}' names no fix")
    for fix in seen.values():
        for dep in fix.depends_on:
            if dep not in seen or seen[dep].profile != fix.profile:
                raise _pack_error(fix.source, f"depends on unknown fix '{dep}'")
            if order.index(dep) > order.index(fix.id):
                raise _pack_error(order_file, f"'{fix.id}' depends on '{dep}', which comes later")
        for other in fix.conflicts:
            if other not in seen:
                raise _pack_error(fix.source, f"conflicts with unknown fix '{other}'")
    return Pack(root, order, profiles)


# --------------------------------------------------------------------------------------------------------------
# Locating the image's packages, and the image gate.
# --------------------------------------------------------------------------------------------------------------

def locate_package(package: str, root: Path | None) -> Path | None:
    """The site-packages folder that holds ``package``, without importing it."""
    if root is not None:
        return root if (root / package).is_dir() or (root / f"{package}.py").is_file() else None
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve().parent
    if spec.origin:
        return Path(spec.origin).resolve().parent
    return None


def _norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_distribution(dist: str, search: list[Path] | None) -> importlib.metadata.Distribution | None:
    paths = [str(p) for p in search] if search is not None else None
    for d in importlib.metadata.distributions(**({"path": paths} if paths is not None else {})):
        try:
            if _norm_dist(d.metadata["Name"] or "") == _norm_dist(dist):
                return d
        except Exception:  # a broken dist-info must not break the gate
            continue
    return None


def check_pin(pin: Pin, search: list[Path] | None) -> tuple[str, str, bool]:
    """Return (expected, found, ok) for one pin.  Commit pins are weak: only checked when visible."""
    expected = " ".join(x for x in (pin.version and f"=={pin.version}",
                                    pin.version_prefix and f"{pin.version_prefix}*",
                                    pin.commit and f"commit {pin.commit[:9]}") if x)
    dist = find_distribution(pin.dist, search)
    if dist is None:
        return expected, "not installed", not pin.required
    found = dist.version
    ok = True
    if pin.version is not None and found != pin.version:
        ok = False
    if pin.version_prefix is not None and not found.startswith(pin.version_prefix):
        ok = False
    if pin.commit is not None:
        commits = re.findall(r"\bg([0-9a-f]{7,40})\b", found.split("+", 1)[1] if "+" in found else "")
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
            vcs_commit = direct.get("vcs_info", {}).get("commit_id")
            if vcs_commit:
                commits.append(vcs_commit)
        except ValueError:
            pass
        if commits:
            ok = ok and all(pin.commit.startswith(c) or c.startswith(pin.commit) for c in commits)
            found += f" (commit {commits[0][:9]})"
        else:
            found += " (commit not recorded: the file hashes decide)"
    return expected, found, ok


# --------------------------------------------------------------------------------------------------------------
# State next to the package: ledger, journal, blobs, lock.
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Image:
    """Where a profile's files live in this image."""

    profile: Profile
    root: Path | None
    sites: dict[str, Path | None]  # top-level package -> site-packages folder

    @classmethod
    def locate(cls, profile: Profile, root: Path | None) -> "Image":
        pkgs = {profile.anchor} | {rel.split("/", 1)[0] for rel in profile.files}
        return cls(profile, root, {p: locate_package(p, root) for p in sorted(pkgs)})

    @property
    def state_dir(self) -> Path | None:
        site = self.sites.get(self.profile.anchor)
        return None if site is None else site / STATE_DIR

    def path(self, rel: str) -> Path | None:
        site = self.sites.get(rel.split("/", 1)[0])
        return None if site is None else site / rel

    def write_path(self, rel: str) -> Path | None:
        """Where writing ``rel`` goes: the file itself, or, for a symlink, the file it points to (so the link stays
        a link).  A link that is dangling or leaves the package's site-packages folder is refused (exit 4)."""
        path = self.path(rel)
        if path is None or not path.is_symlink():
            return path
        site = self.sites[rel.split("/", 1)[0]]
        assert site is not None
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise FixError(EXIT_IO, f"symlinked target: {rel} is a dangling symlink ({os.readlink(path)}); "
                                    f"refusing to write through it; nothing written") from None
        if not real.is_relative_to(site.resolve()):
            raise FixError(EXIT_IO, f"symlinked target: {rel} is a symlink to {real}, outside {site}; refusing to "
                                    f"write outside site-packages; nothing written")
        return real

    def read(self, rel: str) -> bytes | None:
        path = self.path(rel)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FixError(EXIT_IO, f"cannot read {path}: {exc.strerror}") from None

    def search_paths(self) -> list[Path] | None:
        if self.root is not None:
            return [self.root]
        return None


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file in the same folder, fsync, then rename over the target."""
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        replace_file(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def replace_file(src: Path, dst: Path) -> None:
    """One atomic rename; its own function so tests can inject failures and kills at every file write."""
    os.replace(src, dst)


def remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def drop_pycache(*paths: Path | None) -> None:
    """Remove compiled copies of a patched module (under its own name and, for a symlink, its target's): images
    may compile with unchecked-hash pycs."""
    for path in paths:
        if path is None or path.suffix != ".py":
            continue
        cache = path.parent / "__pycache__"
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            remove_file(pyc)


class Lock:
    """An flock next to the ledger, so two containers sharing a volume cannot interleave.

    Where the lock file cannot be created (a read-only image), runs that need no write still work; one that needs
    to write then stops with the read-only error before touching anything."""

    def __init__(self, state: Path, timeout: float, exclusive: bool = True) -> None:
        self.path = state / "lock"
        self.timeout = timeout
        self.exclusive = exclusive
        self.fd: int | None = None

    def _open(self) -> int | None:
        if self.exclusive:
            try:
                self.path.parent.mkdir(exist_ok=True)
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                pass
        try:
            return os.open(self.path, os.O_RDONLY)  # flock works on a read-only descriptor too
        except OSError:
            return None

    def __enter__(self) -> "Lock":
        self.fd = self._open()
        if self.fd is None:
            return self
        op = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fcntl.flock(self.fd, op | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise FixError(EXIT_IO, f"another apply_all.py run holds {self.path}; "
                                            f"gave up after {self.timeout:g} s (--lock-timeout)") from None
                if not told:
                    print(f"apply_all: waiting for {self.path} (another run holds it)", file=sys.stderr)
                    told = True
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def revert_hint(profile: str | None, root: Path | None, force: bool = False) -> str:
    """The command that gets an image back to its originals from the blob store."""
    where = f" --root {root}" if root is not None else ""
    name = profile or "NAME"
    return f"`apply_all.py --revert{' --force' if force else ''} --profile {name}{where}`"


def _sha_or_null(value: object) -> bool:
    return value is None or (isinstance(value, str) and SHA_RE.match(value) is not None)


def _int_or_null(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


class _Fields:
    """Checks one state file field by field; the first problem is a StateError naming the field."""

    def __init__(self, path: Path, hint: str) -> None:
        self.path = path
        self.hint = hint

    def fail(self, problem: str) -> StateError:
        return StateError(self.path, problem, self.hint)

    def get(self, obj: dict[str, Any], key: str, name: str, ok: Any, what: str) -> Any:
        if key not in obj:
            raise self.fail(f"field '{name}' is missing")
        if not ok(obj[key]):
            raise self.fail(f"field '{name}' should be {what}")
        return obj[key]

    def ledger(self, data: object, prefix: str = "") -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(f"field '{prefix.rstrip('.')}' should be an object" if prefix else "not a JSON object")
        fmt = self.get(data, "format", prefix + "format", lambda v: isinstance(v, int), "an integer")
        if fmt != LEDGER_FORMAT:
            raise self.fail(f"field '{prefix}format' is {fmt}; this tool reads format {LEDGER_FORMAT}")
        self.get(data, "profile", prefix + "profile", lambda v: isinstance(v, str), "a profile name")
        applied = self.get(data, "applied", prefix + "applied", lambda v: isinstance(v, list), "a list")
        for n, entry in enumerate(applied):
            name = f"{prefix}applied[{n}]"
            if not isinstance(entry, dict):
                raise self.fail(f"field '{name}' should be an object")
            self.get(entry, "id", f"{name}.id", lambda v: isinstance(v, str), "a fix id")
            self.get(entry, "payload_sha256", f"{name}.payload_sha256", _sha_or_null, "a sha256")
            files = self.get(entry, "files", f"{name}.files", lambda v: isinstance(v, dict), "an object")
            for rel, digest in files.items():
                if not safe_rel(rel):
                    raise self.fail(f"field '{name}.files.{rel}' is not a path inside a package")
                if not _sha_or_null(digest):
                    raise self.fail(f"field '{name}.files.{rel}' should be a sha256 or null")
        files = self.get(data, "files", prefix + "files", lambda v: isinstance(v, dict), "an object")
        for rel, rec in files.items():
            name = f"{prefix}files.{rel}"
            if not safe_rel(rel):
                raise self.fail(f"field '{name}' is not a path inside a package")
            if not isinstance(rec, dict):
                raise self.fail(f"field '{name}' should be an object")
            for key in ("pristine", "current"):
                self.get(rec, key, f"{name}.{key}", _sha_or_null, "a sha256 or null")
        return data

    def journal(self, data: object) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail("not a JSON object")
        fmt = self.get(data, "format", "format", lambda v: isinstance(v, int), "an integer")
        if fmt != LEDGER_FORMAT:
            raise self.fail(f"field 'format' is {fmt}; this tool reads format {LEDGER_FORMAT}")
        entries = self.get(data, "files", "files", lambda v: isinstance(v, list), "a list")
        for n, entry in enumerate(entries):
            name = f"files[{n}]"
            if not isinstance(entry, dict):
                raise self.fail(f"field '{name}' should be an object")
            self.get(entry, "path", f"{name}.path", safe_rel, "a path inside a package")
            self.get(entry, "before", f"{name}.before", _sha_or_null, "a sha256 or null")
            self.get(entry, "after", f"{name}.after", _sha_or_null, "a sha256 or null")
            self.get(entry, "mode", f"{name}.mode", _int_or_null, "an integer or null")
        before = self.get(data, "ledger_before", "ledger_before", lambda v: v is None or isinstance(v, dict),
                          "a ledger object or null")
        if before is not None:
            self.ledger(before, "ledger_before.")
        return data


def _read_state_json(path: Path, kind: str, hint: str) -> object | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(path, f"{kind} is unreadable ({exc})", hint) from None


def read_ledger(state: Path | None, hint: str = "") -> dict[str, Any] | None:
    """The ledger, checked field by field (a damaged one is a StateError naming the field, never a traceback)."""
    if state is None:
        return None
    path = state / "ledger.json"
    data = _read_state_json(path, "ledger", hint)
    return None if data is None else _Fields(path, hint).ledger(data)


def read_journal(image: Image, hint: str = "") -> dict[str, Any] | None:
    """The journal of an interrupted run, checked field by field; its files must be files of the profile."""
    state = image.state_dir
    if state is None:
        return None
    path = state / "journal.json"
    data = _read_state_json(path, "journal", hint)
    if data is None:
        return None
    fields = _Fields(path, hint)
    journal = fields.journal(data)
    for n, entry in enumerate(journal["files"]):
        if entry["path"] not in image.profile.files:
            raise fields.fail(f"field 'files[{n}].path' ({entry['path']}) is not a file of profile "
                              f"{image.profile.name}")
    return journal


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def store_blob(state: Path, data: bytes) -> str:
    digest = sha256(data) or ""
    blob = state / "blobs" / digest
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(blob, data)
    return digest


def load_blob(state: Path, digest: str) -> bytes:
    blob = state / "blobs" / digest
    try:
        data = blob.read_bytes()
    except OSError:
        raise FixError(EXIT_STATE, f"saved original {blob} is missing; cannot restore") from None
    if sha256(data) != digest:
        raise FixError(EXIT_STATE, f"saved original {blob} is corrupt; cannot restore")
    return data


def recover(image: Image, dry_run: bool = False, hint: str = "") -> str | None:
    """Repair a run that was killed mid-apply: roll every journaled file back to its state before that run.

    Called with the exclusive lock held, so a journal here means its writer died."""
    state = image.state_dir
    if state is None:
        return None
    journal_path = state / "journal.json"
    journal = read_journal(image, hint)
    if journal is None:
        return None
    if journal["ledger_before"] is not None:
        check_ledger_files(image, journal["ledger_before"], journal_path, hint)
    if dry_run:
        raise FixError(EXIT_STATE, f"partial state: an interrupted run (pid {journal.get('pid')}) left "
                                   f"{journal_path}; a real run repairs it first")
    restored = 0
    for entry in journal["files"]:
        path = image.write_path(entry["path"])
        if path is None:
            raise FixError(EXIT_STATE, f"partial state: {entry['path']} cannot be located to repair it")
        tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
        remove_file(tmp)
        current = sha256(image.read(entry["path"]))
        if current == entry["before"]:
            continue
        if current != entry["after"]:
            raise StateError(journal_path, f"partial state: {path} is neither before nor after the interrupted run "
                                           f"(found {short(current)})", hint)
        if entry["before"] is None:
            remove_file(path)
        else:
            write_atomic(path, load_blob(state, entry["before"]), entry.get("mode"))
        drop_pycache(path, image.path(entry["path"]))
        restored += 1
    if journal.get("ledger_before") is None:
        remove_file(state / "ledger.json")
    else:
        write_json(state / "ledger.json", journal["ledger_before"])
    remove_file(journal_path)
    return (f"repaired an interrupted run (pid {journal.get('pid')}, {journal.get('action')}): "
            f"{restored} file(s) rolled back")


# --------------------------------------------------------------------------------------------------------------
# Planning: compute every file's new content in memory before writing anything.
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Plan:
    profile: Profile
    selected: list[Fix]
    current: dict[str, bytes | None]
    target: dict[str, bytes | None]
    per_fix: dict[str, dict[str, str | None]]  # fix id -> {path: sha256 after that fix}
    pristine: dict[str, bytes | None]

    def changes(self) -> list[str]:
        return [rel for rel in self.profile.files if self.current.get(rel) != self.target.get(rel)]


def gate(image: Image, ledger: dict[str, Any] | None, allow_drift: bool = False
         ) -> tuple[dict[str, bytes | None], list[dict[str, Any]]]:
    """Read every profile file and compare with the pristine image (or the ledger's record).

    Raises exit 3 for drift from what we applied (unless ``allow_drift``: a forced revert; such rows carry
    ``"drift": True``), exit 2 (with a table) for an image that is not the pinned one."""
    profile = image.profile
    ledger_files = (ledger or {}).get("files", {})
    current: dict[str, bytes | None] = {}
    rows: list[dict[str, Any]] = []
    drift = []
    for pin in profile.pins:
        expected, found, ok = check_pin(pin, image.search_paths())
        rows.append({"what": pin.what, "expected": expected, "found": found, "ok": ok})
    for rel, pristine in profile.files.items():
        path = image.path(rel)
        data = image.read(rel)
        found = sha256(data)
        current[rel] = data
        if path is None:
            rows.append({"what": rel, "expected": short(pristine), "found": "package not found", "ok": False})
            continue
        if rel in ledger_files:
            want = ledger_files[rel]["current"]
            if found != want:
                drift.append(f"{rel} (applied {short(want)}, found {short(found)})")
            rows.append({"what": rel, "expected": f"{short(want)} (applied)", "found": short(found),
                         "ok": found == want or allow_drift, **({"drift": True} if found != want else {})})
        else:
            rows.append({"what": rel, "expected": short(pristine), "found": short(found), "ok": found == pristine})
    if drift and not allow_drift:
        raise FixError(EXIT_STATE, f"drift: changed since the fixes were applied: {'; '.join(drift)}; to recover: "
                                   f"put back the applied version of each (--status shows it) and run again, or "
                                   f"{revert_hint(profile.name, image.root, force=True)} to restore the saved "
                                   f"originals, discarding that change", data={"gate": rows})
    if not all(r["ok"] for r in rows):
        saved = orphaned_originals(image, ledger, current)
        hint = (f"; {', '.join(saved)} {'was' if len(saved) == 1 else 'were'} patched by an earlier run whose "
                f"ledger is gone (the originals are saved): {revert_hint(profile.name, image.root)} restores them"
                if saved else "")
        raise FixError(EXIT_IMAGE, f"image mismatch: this is not the image profile {profile.name} pins "
                                   f"({profile.image}); nothing written{hint}",
                       details=gate_table(rows), data={"gate": rows})
    return current, rows


def orphaned_originals(image: Image, ledger: dict[str, Any] | None, current: dict[str, bytes | None]) -> list[str]:
    """Files that differ from the profile while no ledger records them, whose originals are in the blob store: the
    trace of a ledger removed by hand."""
    state = image.state_dir
    recorded = (ledger or {}).get("files", {})
    if state is None or not (state / "blobs").is_dir():
        return []
    return [rel for rel, want in image.profile.files.items()
            if rel not in recorded and want is not None and sha256(current.get(rel)) != want
            and (state / "blobs" / want).is_file()]


def gate_table(rows: list[dict[str, Any]]) -> list[str]:
    width = max(len(r["what"]) for r in rows)
    out = [f"  {'':10}{'what':<{width}}  {'expected':<28}  found"]
    for r in rows:
        mark = "ok" if r["ok"] else "MISMATCH"
        out.append(f"  {mark:<10}{r['what']:<{width}}  {r['expected']:<28}  {r['found']}")
    return out


def pristine_contents(image: Image, current: dict[str, bytes | None],
                      ledger: dict[str, Any] | None) -> dict[str, bytes | None]:
    """The image's original files: the current ones, or the originals saved when the fixes were applied."""
    pristine = dict(current)
    state = image.state_dir
    for rel, rec in ((ledger or {}).get("files") or {}).items():
        if rec["pristine"] is None:
            pristine[rel] = None
        elif sha256(current.get(rel)) != rec["pristine"]:
            assert state is not None
            pristine[rel] = load_blob(state, rec["pristine"])
    for rel, want in image.profile.files.items():
        if sha256(pristine.get(rel)) != want:
            raise FixError(EXIT_STATE, f"saved original of {rel} does not match the profile's sha256")
    return pristine


def build_plan(image: Image, current: dict[str, bytes | None], ledger: dict[str, Any] | None,
               selected: list[Fix]) -> Plan:
    """Apply the selected payloads, in pack order, to the pristine files in memory (strict hunks)."""
    pristine = pristine_contents(image, current, ledger)
    target = dict(pristine)
    touched: set[str] = set()
    per_fix: dict[str, dict[str, str | None]] = {}
    for fix in selected:
        try:
            patches = parse_diff(fix.payload(), f"{fix.id}/payload.diff")
        except (OSError, ValueError) as exc:
            raise FixError(EXIT_STATE, f"fix {fix.id}: payload unreadable ({exc})") from None
        results: dict[str, str | None] = {}
        for patch in patches:
            try:
                target[patch.path] = apply_file_patch(target.get(patch.path), patch)
            except HunkMismatch as exc:
                raise FixError(EXIT_STATE, f"conflict: fix {fix.id}: {exc}; nothing written") from None
            results[patch.path] = sha256(target[patch.path])
            tgt = next(t for t in fix.targets or [] if t.path == patch.path)
            if patch.path not in touched and results[patch.path] != tgt.post:
                raise FixError(EXIT_STATE, f"fix {fix.id}: {patch.path} after the payload is "
                                           f"{short(results[patch.path])}, metadata says {short(tgt.post)}")
            touched.add(patch.path)
        per_fix[fix.id] = results
    return Plan(image.profile, selected, current, target, per_fix, pristine)


def check_writable(image: Image, rels: list[str]) -> None:
    """Fail before writing anything if a target or its folder cannot be written (read-only volume, chattr +i)."""
    state = image.state_dir
    assert state is not None
    dirs = {state.parent} | {p.parent for p in (image.write_path(r) for r in rels) if p is not None}
    for d in sorted(dirs):
        while not d.exists() and d != d.parent:  # a fix may create a folder: probe where it would go
            d = d.parent
        probe = d / f".cbfix-probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise FixError(EXIT_IO, f"read-only target: cannot write in {d}: {exc.strerror}; nothing written") \
                from None
    for rel in rels:
        path = image.write_path(rel)
        if path is not None and path.exists() and not os.access(path, os.W_OK):
            raise FixError(EXIT_IO, f"read-only target: {path} is not writable; nothing written")


def commit(image: Image, plan: Plan, ledger_before: dict[str, Any] | None,
           ledger_after: dict[str, Any] | None, action: str) -> list[str]:
    """Write the planned files: journal first, then one atomic rename per file; on any failure restore all."""
    state = image.state_dir
    assert state is not None
    rels = plan.changes()
    check_writable(image, rels)
    entries = []
    try:
        state.mkdir(exist_ok=True)
        for rel in rels:
            path = image.write_path(rel)
            assert path is not None
            before = plan.current[rel]
            mode = path.stat().st_mode & 0o7777 if before is not None else None
            for blob in (before, plan.pristine[rel]):
                if blob is not None:
                    store_blob(state, blob)
            entries.append({"path": rel, "before": sha256(before), "after": sha256(plan.target[rel]),
                            "mode": mode})
        write_json(state / "journal.json", {"format": LEDGER_FORMAT, "pid": os.getpid(), "action": action,
                                            "started": _now(), "files": entries, "ledger_before": ledger_before})
    except OSError as exc:
        raise FixError(EXIT_IO, f"cannot write {exc.filename or state}: {exc.strerror}; nothing written") from None
    done: list[tuple[str, Path, int | None]] = []
    try:
        for entry in entries:
            rel = entry["path"]
            path = image.write_path(rel)  # a symlink's target: the link itself stays
            link = image.path(rel)
            assert path is not None and link is not None
            new = plan.target[rel]
            done.append((rel, path, entry["mode"]))
            if new is None:
                remove_file(link)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, new, entry["mode"])
            drop_pycache(link, path)
        if ledger_after is None:
            remove_file(state / "ledger.json")
        else:
            write_json(state / "ledger.json", ledger_after)
    except BaseException as exc:
        _restore(plan, done, state, exc)
        raise
    remove_file(state / "journal.json")
    gc_blobs(state, ledger_after)
    return rels


def _restore(plan: Plan, done: list[tuple[str, Path, int | None]], state: Path, exc: BaseException) -> None:
    """Undo the files written so far; a FixError says what happened (the journal stays if the undo failed)."""
    try:
        for rel, path, mode in reversed(done):
            old = plan.current[rel]
            if old is None:
                remove_file(path)
            elif sha256(image_bytes(path)) != sha256(old):
                write_atomic(path, old, mode)
            drop_pycache(path)
        remove_file(state / "journal.json")
    except OSError as exc2:
        raise FixError(EXIT_STATE, f"partial state: a write failed ({exc}) and the restore failed too "
                                   f"({exc2.strerror} on {exc2.filename}); the next run repairs it") from None
    if isinstance(exc, OSError):
        hint = " (read-only target?)" if exc.errno in (1, 13, 30) else ""
        raise FixError(EXIT_IO, f"cannot write {exc.filename or 'a file'}: {exc.strerror}{hint}; "
                                f"every file restored") from None


def image_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def gc_blobs(state: Path, ledger: dict[str, Any] | None) -> None:
    keep = {rec["pristine"] for rec in ((ledger or {}).get("files") or {}).values()}
    blobs = state / "blobs"
    for blob in blobs.glob("*") if blobs.is_dir() else []:
        if blob.name not in keep:
            remove_file(blob)
    if ledger is None:
        for leftover in (blobs,):
            try:
                leftover.rmdir()
            except OSError:
                pass


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("x") else "s")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_ledger(plan: Plan) -> dict[str, Any] | None:
    if not plan.selected:
        return None
    touched = sorted({rel for results in plan.per_fix.values() for rel in results})
    return {
        "format": LEDGER_FORMAT,
        "profile": plan.profile.name,
        "updated": _now(),
        "applied": [{"id": f.id, "payload_sha256": f.payload_sha256(), "files": plan.per_fix[f.id]}
                    for f in plan.selected],
        "files": {rel: {"pristine": sha256(plan.pristine[rel]), "current": sha256(plan.target[rel])}
                  for rel in touched},
    }


# --------------------------------------------------------------------------------------------------------------
# Recovery from the blob store: the way back when the ledger or the journal cannot be trusted.
# --------------------------------------------------------------------------------------------------------------

MAX_STACKED = 10  # fixes on one file whose subsets are tried (2**10 in-memory applies at most)


def known_states(profile: Profile, rel: str, pristine: bytes | None) -> set[str | None]:
    """Every sha256 ``rel`` can have after the profile's payloads, any subset of them in pack order, were applied
    to the pristine file: the states this tool may have left it in."""
    patches = []
    for fix in profile.fixes:
        if fix.has_payload and any(t.path == rel for t in fix.targets or []):
            try:
                patches.append([p for p in parse_diff(fix.payload(), fix.id) if p.path == rel])
            except (OSError, ValueError):
                continue
    states = {sha256(pristine)}
    for mask in range(1, 2 ** min(len(patches), MAX_STACKED)):
        data: bytes | None = pristine
        try:
            for n, fix_patches in enumerate(patches[:MAX_STACKED]):
                if mask >> n & 1:
                    for patch in fix_patches:
                        data = apply_file_patch(data, patch)
        except HunkMismatch:
            continue
        states.add(sha256(data))
    return states


def has_saved_state(state: Path | None) -> bool:
    """Anything an earlier run left that a revert can use: a ledger, a journal or saved originals."""
    if state is None:
        return False
    blobs = state / "blobs"
    return ((state / "ledger.json").exists() or (state / "journal.json").exists()
            or (blobs.is_dir() and any(blobs.iterdir())))


def revert_from_blobs(image: Image, reason: str, dry_run: bool, force: bool) -> Outcome:
    """Restore every file of the profile to the profile's pristine bytes from the blob store, without the ledger.

    Safe without a ledger because each file is restored only when its current bytes are a state the pack's own
    payloads produce (or with ``force``), and the bytes restored are the ones whose sha256 the profile pins.  All or
    nothing: any file that cannot be restored stops the run before anything is written.  Called with the lock."""
    profile = image.profile
    state = image.state_dir
    assert state is not None
    current: dict[str, bytes | None] = {}
    pristine: dict[str, bytes | None] = {}
    problems: list[str] = []
    unknown: list[str] = []
    for rel, want in profile.files.items():
        path = image.write_path(rel)
        if path is None:
            problems.append(f"{rel}: its package is not installed here")
            continue
        if not dry_run:
            remove_file(path.with_name(f".{path.name}{TMP_SUFFIX}"))  # a temp file of a killed run
        data = image.read(rel)
        current[rel] = pristine[rel] = data
        if sha256(data) == want:
            continue
        if want is not None:
            if not (state / "blobs" / want).is_file():
                problems.append(f"{rel} differs from the image (found {short(sha256(data))}) and its original is "
                                f"not in the blob store")
                continue
            pristine[rel] = load_blob(state, want)
        else:
            pristine[rel] = None
        if sha256(data) not in known_states(profile, rel, pristine[rel]):
            unknown.append(rel)
    if problems:
        raise FixError(EXIT_STATE, f"cannot restore from the saved originals: {'; '.join(problems)}; nothing written")
    if unknown and not force:
        raise FixError(EXIT_STATE, f"cannot restore from the saved originals: {', '.join(unknown)} "
                                   f"{'is' if len(unknown) == 1 else 'are'} in no state this pack's fixes produce "
                                   f"(changed by someone else?); nothing written; "
                                   f"{revert_hint(profile.name, image.root, force=True)} restores the saved "
                                   f"originals anyway, discarding those changes")
    plan = Plan(profile, [], current, pristine, {}, pristine)
    changed = plan.changes()
    lines = [f"apply_all: {profile.name}: {reason}"]
    if dry_run:
        lines.append(f"apply_all: {profile.name}: would restore {_n(len(changed), 'file')} from the saved originals"
                     + (f": {', '.join(changed)}" if changed else ""))
        return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "dry-run", "reverted": [],
                                        "changed": changed, "from_blobs": True})
    if changed:
        commit(image, plan, None, None, "revert")
    else:
        remove_file(state / "journal.json")
        remove_file(state / "ledger.json")
        gc_blobs(state, None)
    if unknown:
        lines.append(f"apply_all: {profile.name}: discarded the change to {', '.join(unknown)} (--force)")
    lines.append(f"apply_all: {profile.name}: restored {_n(len(changed), 'file')} from the saved originals"
                 + (f" ({', '.join(changed)})" if changed else ""))
    return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "reverted", "reverted": [],
                                    "changed": changed, "from_blobs": True, "discarded": unknown})


# --------------------------------------------------------------------------------------------------------------
# Commands.
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int
    lines: list[str]
    data: dict[str, Any]


def select(profile: Profile, opt_ins: Sequence[str]) -> list[Fix]:
    """The profile's default fixes plus the named opt-ins, in pack order; usage errors are one line."""
    names = set()
    for name in opt_ins:
        fix = profile.fix(name)
        if fix is None:
            known = ", ".join(f.id for f in profile.fixes if f.opt_in) or "none"
            raise FixError(EXIT_USAGE, f"unknown fix '{name}' for profile {profile.name} (opt-in fixes: {known})")
        if not fix.opt_in:
            raise FixError(EXIT_USAGE, f"fix '{name}' is not opt-in: --profile {profile.name} already applies it")
        names.add(name)
    chosen = [f for f in profile.fixes if not f.opt_in or f.id in names]
    ids = {f.id for f in chosen}
    for fix in chosen:
        for dep in fix.depends_on:
            if dep not in ids:
                raise FixError(EXIT_USAGE, f"fix '{fix.id}' depends on '{dep}': name it too")
        for other in fix.conflicts:
            if other in ids:
                raise FixError(EXIT_USAGE, f"fix '{fix.id}' conflicts with '{other}': choose one")
    return chosen


def check_ledger_profile(image: Image, ledger: dict[str, Any] | None, hint: str = "") -> None:
    if ledger is None:
        return
    if ledger["profile"] != image.profile.name:
        raise FixError(EXIT_STATE, f"conflict: profile {ledger['profile']} is applied here, not "
                                   f"{image.profile.name}; revert it first")
    assert image.state_dir is not None
    check_ledger_files(image, ledger, image.state_dir / "ledger.json", hint)


def check_ledger_files(image: Image, ledger: dict[str, Any], path: Path, hint: str) -> None:
    """A ledger may only name files of its profile: the tool restores and rewrites what it names."""
    for rel in ledger["files"]:
        if rel not in image.profile.files:
            raise StateError(path, f"field 'files.{rel}' is not a file of profile {image.profile.name}", hint)


def evaluate(image: Image, selected: list[Fix], ledger: dict[str, Any] | None, hint: str = ""
             ) -> tuple[Plan | None, list[dict[str, Any]]]:
    """Everything but writing: image gate, applied-vs-selected, payloads, the in-memory plan.

    Returns (None, gate rows) when the selection is already applied."""
    profile = image.profile
    check_ledger_profile(image, ledger, hint)
    current, rows = gate(image, ledger)
    applied = [a["id"] for a in (ledger or {}).get("applied", [])]
    wanted = [f.id for f in selected]
    for a in (ledger or {}).get("applied", []):
        fix = profile.fix(a["id"])
        if fix is None or not fix.has_payload or fix.payload_sha256() != a["payload_sha256"]:
            raise FixError(EXIT_STATE, f"conflict: applied fix {a['id']} has another payload in this pack; "
                                       f"run --revert first")
    if sorted(applied) == sorted(wanted):
        return None, rows
    extra = [a for a in applied if a not in wanted]
    if extra:
        raise FixError(EXIT_STATE, f"conflict: applied fixes not in this selection: {', '.join(extra)}; "
                                   f"run --revert first")
    missing = [f.id for f in selected if not f.has_payload]
    if missing:
        raise FixError(EXIT_STATE, f"payload not in this pack for {len(missing)} fixes: {', '.join(missing)}; "
                                   f"nothing written", data={"gate": rows, "missing_payloads": missing})
    return build_plan(image, current, ledger, selected), rows


def cmd_apply(pack: Pack, profile: Profile, opt_ins: Sequence[str], root: Path | None, dry_run: bool,
              lock_timeout: float) -> Outcome:
    selected = select(profile, opt_ins)
    image = Image.locate(profile, root)
    state = image.state_dir
    if state is None:
        rows = [{"what": f"package {pkg}", "expected": "installed", "found": "not found", "ok": False}
                for pkg, site in image.sites.items() if site is None]
        raise FixError(EXIT_IMAGE, f"image mismatch: {profile.anchor} is not installed "
                                   f"{'under ' + str(root) if root else 'for ' + sys.executable}; nothing written",
                       details=gate_table(rows), data={"gate": rows})
    if not state.exists():
        # First run on this image: check everything before creating the state folder, so a refused run leaves
        # no trace.  A writer creates the folder before its first write, so if it is still absent after our
        # reads, those reads saw a quiet image.
        try:
            evaluate(image, selected, None)
        except FixError:
            if not state.exists():
                raise
    lines: list[str] = []
    wanted = [f.id for f in selected]
    hint = f"{revert_hint(profile.name, root)} restores the originals from the blob store"
    with Lock(state, lock_timeout, exclusive=not dry_run):
        repaired = recover(image, dry_run=dry_run, hint=hint)
        if repaired:
            lines.append(f"apply_all: {repaired}")
        ledger = read_ledger(state, hint)
        applied = [a["id"] for a in (ledger or {}).get("applied", [])]
        plan, rows = evaluate(image, selected, ledger, hint)
        data: dict[str, Any] = {"profile": profile.name, "selected": wanted, "gate": rows}
        if plan is None:
            lines.append(f"apply_all: {profile.name}: already applied ({_n(len(wanted), 'fix')}), nothing to do")
            return Outcome(EXIT_OK, lines, {**data, "changed": [], "applied": [], "result": "no-op"})
        new = [f.id for f in selected if f.id not in applied]
        if dry_run:
            lines.append(f"apply_all: {profile.name}: would apply {', '.join(new)}")
            for rel in plan.changes():
                lines.append(f"  would write {rel}: {short(sha256(plan.current[rel]))} -> "
                             f"{short(sha256(plan.target[rel]))}")
            return Outcome(EXIT_OK, lines, {**data, "changed": plan.changes(), "applied": [], "would_apply": new,
                                            "result": "dry-run"})
        changed = commit(image, plan, ledger, make_ledger(plan), "apply")
        lines.append(f"apply_all: {profile.name}: applied {_n(len(new), 'fix')} ({', '.join(new)}); "
                     f"{_n(len(changed), 'file')} written")
        return Outcome(EXIT_OK, lines, {**data, "changed": changed, "applied": new, "result": "applied"})


def cmd_revert(pack: Pack, profile: Profile, names: Sequence[str], root: Path | None, dry_run: bool,
               lock_timeout: float, force: bool = False) -> Outcome:
    for name in names:
        if profile.fix(name) is None:
            raise FixError(EXIT_USAGE, f"unknown fix '{name}' for profile {profile.name}")
    image = Image.locate(profile, root)
    state = image.state_dir
    if state is None or not state.exists():
        return Outcome(EXIT_OK, [f"apply_all: {profile.name}: nothing applied here, nothing to revert"],
                       {"profile": profile.name, "result": "no-op", "reverted": []})
    hint = f"{revert_hint(profile.name, root)} (all fixes) restores the originals from the blob store"
    with Lock(state, lock_timeout, exclusive=not dry_run):
        lines: list[str] = []
        try:
            repaired = recover(image, dry_run=dry_run, hint=hint)
            ledger = read_ledger(state, hint)
            check_ledger_profile(image, ledger, hint)
        except StateError as exc:
            if names:  # without a ledger, only the whole profile can be put back
                raise
            return revert_from_blobs(image, f"{exc.path.name} cannot be trusted ({exc.problem})", dry_run, force)
        if repaired:
            lines.append(f"apply_all: {repaired}")
        if ledger is None:
            if not names and has_saved_state(state):  # e.g. a ledger removed by hand: the originals are saved
                return revert_from_blobs(image, "no ledger here, but saved originals", dry_run, force)
            lines.append(f"apply_all: {profile.name}: nothing applied here, nothing to revert")
            return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "no-op", "reverted": []})
        applied = [a["id"] for a in ledger["applied"]]
        drop = [a for a in applied if not names or a in names]
        if not drop:
            lines.append(f"apply_all: {profile.name}: {', '.join(names)} not applied, nothing to revert")
            return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "no-op", "reverted": []})
        keep = [a for a in applied if a not in drop]
        for fix_id in keep:
            fix = profile.fix(fix_id)
            for dep in fix.depends_on if fix else []:
                if dep in drop:
                    raise FixError(EXIT_USAGE, f"cannot revert '{dep}' alone: '{fix_id}' depends on it "
                                               f"(revert both)")
        current, rows = gate(image, ledger, allow_drift=force)
        discarded = [r["what"] for r in rows if r.get("drift")]
        kept = [f for f in profile.fixes if f.id in keep]
        plan = build_plan(image, current, ledger, kept)
        order = list(reversed(drop))
        if dry_run:
            lines.append(f"apply_all: {profile.name}: would revert {', '.join(order)}")
            return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "dry-run", "reverted": order,
                                            "changed": plan.changes()})
        ledger_after = make_ledger(plan) if kept else None
        changed = commit(image, plan, ledger, ledger_after, "revert")
        if discarded:
            lines.append(f"apply_all: {profile.name}: discarded the change to {', '.join(discarded)} (--force)")
        lines.append(f"apply_all: {profile.name}: reverted {', '.join(order)}; {_n(len(changed), 'file')} restored")
        return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "reverted", "reverted": order,
                                        "changed": changed, "discarded": discarded})


def fix_state(fix: Fix, ledger: dict[str, Any] | None) -> str:
    if any(a["id"] == fix.id for a in (ledger or {}).get("applied", [])):
        return "applied"
    return "not applied" if fix.has_payload else "payload not in this pack"


def cmd_list(pack: Pack, profiles: list[Profile], root: Path | None) -> Outcome:
    lines: list[str] = []
    rows = []
    for profile in profiles:
        image = Image.locate(profile, root)
        hint = f"{revert_hint(profile.name, root)} restores the originals from the blob store"
        ledger = read_ledger(image.state_dir, hint) if image.state_dir else None
        found = image.state_dir is not None
        lines.append(f"profile {profile.name}: {profile.image}"
                     + ("" if found else f" ({profile.anchor} not installed here)"))
        lines.append(f"  {'fix':<24} {'kind':<10} {'opt-in':<7} {'depends on':<20} state")
        for fix in profile.fixes:
            state = fix_state(fix, ledger)
            lines.append(f"  {fix.id:<24} {fix.kind:<10} {'yes' if fix.opt_in else 'no':<7} "
                         f"{', '.join(fix.depends_on) or '-':<20} {state}")
            rows.append({"profile": profile.name, "id": fix.id, "title": fix.title, "kind": fix.kind,
                         "opt_in": fix.opt_in, "depends_on": fix.depends_on, "conflicts": fix.conflicts,
                         "has_payload": fix.has_payload, "state": state})
    return Outcome(EXIT_OK, lines, {"fixes": rows})


def cmd_status(pack: Pack, profile: Profile, root: Path | None, lock_timeout: float) -> Outcome:
    """Per pin, fix and file, what this image holds against the profile; what is missing to apply it."""
    image = Image.locate(profile, root)
    state = image.state_dir
    if state is None:
        raise FixError(EXIT_IMAGE, f"image mismatch: {profile.anchor} is not installed here")
    hint = f"{revert_hint(profile.name, root)} restores the originals from the blob store"
    with Lock(state, lock_timeout, exclusive=False):  # a shared lock: never read a half-written state
        ledger = read_ledger(state, hint)
        check_ledger_profile(image, ledger, hint)
        journal = read_journal(image, hint) is not None
        current = {rel: image.read(rel) for rel in profile.files}
    found_hashes = {rel: sha256(data) for rel, data in current.items()}
    pins = []
    for pin in profile.pins:
        expected, found, ok = check_pin(pin, image.search_paths())
        pins.append({"what": pin.what, "expected": expected, "found": found, "ok": ok})
    ledger_files = (ledger or {}).get("files", {})
    files = []
    code = EXIT_OK if all(p["ok"] for p in pins) else EXIT_IMAGE
    for rel, pristine in profile.files.items():
        found = found_hashes[rel]
        rec = ledger_files.get(rel)
        if rec and found == rec["current"] and found != pristine:
            st = "applied"
        elif found == pristine:
            st = "pristine" if not rec or rec["current"] == pristine else "modified"
        else:
            st = "modified"
        if st == "modified":
            code = max(code, EXIT_STATE if rec else EXIT_IMAGE)
        files.append({"path": rel, "state": st, "sha256": found, "pristine": pristine,
                      "applied": rec["current"] if rec else None})
    fixes = []
    for fix in profile.fixes:
        st = fix_state(fix, ledger)
        if st == "applied":
            touched = {t.path for t in fix.targets or []}
            if any(f["state"] == "modified" for f in files if f["path"] in touched):
                st = "modified"
        fixes.append({"id": fix.id, "state": st, "opt_in": fix.opt_in, "has_payload": fix.has_payload})
    if journal:
        code = EXIT_STATE
    missing = [f.id for f in profile.fixes if not f.has_payload]
    differing = [f["path"] for f in files if f["state"] == "modified" and f["path"] not in ledger_files]
    orphans = orphaned_originals(image, ledger, current)
    lines = [f"profile {profile.name}: {profile.image}"]
    if journal:
        lines.append(f"  partial state: an interrupted run left a journal; the next apply or revert repairs it")
    lines.append("  pins:")
    width = max((len(p["what"]) for p in pins), default=0)
    lines += [f"    {'ok' if p['ok'] else 'MISMATCH':<9} {p['what']:<{width}}  expected {p['expected']}, "
              f"found {p['found']}" for p in pins]
    lines.append("  fixes:")
    lines += [f"    {f['id']:<24} {f['state']}" for f in fixes]
    lines.append("  files:")
    width = max((len(f["path"]) for f in files), default=0)
    lines += [f"    {f['path']:<{width}}  {f['state']:<9} {short(f['sha256'])}"
              + (f" (pinned {short(f['pristine'])})" if f["state"] == "modified" and f["path"] in differing else
                 f" (applied {short(f['applied'])})" if f["state"] == "modified" else "")
              for f in files]
    lines.append(f"  payloads missing: {len(missing)}" + (f" ({', '.join(missing)})" if missing else ""))
    lines.append(f"  pinned files that differ from the profile: {len(differing)}"
                 + (f" ({', '.join(differing)})" if differing else ""))
    if orphans:
        lines.append(f"  {_n(len(orphans), 'file')} patched by an earlier run whose ledger is gone; the originals "
                     f"are saved: {revert_hint(profile.name, root)} restores them")
    if missing and code == EXIT_OK:
        lines.append(f"  to write a missing payload: edit a copy of the package, then `apply_all.py --profile "
                     f"{profile.name} --capture FIX --from COPY` (docs/fixes.md, Writing a payload)")
    return Outcome(code, lines, {"profile": profile.name, "pins": pins, "fixes": fixes, "files": files,
                                 "interrupted": journal, "missing_payloads": missing, "differing_files": differing,
                                 "orphaned_originals": orphans})


def ledger_profile(pack: Pack, root: Path | None) -> Profile | None:
    """The profile whose ledger sits next to its package here, if any.

    A ledger of a profile this pack does not have is an error (exit 3), never "no ledger".  When the ledger cannot
    be read, or is gone but an earlier run left saved originals, the one profile whose state folder this is answers;
    with several, the caller must name it."""
    candidates: list[Profile] = []
    for profile in pack.profiles.values():
        site = locate_package(profile.anchor, root)
        if site is None:
            continue
        state = site / STATE_DIR
        hint = f"{revert_hint(profile.name, root)} restores the originals from the blob store"
        try:
            ledger = read_ledger(state, hint)
        except StateError:
            candidates.append(profile)
            continue
        if ledger is None:
            if has_saved_state(state):
                candidates.append(profile)
            continue
        if ledger["profile"] in pack.profiles:
            return pack.profiles[ledger["profile"]]
        raise FixError(EXIT_STATE, f"ledger {state / 'ledger.json'} was written for profile '{ledger['profile']}', "
                                   f"which is not in this pack (profiles: {', '.join(pack.profiles)}); revert with "
                                   f"the pack that applied it, or name --profile")
    if len(candidates) > 1:
        raise FixError(EXIT_USAGE, f"the ledger here cannot tell the profile; name it: --profile "
                                   f"{' or '.join(p.name for p in candidates)}")
    return candidates[0] if candidates else None


# --------------------------------------------------------------------------------------------------------------
# Authoring: a fix's payload captured from an edited copy of the image's files.
# --------------------------------------------------------------------------------------------------------------

CAPTURE_SKIP = (STATE_DIR, "__pycache__")


def edited_files(edited: Path) -> list[str]:
    """Package-relative paths of the files under an edited tree laid out like site-packages (no caches, no
    dist-info, no top-level files)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(edited):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in CAPTURE_SKIP and not d.endswith((".dist-info", ".egg-info")))
        for name in sorted(filenames):
            rel = (Path(dirpath) / name).relative_to(edited).as_posix()
            if "/" in rel and not name.endswith((".pyc", TMP_SUFFIX)):
                out.append(rel)
    return out


def make_diff(rel: str, old: bytes | None, new: bytes) -> bytes:
    """One file's unified diff with one line of context, byte-exact: lines are split as the applier splits them,
    and a last line without a newline gets the marker."""
    def lines(data: bytes | None) -> list[str]:
        return [] if data is None else [ln.decode("utf-8", "surrogateescape") for ln in data.splitlines(True)]

    out = []
    for line in difflib.unified_diff(lines(old), lines(new), "/dev/null" if old is None else f"a/{rel}",
                                     f"b/{rel}", n=1):
        out.append(line.encode("utf-8", "surrogateescape"))
        if not line.endswith(("\n", "\r")):
            out.append(b"\n\\ No newline at end of file\n")
    return b"".join(out)


def _stack(profile: Profile, files: dict[str, bytes | None], payloads: dict[str, bytes]) -> dict[str, bytes | None]:
    """Apply payloads (fix id -> diff) to ``files`` in pack order, strictly; HunkMismatch names the fix."""
    out = dict(files)
    for fix in profile.fixes:
        if fix.id in payloads:
            for patch in parse_diff(payloads[fix.id], fix.id):
                try:
                    out[patch.path] = apply_file_patch(out.get(patch.path), patch)
                except HunkMismatch as exc:
                    raise HunkMismatch(f"{fix.id}: {exc}") from None
    return out


def cmd_capture(pack: Pack, profile: Profile, fix_id: str, edited: Path, root: Path | None, dry_run: bool,
                lock_timeout: float) -> Outcome:
    """Turn an edit of the image's files (made in a copy, ``edited``) into ``fix_id``'s payload.diff, with the pre
    and post sha256 written into its fix.json, once the image matches the profile (pins and every pinned file)."""
    fix = profile.fix(fix_id)
    if fix is None:
        raise FixError(EXIT_USAGE, f"unknown fix '{fix_id}' for profile {profile.name}")
    if not edited.is_dir():
        raise FixError(EXIT_USAGE, f"--from {edited}: not a folder")
    edited = edited.resolve()
    image = Image.locate(profile, root)
    state = image.state_dir
    if state is None:
        raise FixError(EXIT_IMAGE, f"image mismatch: {profile.anchor} is not installed "
                                   f"{'under ' + str(root) if root else 'for ' + sys.executable}")
    if edited in {s.resolve() for s in image.sites.values() if s is not None}:
        raise FixError(EXIT_USAGE, f"--from {edited}: that is the installed site-packages; edit a copy "
                                   f"(the installed files are the pristine side of the diff)")
    hint = f"{revert_hint(profile.name, root)} restores the originals from the blob store"
    with Lock(state, lock_timeout, exclusive=False):
        ledger = read_ledger(state, hint)
        check_ledger_profile(image, ledger, hint)
        if read_journal(image, hint) is not None:
            raise FixError(EXIT_STATE, "partial state: an interrupted run left a journal; run the apply or revert "
                                       "again first")
        applied = {a["id"]: a for a in (ledger or {}).get("applied", [])}
        if fix.id in applied:
            raise FixError(EXIT_STATE, f"fix {fix.id} is applied here: `apply_all.py --revert {fix.id} --profile "
                                       f"{profile.name}` first, then capture from a copy edited on top of the image")
        try:
            current, _ = gate(image, ledger)  # the rest of the image must be the one the profile pins
        except FixError as exc:
            bad = {r["what"] for r in exc.data.get("gate", []) if not r["ok"]}
            own = [t.path for t in fix.targets or [] if t.path in bad]
            if exc.code != EXIT_IMAGE or not own:
                raise
            raise FixError(exc.code, f"{exc}; {', '.join(own)} of {fix.id} itself differ: the installed files are "
                                     f"the pristine side of the diff, so put them back (reinstall) and edit a copy",
                           exc.details, exc.data) from None
        pristine = pristine_contents(image, current, ledger)
    ledger_files = (ledger or {}).get("files", {})
    changed: list[tuple[str, bytes | None, bytes]] = []
    sites: dict[str, Path | None] = dict(image.sites)
    try:
        for rel in edited_files(edited):
            top = rel.split("/", 1)[0]
            if top not in sites:
                sites[top] = locate_package(top, root)
            site = sites[top]
            if site is None:
                continue  # not an installed package: not part of this image
            installed = current[rel] if rel in current else image_bytes(site / rel)
            new = (edited / rel).read_bytes()
            if new == installed:
                continue
            if rel in ledger_files and sha256(new) == profile.files.get(rel):
                raise FixError(EXIT_USAGE, f"--from {edited}: {rel} is the pristine file, but fixes are applied to "
                                           f"it here; copy the image's files as they are now, then edit")
            changed.append((rel, installed, new))
    except OSError as exc:
        raise FixError(EXIT_IO, f"cannot read {exc.filename}: {exc.strerror}; nothing written") from None
    if not changed:
        raise FixError(EXIT_USAGE, f"--from {edited}: no file differs from the installed packages; nothing to "
                                   f"capture")
    listed = [t.path for t in fix.targets or []]  # the order fix.json already gives, then the rest by path
    changed.sort(key=lambda c: (listed.index(c[0]) if c[0] in listed else len(listed), c[0]))
    chunks, targets, new_pins, summary = [], [], {}, []
    for rel, installed, new in changed:
        if not safe_rel(rel):
            raise FixError(EXIT_USAGE, f"--from {edited}: {rel} is not a path inside a package")
        if rel not in profile.files:
            new_pins[rel] = sha256(installed)
        diff = make_diff(rel, installed, new)
        (patch,) = parse_diff(diff, rel)
        if apply_file_patch(installed, patch) != new:  # the diff must say exactly the edit
            raise FixError(EXIT_USAGE, f"--from {edited}: the edit of {rel} cannot be written as a strict diff")
        base = pristine.get(rel, installed)
        try:
            alone = apply_file_patch(base, patch)
        except HunkMismatch:
            owners = [a for a in applied if rel in applied[a]["files"]]
            raise FixError(EXIT_STATE, f"the edit of {rel} overlaps the change of applied fix "
                                       f"{', '.join(owners)}; revert it and capture on the pristine file") from None
        targets.append({"path": rel, "pre": profile.files.get(rel, new_pins.get(rel)), "post": sha256(alone)})
        chunks.append(diff)
        adds = sum(1 for h in patch.hunks for t, _ in h.lines if t == "+")
        dels = sum(1 for h in patch.hunks for t, _ in h.lines if t == "-")
        summary.append(f"  {rel}  pre {short(targets[-1]['pre'])} -> post {short(targets[-1]['post'])} "
                       f"(+{adds} -{dels} lines)")
    payload = b"".join(chunks)
    # The applied fixes and this one, stacked in pack order on the pristine files, must give the edited files.
    payloads = {a: profile.fix(a).payload() for a in applied if profile.fix(a) is not None}  # type: ignore[union-attr]
    payloads[fix.id] = payload
    try:
        stacked = _stack(profile, {**pristine, **{rel: current_or(image, root, rel) for rel in new_pins}}, payloads)
    except HunkMismatch as exc:
        raise FixError(EXIT_STATE, f"the captured payload does not stack with the applied fixes in pack order "
                                   f"({exc})") from None
    for rel, _, new in changed:
        if stacked.get(rel) != new:
            raise FixError(EXIT_STATE, f"the captured payload does not stack with the applied fixes in pack order: "
                                       f"{rel} comes out different from the edited file")
    fix_dir = fix.source.parent
    meta = json.loads(fix.source.read_text(encoding="utf-8"))
    dropped = [p for p in listed if p not in {t["path"] for t in targets}]
    payload_name = meta.get("payload") or "payload.diff"
    payload_path = fix_dir / payload_name
    unchanged = (fix.has_payload and fix.payload() == payload and meta.get("targets") == targets and not new_pins)
    lines = [f"apply_all: {profile.name}: {'would capture' if dry_run else 'captured'} {fix.id} from {edited}: "
             f"{_n(len(changed), 'file')}", *summary]
    lines += [f"  new pin: {rel} {short(d)} (not in the profile before; added to its files)"
              for rel, d in new_pins.items()]
    lines += [f"  target {rel} was listed but is not edited: dropped from the fix's targets" for rel in dropped]
    data: dict[str, Any] = {"profile": profile.name, "fix": fix.id, "targets": targets, "new_pins": new_pins,
                            "dropped_targets": dropped, "payload": str(payload_path)}
    if dry_run:
        lines += ["", payload.decode("utf-8", "replace").rstrip("\n")]
        return Outcome(EXIT_OK, lines, {**data, "result": "dry-run"})
    if unchanged:
        lines.append(f"  {payload_path} and {fix.source.name} already say exactly this: nothing written")
        return Outcome(EXIT_OK, lines, {**data, "result": "unchanged"})
    meta["targets"] = targets
    meta["payload"] = payload_name
    profile_json = pack.root / profile.name / "profile.json"
    writes: list[tuple[Path, bytes]] = [(payload_path, payload),
                                        (fix.source, (json.dumps(meta, indent=2) + "\n").encode())]
    if new_pins:
        pmeta = json.loads(profile_json.read_text(encoding="utf-8"))
        pmeta["files"].update(new_pins)
        writes.append((profile_json, (json.dumps(pmeta, indent=2) + "\n").encode()))
    old = {path: image_bytes(path) for path, _ in writes}
    try:
        for path, content in writes:
            write_atomic(path, content)
        load_pack(pack.root)  # the pack must still load, cross-checks included
    except (OSError, FixError) as exc:
        for path, content in old.items():
            if content is None:
                remove_file(path)
            else:
                write_atomic(path, content)
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise FixError(EXIT_IO if isinstance(exc, OSError) else EXIT_USAGE,
                       f"capture of {fix.id} not written ({why}); the pack is as it was") from None
    lines.append(f"  wrote {payload_path}, {fix.source}" + (f", {profile_json}" if new_pins else ""))
    lines.append(f"  next: `apply_all.py --profile {profile.name}{' ' + fix.id if fix.opt_in else ''} --dry-run`, "
                 f"then apply, then the fix's check ({check_label(fix)})")
    return Outcome(EXIT_OK, lines, {**data, "result": "captured"})


def check_label(fix: Fix) -> str:
    check = fix.meta.get("check")
    return f"probe: {check['probe']}" if isinstance(check, dict) else str(check)


def current_or(image: Image, root: Path | None, rel: str) -> bytes | None:
    """The installed bytes of a file outside the profile's pinned files."""
    site = locate_package(rel.split("/", 1)[0], root)
    return None if site is None else image_bytes(site / rel)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 1
        raise FixError(EXIT_USAGE, message)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog="apply_all.py", description="Apply the Gaudi Cookbook fix pack to this image's packages.",
                epilog="exit codes: 0 ok or no-op, 1 usage, 2 image mismatch, 3 drift / conflict / missing payload"
                       " / partial state / damaged ledger or journal, 4 cannot write or lock")
    p.add_argument("--profile", help="profile to apply (e.g. v0.26.0, cpu-0.32.0)")
    p.add_argument("fixes", nargs="*", metavar="FIX", help="opt-in fixes to add (or, with --revert, fixes to revert)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="list fixes, opt-in, depends-on and state")
    mode.add_argument("--status", action="store_true", help="per pin, fix and file: pristine / applied / "
                      "modified; missing payloads; pinned files that differ")
    mode.add_argument("--revert", action="store_true", help="restore the original files, in reverse order "
                      "(from the blob store when the ledger is damaged or gone)")
    mode.add_argument("--capture", metavar="FIX", help="write FIX's payload and hashes from an edited copy of its "
                                                       "files (--from); the image must match the profile")
    p.add_argument("--from", dest="edited", type=Path, metavar="DIR",
                   help="with --capture: a folder laid out like site-packages holding the edited files")
    p.add_argument("--force", action="store_true",
                   help="with --revert: restore the saved originals even over files changed since the apply")
    p.add_argument("--dry-run", action="store_true", help="check and show what would be written; write nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--root", type=Path, help="site-packages folder to act on instead of this interpreter's")
    p.add_argument("--pack", type=Path, default=PACK_DIR, help=argparse.SUPPRESS)
    p.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for another run (600)")
    return p.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> Outcome:
    args = parse_args(argv)
    if args.root is not None and not args.root.is_dir():
        raise FixError(EXIT_USAGE, f"--root {args.root}: not a folder")
    root = args.root.resolve() if args.root is not None else None
    if not math.isfinite(args.lock_timeout) or args.lock_timeout < 0:
        raise FixError(EXIT_USAGE, f"--lock-timeout {args.lock_timeout:g}: must be a finite number of seconds >= 0")
    if args.force and not args.revert:
        raise FixError(EXIT_USAGE, "--force only goes with --revert")
    if (args.edited is not None) != (args.capture is not None):
        raise FixError(EXIT_USAGE, "--capture FIX and --from DIR go together")
    pack = load_pack(args.pack)
    profile = None
    if args.profile is not None:
        profile = pack.profiles.get(args.profile)
        if profile is None:
            raise FixError(EXIT_USAGE, f"unknown profile '{args.profile}' (profiles: {', '.join(pack.profiles)})")
    if args.list:
        if args.fixes:
            raise FixError(EXIT_USAGE, "--list takes no fix names")
        return cmd_list(pack, [profile] if profile else list(pack.profiles.values()), root)
    if args.status:
        profile = profile or ledger_profile(pack, root)
        if profile is None:
            raise FixError(EXIT_USAGE, "--status needs --profile NAME (no ledger found here)")
        return cmd_status(pack, profile, root, args.lock_timeout)
    if args.revert:
        profile = profile or ledger_profile(pack, root)
        if profile is None:
            return Outcome(EXIT_OK, ["apply_all: no fixes are applied here, nothing to revert"],
                           {"result": "no-op", "reverted": []})
        return cmd_revert(pack, profile, args.fixes, root, args.dry_run, args.lock_timeout, args.force)
    if profile is None:
        raise FixError(EXIT_USAGE, "--profile NAME is required (or --list / --status / --revert)")
    if args.capture is not None:
        if args.fixes:
            raise FixError(EXIT_USAGE, "--capture takes one fix: --capture FIX --from DIR")
        return cmd_capture(pack, profile, args.capture, args.edited, root, args.dry_run, args.lock_timeout)
    return cmd_apply(pack, profile, args.fixes, root, args.dry_run, args.lock_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    try:
        outcome = run(argv)
    except FixError as exc:
        if as_json:
            print(json.dumps({"ok": False, "exit_code": exc.code, "error": str(exc), **exc.data}, indent=2))
        else:
            print(f"apply_all: error: {exc}", file=sys.stderr)
            for line in exc.details:
                print(line, file=sys.stderr)
        return exc.code
    if as_json:
        print(json.dumps({"ok": outcome.code == EXIT_OK, "exit_code": outcome.code, **outcome.data}, indent=2))
    else:
        print("\n".join(outcome.lines))
    return outcome.code


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == PACK_DIR:
        del sys.path[0]  # never let the pack folder shadow an installed package
    sys.exit(main())
