"""A registry server's own process (tests/servers.py): the recipe, changed as its spec says, started by the
library's foreground path (`serve_foreground`, as `cookbook serve` runs it) until SIGINT or SIGTERM.

    python tests/_serve.py '{"recipe": ID, "env": {...}, "flags": {...}, "port": N, "run_dir": DIR}'

A process of its own, not a thread of pytest's: a start-up runs while other tests run, and tests change the
environment (COOKBOOK_CACHE) and reload modules (the fix engine) that a start reads. Prints `session SID` the moment
`vllm serve` runs (for the guard), then the launcher's ready line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cookbook.launch import Server, serve_foreground
from cookbook.recipes import load_recipe


def main() -> int:
    spec = json.loads(sys.argv[1])
    recipe = load_recipe(spec["recipe"])
    if spec.get("env"):
        recipe = recipe.model_copy(update={"environment": {**recipe.environment, **spec["env"]}})

    def tell_session(sid: int) -> None:
        print(f"session {sid}", flush=True)

    server = Server(recipe, port=spec["port"], run_dir=Path(spec["run_dir"]), extra_flags=spec.get("flags") or {},
                    say=lambda _line: None, on_process=tell_session)
    return serve_foreground(server, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
