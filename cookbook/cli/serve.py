"""`cookbook serve ID`: carry out the recipe's launch steps and stay in the foreground until SIGINT/SIGTERM.

Start-up shows its stages on stderr (image, model, fixes, then the /health wait with the elapsed time and the
server log's last line); Ctrl-C at any moment of it stops everything started and exits 130."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_RUN_FAILED
from ..launch import DEFAULT_STARTUP_TIMEOUT_S, Server, attach, serve_foreground
from ..recipes import load_recipe
from ._common import add_recipe_arg
from ._progress import cli_progress

EXAMPLES = """
  cookbook serve HuggingFaceTB/SmolLM2-135M-Instruct                 # port 8000, or a free one; Ctrl-C stops it (also during start-up: exit 130)
  cookbook serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8001 --run-dir runs/smol
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="default 8000, or a free port if 8000 is taken")
    parser.add_argument("--run-dir", type=Path, help="where server.log goes (default runs/<time>-<recipe>)")
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S, help="seconds to wait for /health")
    parser.add_argument("--base-url", metavar="URL", help="attach to a server someone else started instead of starting one")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    if args.base_url:
        endpoint = attach(args.base_url, recipe.served_model_name)
        pool = endpoint.kv_pool_tokens()
        shown = f"{pool:,} tokens" if pool is not None else "unknown"
        print(f"ready: {endpoint.api_url} model={endpoint.model} kv_pool={shown} (attached)")
        return 0
    server = Server(recipe, host=args.host, port=args.port, run_dir=args.run_dir, startup_timeout_s=args.startup_timeout,
                    progress=cli_progress())
    code = serve_foreground(server)
    return EXIT_RUN_FAILED if code == 1 else code  # 1: the server did not come up, or exited while serving
