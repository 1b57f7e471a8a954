"""State next to the package: the ledger, the journal and the blob store, checked field by field when read,
and the repair of a run that was killed mid-write.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import EXIT_STATE, FixError, LEDGER_FORMAT, SHA_RE, StateError, TMP_SUFFIX, safe_rel, sha256, short
from .fsio import drop_pycache, remove_file, write_atomic
from .image import Image


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
