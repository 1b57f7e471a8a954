"""The one language every command speaks: the recipe as the first word, `--out DIR` an output folder,
`--hardware KIND:DESCRIPTION`, `--param KEY=VALUE`, and how to reach a server (docs/cli.md)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ..endpoint import Endpoint
    from ..recipes import Recipe

_warned: set[str] = set()


def deprecated(old: str, instead: str) -> None:
    """Say once per process that a published form still works but has a new spelling."""
    if old not in _warned:
        _warned.add(old)
        print(f"warning: {old} is deprecated; {instead}", file=sys.stderr, flush=True)


# -- the recipe -------------------------------------------------------------------------------------------------------


def add_recipe_arg(parser: argparse.ArgumentParser, optional: bool = False, help: str = "recipe id or path",
                   alias: bool = False) -> None:
    """RECIPE, the first word after the command, in every command that takes one. `alias`: the command used to
    take `--recipe ID`, still accepted (hidden) with a warning so published commands keep working."""
    parser.add_argument("recipe", metavar="RECIPE", nargs="?" if optional else None, help=help)
    if alias:
        parser.add_argument("--recipe", dest="recipe_flag", metavar="RECIPE", help=argparse.SUPPRESS)


def resolve_recipe_flag(args: argparse.Namespace) -> None:
    """Fold the deprecated `--recipe ID` into the RECIPE argument (warning once)."""
    flag = getattr(args, "recipe_flag", None)
    if flag is None:
        return
    if args.recipe is not None and args.recipe != flag:
        raise UsageError(f"--recipe: {flag!r} and RECIPE {args.recipe!r} disagree; give the recipe once, first")
    deprecated("--recipe ID", f"give the recipe first: `cookbook {getattr(args, 'command', None) or 'verify'} {flag} ...`")
    args.recipe, args.recipe_flag = flag, None


def recipe_from(args: argparse.Namespace) -> Recipe | None:
    from ..recipes import load_recipe

    resolve_recipe_flag(args)  # also when a command's run() is called with a parser built by hand
    return load_recipe(args.recipe) if getattr(args, "recipe", None) else None


# -- a server ---------------------------------------------------------------------------------------------------------


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """RECIPE (optional: expectations and model name), --base-url and --model, as verify and bench take them."""
    add_recipe_arg(parser, optional=True, help="recipe id or path (expectations, model name)", alias=True)
    parser.add_argument("--base-url", metavar="URL", help="a running OpenAI-compatible vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the recipe's, else the server's first)")


def endpoint_from(args: argparse.Namespace, recipe: Recipe | None) -> Endpoint:
    from ..launch import attach

    if not args.base_url:
        raise UsageError("--base-url: required (start a server with `cookbook serve RECIPE`)")
    model = args.model or (recipe.served_model_name if recipe else None)
    return attach(args.base_url, model)


# -- --out, --hardware, --param ---------------------------------------------------------------------------------------


def add_out_arg(parser: argparse.ArgumentParser, what: str, default: str | None = None) -> None:
    """`--out DIR`: in every command, the folder its files go to (created if absent)."""
    parser.add_argument("--out", type=Path, metavar="DIR", default=Path(default) if default else None,
                        help=f"the output folder: {what}" + (f" (default {default})" if default else ""))


def out_file(out: Path | None, name: str, suffix: str) -> Path | None:
    """The file a command writes under `--out DIR` (DIR/name), refused before any work if it could not be written.
    A path ending in `suffix` is the old meaning of --out (the file itself): still accepted, with a warning."""
    from ..results import check_output_path

    if out is None:
        return None
    if out.suffix == suffix and not out.is_dir():
        check_output_path(out, "--out")
        deprecated(f"--out FILE{suffix}", f"--out names a folder now; {name} is written in it")
        return out
    check_output_path(out, "--out", folder=True)
    return out / name


def add_hardware_arg(parser: argparse.ArgumentParser, what: str = "what serves the model",
                     default: str = "this machine for CPU recipes") -> None:
    """`--hardware KIND:DESCRIPTION`, parsed by `results.parse_hardware` wherever it is given."""
    parser.add_argument("--hardware", metavar="KIND:DESCRIPTION",
                        help=f"{what}, e.g. 'gaudi2:four Gaudi 2 cards' (default: {default})")


def add_param_arg(parser: argparse.ArgumentParser, what: str, example: str, listed_by: str = "") -> None:
    """`--param KEY=VALUE` (repeatable); `listed_by` names where the command lists the keys it takes."""
    where = f"; {listed_by} lists them" if listed_by else ""
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help=f"{what}, e.g. --param {example}; VALUE as YAML, a,b a list (repeatable){where}")


def parse_params(items: list[str], upper_case_keys: bool = False) -> dict[str, Any]:
    """`--param KEY=VALUE`, the one grammar: VALUE is read as YAML (4, 0.5, true, [1, 2], 'a, b'), a bare comma
    list (2000,4000) as a list of such values. `upper_case_keys`: the notebooks' parameters (STREAMS=4). Whether a
    key exists and what type its value must be is for its reader (the checks' declarations, the notebooks'
    parameters cells). An empty VALUE is refused (write null)."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise UsageError(f"--param: expected KEY=VALUE, got {item!r}")
        if upper_case_keys and not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            raise UsageError(f"--param: expected NAME=VALUE with an upper-case NAME, got {item!r}")
        params[key] = _value(key, value.strip())
    return params


def _value(key: str, text: str) -> Any:
    import yaml

    if text[0] not in "[{'\"" and "," in text:
        return [_value(key, word.strip()) for word in text.split(",") if word.strip()]
    for kind in (int, float):  # as typed: 010 is ten and 1e3 a thousand (YAML 1.1 reads them otherwise)
        try:
            return kind(text.replace("_", "")) if kind is int else kind(text)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UsageError(f"--param: {key}: the value is not valid YAML") from None
    return value if isinstance(value, (str, bool, list, dict, type(None))) else text  # a date stays as typed
