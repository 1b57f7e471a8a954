"""Builders for the fix-pack tests: synthetic installed packages (site-packages with dist-info and RECORD) and
synthetic packs whose payloads are real unified diffs of those packages.

Why synthetic: the engine's guarantees (all or nothing, repair after a kill, locking) must be tested on every CI
machine, with or without the CPU image, and by breaking things on purpose, which the shared image must never see.
"""
from __future__ import annotations

import base64
import csv
import difflib
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
APPLY_ALL = REPO / "fixes" / "apply_all.py"
STATE = ".cookbook-fixes"
PROFILE = "toy-1.0"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_apply_all() -> ModuleType:
    """A fresh copy of the engine behind fixes/apply_all.py (the package fixes/fixengine), loaded the way the script
    loads it: a test may patch its functions (``fsio.replace_file``) without touching another test's copy."""
    for name in [n for n in sys.modules if n == "fixengine" or n.startswith("fixengine.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location("apply_all_under_test", APPLY_ALL)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    engine: ModuleType = script.load_engine()
    return engine


def _lines(n: int, tag: str) -> bytes:
    return "".join(f"{tag}_{i} = {i}  # line {i} of {tag}\n" for i in range(1, n + 1)).encode()


PRISTINE: dict[str, bytes] = {
    "toypkg/__init__.py": b'"""A toy package standing in for vllm."""\n',
    "toypkg/a.py": _lines(40, "a"),
    "toypkg/b.py": _lines(30, "b"),
    "toypkg/sub/c.py": _lines(20, "c"),
}


def record_line(rel: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, f"sha256={digest}", str(len(data))]


def make_site(root: Path, files: dict[str, bytes] | None = None, version: str = "1.0") -> Path:
    """A site-packages folder holding toypkg and its dist-info (METADATA + RECORD), like pip leaves it."""
    files = dict(PRISTINE if files is None else files)
    site = root / "site-packages"
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    dist = site / f"toypkg-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: toypkg\nVersion: {version}\n")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for rel, data in files.items():
        writer.writerow(record_line(rel, data))
    writer.writerow([f"toypkg-{version}.dist-info/RECORD", "", ""])
    (dist / "RECORD").write_text(buf.getvalue())
    return site


def record_hashes(site: Path) -> dict[str, str]:
    rec = next(site.glob("*.dist-info")) / "RECORD"
    return {row[0]: row[1] for row in csv.reader(rec.read_text().splitlines()) if row[1]}


def matches_record(site: Path) -> bool:
    for rel, want in record_hashes(site).items():
        data = (site / rel).read_bytes()
        if record_line(rel, data)[1] != want:
            return False
    return True


def edit(data: bytes, old: str, new: str) -> bytes:
    text = data.decode()
    assert text.count(old) == 1, old
    return text.replace(old, new).encode()


@dataclass
class FixSpec:
    id: str
    edits: dict[str, bytes]  # path -> content after this fix alone on the pristine file
    opt_in: bool = False
    depends_on: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    payload: bool = True
    raw_payload: str | None = None  # a hand-written diff (e.g. one that does not apply)
    check: object = "known-answer"


def unified(rel: str, old: bytes | None, new: bytes) -> str:
    a = [] if old is None else old.decode().splitlines(keepends=True)
    b = new.decode().splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{rel}", f"b/{rel}", n=1))


def make_pack(root: Path, fixes: list[FixSpec], pristine: dict[str, bytes] | None = None,
              pins: list[dict] | None = None, extra_files: dict[str, bytes | None] | None = None) -> Path:
    """A pack folder (one profile with its ORDER) whose payloads are diffs against ``pristine``."""
    pristine = dict(PRISTINE if pristine is None else pristine)
    pack = root / "pack"
    prof = pack / PROFILE
    prof.mkdir(parents=True)
    files: dict[str, str | None] = {}
    for spec in fixes:
        fdir = prof / spec.id
        fdir.mkdir()
        targets = []
        chunks = []
        for rel, new in spec.edits.items():
            old = pristine.get(rel)
            files[rel] = None if old is None else sha(old)
            targets.append({"path": rel, "pre": None if old is None else sha(old), "post": sha(new)})
            chunks.append(unified(rel, old, new))
        if spec.raw_payload is not None:
            chunks = [spec.raw_payload]
        if spec.payload:
            (fdir / "payload.diff").write_text("".join(chunks))
        meta = {
            "id": spec.id, "title": f"toy fix {spec.id}", "why": "a test", "kind": "bugfix", "origin": "tests",
            "upstream": [], "remove_when": "never", "opt_in": spec.opt_in, "depends_on": spec.depends_on,
            "conflicts": spec.conflicts, "targets": targets if spec.payload else None,
            "payload": "payload.diff" if spec.payload else None, "check": spec.check,
        }
        (fdir / "fix.json").write_text(json.dumps(meta, indent=2))
    for rel, data in (extra_files or {}).items():
        files[rel] = None if data is None else sha(data)
    profile = {"name": PROFILE, "title": "toy image", "image": "toypkg 1.0", "anchor": "toypkg",
               "pins": pins if pins is not None else [{"what": "toypkg 1.0", "dist": "toypkg", "version": "1.0"}],
               "files": files}
    (prof / "profile.json").write_text(json.dumps(profile, indent=2))
    (prof / "ORDER").write_text("# toy order\n" + "\n".join(s.id for s in fixes) + "\n")
    return pack


def standard_fixes() -> list[FixSpec]:
    """f1 and f2 both patch a.py (stacked), f3 patches c.py, opt-in f4 creates a file and needs f1."""
    a = PRISTINE["toypkg/a.py"]
    return [
        FixSpec("f1", {"toypkg/a.py": edit(a, "a_5 = 5  # line 5 of a\n", "a_5 = 50  # fixed by f1\n")},
                check="seed"),
        FixSpec("f2", {"toypkg/a.py": edit(a, "a_30 = 30  # line 30 of a\n", "a_30 = 300  # fixed by f2\nx = 1\n"),
                       "toypkg/b.py": edit(PRISTINE["toypkg/b.py"], "b_2 = 2  # line 2 of b\n", "")},
                check={"probe": "true"}),
        FixSpec("f3", {"toypkg/sub/c.py": edit(PRISTINE["toypkg/sub/c.py"], "c_10 = 10", "c_10 = 1000")}),
        FixSpec("f4", {"toypkg/new.py": b"# added by f4\nVALUE = 4\n"}, opt_in=True, depends_on=["f1"]),
    ]


def snapshot(site: Path) -> dict[str, bytes]:
    """Every file under site except the tool's state folder."""
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*"))
            if p.is_file() and STATE not in p.relative_to(site).parts}


def run_tool(pack: Path, site: Path, *args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(APPLY_ALL), "--pack", str(pack), "--root", str(site), *args]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)  # type: ignore[call-overload]


def kill_after_file(k: int) -> str:
    """Code for ``runner_script``: SIGKILL the run right after the k-th target file was renamed into place."""
    return (f"    orig(src, dst)\n"
            f"    if '{STATE}' not in str(dst):\n"
            f"        os.environ['N'] = str(int(os.environ.get('N', '0')) + 1)\n"
            f"        if int(os.environ['N']) == {k}:\n"
            f"            os.kill(os.getpid(), signal.SIGKILL)\n")


def runner_script(pack: Path, site: Path, args: list[str], inject: str) -> list[str]:
    """argv for a child Python that loads apply_all's engine, wraps its replace_file with ``inject`` code, and runs
    main()."""
    code = f"""
import importlib.util, os, signal, sys, time
spec = importlib.util.spec_from_file_location("apply_all_child", {str(APPLY_ALL)!r})
script = importlib.util.module_from_spec(spec); spec.loader.exec_module(script)
m = script.load_engine()
orig = m.fsio.replace_file
calls = [0]
def replace_file(src, dst):
    calls[0] += 1
{inject}
m.fsio.replace_file = replace_file
sys.exit(m.main(["--pack", {str(pack)!r}, "--root", {str(site)!r}, *{args!r}]))
"""
    return [sys.executable, "-c", code]
