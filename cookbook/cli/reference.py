"""`cookbook reference record RECIPE [--from computed | --base-url URL] [--server URL] [--out PATH]`.

Records the numerics oracle's golden file in the recipe's folder (reference/golden.json): from a forward pass
computed here on the recipe's local checkpoint, or from a trusted server.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import CookbookError
from ..recipes import load_recipe
from ..reference import record


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("reference", help="the numerics oracle's reference: record a golden file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    rec = actions.add_parser("record", help="record a recipe's golden file (prompts, token ids, top-k logprobs)")
    rec.add_argument("recipe", help="recipe id or path")
    rec.add_argument(
        "--from", dest="source", choices=["computed"], default=None,
        help="computed: a transformers forward pass (CPU, fp32) in the image's environment (the default)",
    )
    rec.add_argument("--base-url", metavar="URL", help="record from this trusted server instead")
    rec.add_argument("--server", metavar="URL", help="with --from computed: take token ids and block size from this server")
    rec.add_argument("--out", type=Path, metavar="PATH", help="where to write (default: the recipe's reference/golden.json)")
    rec.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.source == "computed" and args.base_url:
        raise CookbookError("--from computed and --base-url: choose one source")
    recipe = load_recipe(args.recipe)
    path = record(
        recipe, base_url=args.base_url, layout_url=args.server, out=args.out,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"recorded: {path} ({path.stat().st_size:,} bytes)")
    return 0
