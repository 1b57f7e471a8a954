"""Authoring: a fix's payload and hashes captured from an edited copy of the image's files."""
from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

from .base import (
    EXIT_IMAGE, EXIT_IO, EXIT_OK, EXIT_STATE, EXIT_USAGE, FixError, Outcome, STATE_DIR, TMP_SUFFIX, plural, safe_rel,
    sha256, short,
)
from .commands import check_label
from .diff import HunkMismatch, apply_file_patch, parse_diff
from .fsio import image_bytes, remove_file, write_atomic
from .image import Image, locate_package
from .lock import Lock
from .pack import Pack, Profile, load_pack
from .plan import gate, pristine_contents
from .state import check_ledger_profile, read_journal, read_ledger, revert_hint


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
             f"{plural(len(changed), 'file')}", *summary]
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


def current_or(image: Image, root: Path | None, rel: str) -> bytes | None:
    """The installed bytes of a file outside the profile's pinned files."""
    site = locate_package(rel.split("/", 1)[0], root)
    return None if site is None else image_bytes(site / rel)
