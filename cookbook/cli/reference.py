"""`cookbook reference record RECIPE [--from computed | --base-url URL] [--server URL] [--out DIR]`.

Records the numerics oracle's golden file in the recipe's folder (reference/golden.json): from a forward pass
computed here on the recipe's local checkpoint, or from a trusted server.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import UsageError
from ..recipes import load_recipe
from ..reference import record
from ._common import add_out_arg, add_recipe_arg, out_file

EXAMPLES = """
  cookbook reference record HuggingFaceTB/SmolLM2-135M-Instruct               # computed here, into the recipe folder
  cookbook reference record Qwen/Qwen3-Coder-Next --base-url http://trusted-host:8000 --out /tmp/qwen-ref
"""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    rec = actions.add_parser("record", help="record a recipe's golden file (prompts, token ids, top-k logprobs)")
    add_recipe_arg(rec)
    rec.add_argument(
        "--from", dest="source", choices=["computed"], default=None,
        help="computed: a transformers forward pass (CPU, fp32) in the image's environment (the default)",
    )
    rec.add_argument("--base-url", metavar="URL", help="record from this trusted server instead")
    rec.add_argument("--server", metavar="URL", help="with --from computed: take token ids and block size from this server")
    add_out_arg(rec, "write golden.json in it (default: the recipe's reference/ folder)")
    rec.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.source == "computed" and args.base_url:
        raise UsageError("--from computed and --base-url: choose one source")
    out = out_file(args.out, "golden.json", ".json")
    recipe = load_recipe(args.recipe)
    path = record(
        recipe, base_url=args.base_url, layout_url=args.server, out=out,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"recorded: {path} ({path.stat().st_size:,} bytes)")
    return 0
