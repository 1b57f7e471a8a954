"""The fix pack's engine: read the pack, check the image, apply and revert payloads with a ledger, a journal and a
blob store, capture new payloads.

Python 3.10+ standard library only, no import of ``cookbook``: it runs inside a bare vllm-gaudi or vllm-cpu
image, started by ``fixes/apply_all.py`` (the one entry point the Launch blocks call).  ``cookbook.fixpack`` reads the
pack through ``load_pack`` here, so the pack has one reader.

Modules, each below the ones after it: ``base`` (exit codes, errors), ``diff`` (the strict applier), ``pack`` (the
pack on disk), ``image`` (packages and pins), ``fsio`` (atomic writes), ``lock``, ``state`` (ledger, journal, blobs),
``plan`` (gate, plan, commit), ``recovery`` (the blob store), ``commands``, ``capture``, ``cli``.
"""
from .base import EXIT_IMAGE, EXIT_IO, EXIT_OK, EXIT_STATE, EXIT_USAGE, PACK_DIR, FixError, Outcome, StateError
from .cli import main, parse_args, run
from .diff import FilePatch, Hunk, HunkMismatch, apply_file_patch, parse_diff
from .pack import Fix, Pack, Pin, Profile, Target, load_pack

__all__ = [
    "EXIT_IMAGE", "EXIT_IO", "EXIT_OK", "EXIT_STATE", "EXIT_USAGE", "PACK_DIR",
    "FilePatch", "Fix", "FixError", "Hunk", "HunkMismatch", "Outcome", "Pack", "Pin", "Profile", "StateError", "Target",
    "apply_file_patch", "load_pack", "main", "parse_args", "parse_diff", "run",
]
