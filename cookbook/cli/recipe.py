"""`cookbook recipe list|show|validate|launch-script`."""
from __future__ import annotations

import argparse

import yaml

from ..recipes import list_recipes, load_recipe, render_launch_block, shown_recipe


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("recipe", help="list, show, validate recipes and print launch blocks")
    sub = parser.add_subparsers(dest="recipe_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="every recipe: id, hardware, image").set_defaults(run=_list)
    show = sub.add_parser("show", help="a recipe as validated YAML")
    show.add_argument("recipe", metavar="ID")
    show.set_defaults(run=_show)
    validate = sub.add_parser("validate", help="exit 0 if valid, else one line naming file and field, exit 2")
    validate.add_argument("recipe", metavar="PATH|ID")
    validate.set_defaults(run=_validate)
    script = sub.add_parser("launch-script", help="the recipe's Launch block, as the recipe page shows it")
    script.add_argument("recipe", metavar="ID")
    script.set_defaults(run=_launch_script)


def _list(args: argparse.Namespace) -> int:
    rows = [(r.id, r.hardware.description, r.image.label.replace("`", "")) for r in list_recipes()]
    width = max(len(r[0]) for r in rows)
    for rid, hardware, image in rows:
        print(f"{rid:<{width}}  {hardware}  |  {image}")
    return 0


def _show(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    data = shown_recipe(recipe)
    print(yaml.safe_dump(data, sort_keys=False, width=110), end="")
    return 0


def _validate(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    print(f"ok: {recipe.path} ({recipe.id})")
    return 0


def _launch_script(args: argparse.Namespace) -> int:
    print(render_launch_block(load_recipe(args.recipe)), end="")
    return 0
