#!/usr/bin/env python3
"""Apply the Gaudi Cookbook fix pack to the packages of a stock image, safely, at every container start.

The one entry point: the Launch blocks run ``python3 "$COOKBOOK/fixes/apply_all.py" --profile NAME [OPT_IN ...]``
before ``vllm serve``.  The engine is the package ``fixengine`` beside this file; both are Python standard library
only, with no import of ``cookbook``, because they run inside a bare vllm-gaudi (or vllm-cpu) image.  The pack lives
next to this file:

    fixes/<profile>/ORDER               the profile's fix order, one fix id a line (# comments)
    fixes/<profile>/profile.json        image pins and the sha256 of every file the profile's fixes touch
    fixes/<profile>/<fix>/fix.json      metadata of one fix
    fixes/<profile>/<fix>/payload.diff  its payload (a unified diff of our own writing), if the pack has it

Guarantees: nothing is written unless the image matches and every selected payload applies; each file is written
via a temp file and an atomic rename; a failure restores every touched file; a journal written before the first
rename lets the next run repair a run that was killed; a ledger next to the package makes re-runs no-ops and
reverts byte-identical; when the ledger or journal cannot be trusted, a full revert restores the originals saved
before the first write (the blob store).  ``--capture`` is the authoring side: it writes a fix's payload and hashes
from an edited copy of the image's files.  See docs/fixes.md for the format, the ledger, recovery and exit codes.
"""
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load_engine() -> ModuleType:
    """Import ``fixengine`` from beside this file, whatever the working directory, then take this folder off
    ``sys.path`` again: the pack folder must never shadow an installed package (the engine locates the image's
    packages through the import system)."""
    while str(HERE) in sys.path:
        sys.path.remove(str(HERE))
    if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == HERE:
        del sys.path[0]
    cached = sys.modules.get("fixengine")
    if cached is not None and Path(getattr(cached, "__file__", "") or "").resolve().parent == HERE / "fixengine":
        return cached
    sys.modules.pop("fixengine", None)
    sys.path.insert(0, str(HERE))
    try:
        import fixengine  # noqa: PLC0415 (only once this folder is on the path)
    finally:
        sys.path.remove(str(HERE))
    return fixengine


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # a container running as root leaves no root-owned caches in the checkout
    sys.exit(load_engine().main())
