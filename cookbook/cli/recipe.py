"""`cookbook recipe list|show|validate|launch-script`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ..recipes import list_recipes, load_recipe, render_launch_block, shown_recipe
from . import _recipe_new
from ._common import add_recipe_arg

EXAMPLES = """
  cookbook recipe new /models/Llama-3.1-8B-Instruct --hardware gaudi2 --cards 1 --profile v0.26.0   # from its config.json
  cookbook recipe list
  cookbook recipe show HuggingFaceTB/SmolLM2-135M-Instruct
  cookbook recipe validate recipes/Qwen/Qwen3-Coder-Next/recipe.yaml   # exit 0, or 2 naming file and field
  cookbook recipe launch-script Qwen/Qwen3-Coder-Next
  cookbook recipe container Qwen/Qwen3-Coder-Next --devices 0,1,2,3
"""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="recipe_command", required=True, metavar="ACTION")
    _recipe_new.configure(sub)
    sub.add_parser("list", help="every recipe: id, hardware, image").set_defaults(run=_list)
    show = sub.add_parser("show", help="a recipe as validated YAML")
    add_recipe_arg(show)
    show.set_defaults(run=_show)
    validate = sub.add_parser(
        "validate", help="everything that cannot run, in one run: schema, duplicate keys, flags against vLLM's "
        "parser, ranges, parallelism against cards and the model, facts that must agree, image against profile, literal secrets, "
        "the seeds' What-not-to-do rules: exit 0 if valid (warnings shown), else 2")
    add_recipe_arg(validate)
    validate.set_defaults(run=_validate)
    script = sub.add_parser("launch-script", help="the recipe's Launch block, as the recipe page shows it")
    add_recipe_arg(script)
    script.set_defaults(run=_launch_script)
    container = sub.add_parser("container", help="the `docker run` that starts a Gaudi recipe's vllm-gaudi container")
    add_recipe_arg(container)
    container.add_argument("--image", help="the vllm-gaudi image (default vllm-gaudi:<the recipe's tag>)")
    container.add_argument("--devices", metavar="I,J", help="card indices to make visible (default the first N)")
    container.add_argument("--port", type=int, default=8000, help="host port for the server (default 8000)")
    container.add_argument("--checkout", type=Path, help="the cookbook checkout to mount (default this one)")
    container.add_argument("--hf-cache", type=Path, help="the Hugging Face cache to mount (default $HF_HOME or ~/.cache/huggingface)")
    container.set_defaults(run=_container)


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
    """Every problem in one run: duplicate keys and schema errors, then (when the recipe loads) the lint rules and
    the checks of what cannot run. Errors on stderr, warnings and the verdict on stdout; exit 2 on any error."""
    from ..validate_rules import validate_recipe
    from ..recipes import RecipeInvalid

    try:
        recipe = load_recipe(args.recipe)
        problems: list[str] = []
    except RecipeInvalid as exc:
        if exc.recipe is None:
            for problem in exc.problems:
                print(f"error: {problem}", file=sys.stderr)
            print(f"invalid: {exc.path}: {len(exc.problems)} error(s)")
            return 2
        recipe, problems = exc.recipe, exc.problems
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    findings = validate_recipe(recipe)
    for finding in findings:
        print(finding.line(recipe.path), file=sys.stderr if finding.severity == "error" else sys.stdout)
    errors = len(problems) + sum(f.severity == "error" for f in findings)
    warned = sum(f.severity != "error" for f in findings)
    warnings = f", {warned} warning(s)" if warned else ""
    if errors:
        print(f"invalid: {recipe.path} ({recipe.id}): {errors} error(s){warnings}")
        return 2
    print(f"ok: {recipe.path} ({recipe.id}){warnings}")
    return 0


def _launch_script(args: argparse.Namespace) -> int:
    print(render_launch_block(load_recipe(args.recipe)), end="")
    return 0


def _container(args: argparse.Namespace) -> int:
    from ..container import ContainerSpec, parse_devices, render_docker_run

    recipe = load_recipe(args.recipe)
    spec = ContainerSpec(image=args.image, port=args.port, devices=parse_devices(args.devices))
    if args.checkout is not None:
        spec.checkout = args.checkout.resolve()
    if args.hf_cache is not None:
        spec.hf_cache = args.hf_cache.resolve()
    print(render_docker_run(recipe, spec), end="")
    return 0
