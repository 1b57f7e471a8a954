"""Planning and committing: every file's new content is computed in memory before anything is written, then
written all or nothing (journal first, every failure restored).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import EXIT_IMAGE, EXIT_IO, EXIT_STATE, FixError, LEDGER_FORMAT, sha256, short, utc_now
from .diff import HunkMismatch, apply_file_patch, parse_diff
from .fsio import drop_pycache, image_bytes, remove_file, write_atomic
from .image import Image, check_pin
from .pack import Fix, Profile
from .state import load_blob, revert_hint, store_blob, write_json


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
                                            "started": utc_now(), "files": entries, "ledger_before": ledger_before})
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


def make_ledger(plan: Plan) -> dict[str, Any] | None:
    if not plan.selected:
        return None
    touched = sorted({rel for results in plan.per_fix.values() for rel in results})
    return {
        "format": LEDGER_FORMAT,
        "profile": plan.profile.name,
        "updated": utc_now(),
        "applied": [{"id": f.id, "payload_sha256": f.payload_sha256(), "files": plan.per_fix[f.id]}
                    for f in plan.selected],
        "files": {rel: {"pristine": sha256(plan.pristine[rel]), "current": sha256(plan.target[rel])}
                  for rel in touched},
    }
