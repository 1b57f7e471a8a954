#!/usr/bin/env python3
"""Notebook hygiene: commit notebooks without outputs, and keep a readable text form of each for review.

  clean          stdin to stdout: the git `clean` filter (`.gitattributes`, set up by `make hooks`), so `git add`
                 stores a notebook stripped while the working copy keeps its outputs
  strip FILE...  the same, in place (the pre-commit hook; `--check` only reports, exit 1 if one would change)
  sync           write notebooks/text/NN_name.py (jupytext percent format) from each notebook (`make notebooks-sync`)
  check-sync     exit 1 naming every text form out of step with its notebook (or without one)

`clean` and `strip` need only the standard library (a git filter must run before any venv exists); `sync` and
`check-sync` import jupytext, a dev dependency (run them through scripts/in-env.sh). docs/notebooks.md, "Notebook
hygiene", says why.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TEXT = NOTEBOOKS / "text"
TEXT_FORMAT = "py:percent"
# What a run leaves in a cell's metadata: timings, papermill's bookkeeping, the output area's scroll state. Tags
# (`parameters`!) and anything a person set on purpose stay.
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime", "papermill", "scrolled", "collapsed")
# What a kernel leaves in the notebook's: widget state (large, per session), papermill's run record, and the
# language_info a kernel fills in (its Python version) beyond the name.
VOLATILE_NOTEBOOK_METADATA = ("widgets", "papermill", "varInspector", "toc")


def strip(book: dict[str, Any]) -> dict[str, Any]:
    """The notebook without outputs, execution counts or volatile metadata (changed in place, and returned)."""
    for cell in book.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        metadata = cell.get("metadata", {})
        for key in VOLATILE_CELL_METADATA:
            metadata.pop(key, None)
    metadata = book.get("metadata", {})
    for key in VOLATILE_NOTEBOOK_METADATA:
        metadata.pop(key, None)
    if isinstance(metadata.get("language_info"), dict) and "name" in metadata["language_info"]:
        metadata["language_info"] = {"name": metadata["language_info"]["name"]}
    return book


def dumps(book: dict[str, Any]) -> str:
    """Exactly as nbformat writes a notebook (indent 1, sorted keys, UTF-8), so a clean notebook round-trips."""
    return json.dumps(book, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def clean_text(text: str) -> str:
    """The stripped notebook's text; text that is not a notebook's JSON (a conflict's markers) passes unchanged."""
    try:
        book = json.loads(text)
    except ValueError:
        print("notebook_hygiene: not JSON, left as it is", file=sys.stderr)
        return text
    if not isinstance(book, dict) or "cells" not in book:
        return text
    return dumps(strip(book))


def strip_files(paths: list[Path], check: bool) -> list[Path]:
    """Strip each file in place (or, with `check`, only find them); the files that had something to strip."""
    changed = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        cleaned = clean_text(text)
        if cleaned != text:
            changed.append(path)
            if not check:
                path.write_text(cleaned, encoding="utf-8")
    return changed


def text_path(notebook: Path) -> Path:
    return notebook.parent / "text" / f"{notebook.stem}.py"


def text_form(notebook: Path) -> str:
    """The notebook's paired text: jupytext percent format, cells' tags kept, no header (the kernel and jupytext's
    version live in the notebook only, so a kernelspec or jupytext upgrade does not touch the text)."""
    import jupytext

    book = jupytext.read(notebook)
    book.metadata.setdefault("jupytext", {})["notebook_metadata_filter"] = "-all"
    return str(jupytext.writes(book, fmt=TEXT_FORMAT))


def out_of_sync(notebooks_dir: Path = NOTEBOOKS) -> list[str]:
    """One line per text form that differs from its notebook's, is missing, or has no notebook."""
    books = sorted(notebooks_dir.glob("*.ipynb"))
    problems = []
    for book in books:
        paired = text_path(book)
        if not paired.is_file():
            problems.append(f"{paired.relative_to(notebooks_dir.parent)}: missing (make notebooks-sync)")
        elif paired.read_text(encoding="utf-8") != text_form(book):
            problems.append(f"{paired.relative_to(notebooks_dir.parent)}: differs from {book.name} (make notebooks-sync)")
    wanted = {text_path(book) for book in books}
    for orphan in sorted(set((notebooks_dir / "text").glob("*.py")) - wanted):
        problems.append(f"{orphan.relative_to(notebooks_dir.parent)}: no notebook of that name (delete it)")
    return problems


def sync(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """Write every notebook's text form and delete text forms without a notebook; the files written or deleted."""
    touched = []
    for book in sorted(notebooks_dir.glob("*.ipynb")):
        paired, text = text_path(book), text_form(book)
        if not paired.is_file() or paired.read_text(encoding="utf-8") != text:
            paired.parent.mkdir(exist_ok=True)
            paired.write_text(text, encoding="utf-8")
            touched.append(paired)
    wanted = {text_path(book) for book in notebooks_dir.glob("*.ipynb")}
    for orphan in set((notebooks_dir / "text").glob("*.py")) - wanted:
        orphan.unlink()
        touched.append(orphan)
    return touched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("clean", help="strip the notebook on stdin to stdout (git clean filter)")
    strip_cmd = commands.add_parser("strip", help="strip notebooks in place (pre-commit hook)")
    strip_cmd.add_argument("files", nargs="*", type=Path)
    strip_cmd.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    commands.add_parser("sync", help="write notebooks/text/*.py from the notebooks")
    commands.add_parser("check-sync", help="exit 1 if a text form is out of step with its notebook")
    args = parser.parse_args(argv)
    if args.command == "clean":
        sys.stdout.buffer.write(clean_text(sys.stdin.buffer.read().decode("utf-8")).encode("utf-8"))
        return 0
    if args.command == "strip":
        changed = strip_files(args.files, args.check)
        for path in changed:
            print(f"{path}: {'has' if args.check else 'stripped'} outputs, execution counts or volatile metadata")
        return 1 if changed and args.check else 0
    if args.command == "sync":
        for path in sync():
            print(f"{path.relative_to(ROOT)}: written")
        return 0
    problems = out_of_sync()
    print("\n".join(problems) or "every notebook's text form is in step")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
