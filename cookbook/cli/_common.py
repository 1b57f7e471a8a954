"""Arguments several commands share: how to reach a server."""
from __future__ import annotations

import argparse

from ..endpoint import Endpoint
from ..launch import attach
from ..recipes import Recipe, load_recipe


def add_server_args(parser: argparse.ArgumentParser, recipe_required: bool = False) -> None:
    parser.add_argument("--base-url", help="a running OpenAI-compatible vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--recipe", required=recipe_required, help="recipe id or path (expectations, model name)")
    parser.add_argument("--model", help="served model name (default: the recipe's, else the server's first)")


def recipe_from(args: argparse.Namespace) -> Recipe | None:
    return load_recipe(args.recipe) if getattr(args, "recipe", None) else None


def endpoint_from(args: argparse.Namespace, recipe: Recipe | None) -> Endpoint:
    from ..errors import CookbookError

    if not args.base_url:
        raise CookbookError("--base-url: required (start a server with `cookbook serve RECIPE`)")
    model = args.model or (recipe.served_model_name if recipe else None)
    return attach(args.base_url, model)
