"""File writes that cannot leave a half-written file: temp file, fsync, atomic rename.

``replace_file`` is the one rename every write goes through, so tests can inject failures and kills there.
"""
from __future__ import annotations

import os
from pathlib import Path

from .base import TMP_SUFFIX


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


def image_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
