"""The commands: apply, revert, list and status, each returning an Outcome (or raising FixError)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from .base import (
    EXIT_IMAGE, EXIT_OK, EXIT_STATE, EXIT_USAGE, FixError, Outcome, STATE_DIR, StateError, plural, proof_label, sha256,
    short,
)
from .image import Image, check_pin, locate_package
from .lock import Lock
from .pack import Fix, Pack, Profile
from .plan import Plan, build_plan, commit, gate, gate_table, make_ledger, orphaned_originals
from .recovery import has_saved_state, revert_from_blobs
from .state import check_ledger_profile, read_journal, read_ledger, recover, revert_hint


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
            lines.append(f"apply_all: {profile.name}: already applied ({plural(len(wanted), 'fix')}), nothing to do")
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
        lines.append(f"apply_all: {profile.name}: applied {plural(len(new), 'fix')} ({', '.join(new)}); "
                     f"{plural(len(changed), 'file')} written")
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
        lines.append(f"apply_all: {profile.name}: reverted {', '.join(order)}; {plural(len(changed), 'file')} restored")
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
            shown = proof_label(fix.meta.get("proof"), fix.has_payload)
            lines.append(f"  {'':<24} shown: {shown}")
            rows.append({"profile": profile.name, "id": fix.id, "title": fix.title, "kind": fix.kind,
                         "opt_in": fix.opt_in, "depends_on": fix.depends_on, "conflicts": fix.conflicts,
                         "has_payload": fix.has_payload, "state": state, "shown": shown,
                         "proof": fix.meta.get("proof")})
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
        lines.append("  partial state: an interrupted run left a journal; the next apply or revert repairs it")
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
        lines.append(f"  {plural(len(orphans), 'file')} patched by an earlier run whose ledger is gone; the originals "
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


def check_label(fix: Fix) -> str:
    check = fix.meta.get("check")
    return f"probe: {check['probe']}" if isinstance(check, dict) else str(check)
