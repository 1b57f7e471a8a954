"""Locating the image's packages (without importing them) and checking a profile's pins against them."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .base import EXIT_IO, FixError, STATE_DIR
from .pack import Pin, Profile


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
