"""`cookbook k8s render RECIPE|--fleet FILE [--out DIR] [...]`: the recipe's Kubernetes manifests, written as files."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..k8s import (DEFAULT_COOKBOOK_IMAGE, DEFAULT_SECRET, DEFAULT_STARTUP_BUDGET_S, RUNS_SIZE, make_options,
                   render_fleet, render_recipes, write_manifests)
from ..errors import UsageError
from ..recipes import load_recipe
from ._common import add_hardware_arg, add_out_arg, add_recipe_arg

EXAMPLES = """
  cookbook k8s render Qwen/Qwen3-Coder-Next --out k8s --namespace llm --hardware "gaudi2:four Gaudi 2 cards"
  kubectl apply -f k8s/qwen-qwen3-coder-next/
  cookbook k8s render --fleet docs/examples/fleet-gaudi.yaml --out k8s --namespace llm
"""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="k8s_command", required=True, metavar="ACTION")
    render = sub.add_parser("render", help="write the manifests of a recipe under --out/<name>/ (see docs/kubernetes.md)")
    add_recipe_arg(render, optional=True, help="recipe id or path (or --fleet FILE)")
    render.add_argument("--fleet", type=Path, metavar="FILE",
                        help="a fleet file: each launch: true entry's server, and one Job running `cookbook run --fleet`")
    add_out_arg(render, "the manifests, one folder per recipe (and fleet/ for a fleet's run Job)", default="k8s")
    render.add_argument("--image", help="the server image (default <kind>:<tag> from the recipe, e.g. vllm-gaudi:v0.26.0)")
    render.add_argument("--cookbook-image", help=f"the image holding this checkout at /cookbook (default {DEFAULT_COOKBOOK_IMAGE})")
    render.add_argument("--name", help="base name of the objects (default from the recipe id)")
    render.add_argument("--namespace", help="namespace of every object (default: kubectl's current one)")
    render.add_argument("--secret", help=f"the Secret holding secret-named variables by name (default {DEFAULT_SECRET})")
    render.add_argument("--storage-class", help="storage class of the claims (default: the cluster's default)")
    render.add_argument("--cache-size", metavar="SIZE", help="Hugging Face cache claim, e.g. 200Gi (default 1.2 x the weights + 10Gi)")
    render.add_argument("--runs-size", metavar="SIZE", help=f"run-folder claim (default {RUNS_SIZE})")
    render.add_argument("--shm-size", metavar="SIZE", help="/dev/shm limit (default 4Gi per Gaudi card, 1Gi on CPU)")
    render.add_argument("--startup-budget", type=int, metavar="SECONDS",
                        help=f"how long the server may take to answer /health (default {DEFAULT_STARTUP_BUDGET_S})")
    add_hardware_arg(render, "what serves the recipe, for the run's results", default="not stated")
    render.add_argument("--port", type=int, help="the Service's port (default 8000)")
    render.set_defaults(run=run_render)


def run_render(args: argparse.Namespace) -> int:
    options = make_options(
        image=args.image, cookbook_image=args.cookbook_image, name=args.name, namespace=args.namespace,
        secret=args.secret, storage_class=args.storage_class, cache_size=args.cache_size, runs_size=args.runs_size,
        shm_size=args.shm_size, startup_budget_s=args.startup_budget, hardware=args.hardware, port=args.port,
    )
    if bool(args.recipe) == bool(args.fleet):
        raise UsageError("k8s render: give a recipe id or --fleet FILE (one of them)")
    if args.fleet:
        from ..fleet_file import load_fleet

        items = render_fleet(load_fleet(args.fleet), options, source=str(args.fleet))
    else:
        items = render_recipes([load_recipe(args.recipe)], options)
    for path in write_manifests(items, args.out):
        print(f"wrote {path}")
    for item in items:
        keys = ", ".join(f"{k}{'' if required else ' (optional)'}" for k, required in item.secret_keys.items())
        where = f"server at {item.service_url}" if item.service_url else "the fleet's run Job"
        print(f"{item.recipe}: Secret {options.secret} with keys {keys or '(none)'}; {where}; "
              f"kubectl apply -f {Path(args.out) / item.name}/ (docs/kubernetes.md)")
    return 0
