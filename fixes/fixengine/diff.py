"""Unified diffs: a small, strict parser and applier (exact context, no fuzz).

Payloads are diffs of our own writing; anything malformed is an error, never a guess.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


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
