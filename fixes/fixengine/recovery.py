"""Recovery from the blob store: the way back when the ledger or the journal cannot be trusted."""
from __future__ import annotations

from pathlib import Path

from .base import EXIT_OK, EXIT_STATE, FixError, Outcome, TMP_SUFFIX, plural, sha256, short
from .diff import HunkMismatch, apply_file_patch, parse_diff
from .fsio import remove_file
from .image import Image
from .pack import Profile
from .plan import Plan, commit, gc_blobs
from .state import load_blob, revert_hint


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
        lines.append(f"apply_all: {profile.name}: would restore {plural(len(changed), 'file')} from the saved originals"
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
    lines.append(f"apply_all: {profile.name}: restored {plural(len(changed), 'file')} from the saved originals"
                 + (f" ({', '.join(changed)})" if changed else ""))
    return Outcome(EXIT_OK, lines, {"profile": profile.name, "result": "reverted", "reverted": [],
                                    "changed": changed, "from_blobs": True, "discarded": unknown})
