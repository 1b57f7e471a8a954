"""Exit codes, the two error types, the outcome of a command and the small helpers every part of the engine uses."""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_IMAGE = 2
EXIT_STATE = 3
EXIT_IO = 4

KINDS = ("bugfix", "backport", "workaround")
# What a fix's `proof.shown` says was shown, as --list, the recipe pages and notebook 01 word it: never more.
PROOF_LABELS = {
    "cpu": "reproduced and fixed on CPU against the v0.26.0 sources",
    "gaudi-only": "applied and compiled; the bug needs a Gaudi card (its contract is tested on CPU)",
}
HOOK_LABEL = "hook into vLLM"
SERVED_LABEL = "shown by its check on a served model"  # a fix with no proof field (the cpu-0.32.0 profile)


def proof_label(proof: dict | None, has_payload: bool) -> str:
    """One line for a fix's `proof` field (already checked by the pack loader)."""
    if proof is None:
        return "payload not in this pack" if not has_payload else SERVED_LABEL
    return PROOF_LABELS[proof["shown"]] + (f"; {HOOK_LABEL}" if proof.get("hook") else "")
STATE_DIR = ".cookbook-fixes"
LEDGER_FORMAT = 1
TMP_SUFFIX = ".cbfix-tmp"
FIX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
PACK_DIR = Path(__file__).resolve().parent.parent  # fixes/, the folder holding this package


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


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("x") else "s")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Outcome:
    code: int
    lines: list[str]
    data: dict[str, Any]
