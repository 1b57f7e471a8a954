"""Which reference a check gets (the recipe's golden file, a forward pass computed here, or another server), and
the facts that choice reads: the served checkpoint, its config.json, the server's KV block size."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..endpoint import Endpoint
from ..errors import CookbookError
from ..image import ImageEnv
from ._computed import COMPUTED
from ._golden import GoldenReference, golden_path
from ._server import ServerReference
from ._types import Reference, RefScore

if TYPE_CHECKING:
    from ..recipes import Recipe


def checkpoint_config(recipe: "Recipe | None", checkpoint: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The served checkpoint's config.json (`checkpoint`, else a CPU recipe's prepared weights), and where it came
    from."""
    path = checkpoint or local_checkpoint(recipe)
    if path is None:
        return None, "no local checkpoint for this recipe"
    config = path / "config.json"
    try:
        return json.loads(config.read_text()), str(config)
    except (OSError, ValueError) as exc:
        return None, f"{config}: {exc}"


def block_size_from_metrics(endpoint: Endpoint) -> int | None:
    """The KV block size the server runs with (vllm:cache_config_info in /metrics), not an assumed one."""
    try:
        metrics = endpoint.metrics()
    except CookbookError:
        return None
    for m in metrics:
        if m.name.startswith("vllm:cache_config_info"):
            value = m.labels.get("block_size", "")
            if value.isdigit():
                return int(value)
    return None


def local_checkpoint(recipe: "Recipe | None") -> Path | None:
    """Where a CPU recipe's prepared weights live (cookbook.models), if built."""
    if recipe is None or recipe.serve.weights is None:
        return None
    from ..models import models_dir

    path = models_dir() / recipe.serve.weights.prepare
    return path if (path / "config.json").exists() else None


NO_REFERENCE = "no reference recorded for this image"


class ReferenceRequest(Protocol):
    """What choosing a reference reads of a check's context (a `cookbook.checks.CheckContext` is one): declared
    here so that the reference, which the checks use, does not import the checks back."""

    endpoint: Endpoint
    recipe: "Recipe | None"
    params: dict[str, Any]


def reference_for(ctx: ReferenceRequest) -> tuple[Reference | None, str]:
    """The reference a check compares with, and a sentence saying which (or why there is none).

    `ctx.params["reference"]` may force one: "golden", "computed", or a URL (another server). By default: the
    recipe's golden file, else a forward pass computed here on the recipe's local checkpoint, else None with
    "no reference recorded for this image".
    """
    recipe = ctx.recipe
    wanted = str(ctx.params.get("reference") or "").strip()
    if wanted.startswith(("http://", "https://")):
        model = str(ctx.params.get("reference_model") or ctx.endpoint.model)
        ref: Reference = ServerReference(Endpoint(wanted, model))
        return ref, ref.source
    if wanted not in ("", "golden", "computed"):
        raise CookbookError(f"--param reference: expected golden, computed or a URL, got {wanted!r}")
    if recipe is not None and wanted in ("", "golden"):
        path = golden_path(recipe)
        if path.exists():
            golden = GoldenReference.load(path)
            return golden, golden.source
        if wanted == "golden":
            return None, f"{NO_REFERENCE} ({path.relative_to(recipe.folder)} not found)"
    checkpoint = served_checkpoint(ctx)
    if checkpoint is None:
        return None, NO_REFERENCE
    image = _image_for(recipe)
    if image is None:
        return None, f"{NO_REFERENCE} (no image environment here to compute one in)"
    ref = COMPUTED.get(checkpoint, image, recipe.model.id if recipe else None)
    return ref, ref.source


class FallbackReference:
    """The recipe's golden file where it recorded the prompt, else a forward pass computed here: a reference for any
    prompt (the probes' generated ones), loading the model only when the golden file cannot answer."""

    def __init__(self, first: Reference, then: Reference) -> None:
        self.first, self.then = first, then

    @property
    def source(self) -> str:
        return f"{self.first.source}; for a prompt it did not record, {self.then.source}"

    def can_score(self, prompt_ids: list[int]) -> bool:
        return self.first.can_score(prompt_ids) or self.then.can_score(prompt_ids)

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        chosen = self.first if self.first.can_score(prompt_ids) else self.then
        return chosen.score(prompt_ids, max_new_tokens, top_k)


def reference_for_any_prompt(ctx: ReferenceRequest) -> tuple[Reference | None, str]:
    """`reference_for`, but able to score prompts a golden file did not record (a probe's departure judged at its own
    prefix): the golden file first, then a forward pass computed here on the served checkpoint when one can run.
    `--param reference=golden` keeps the golden file alone."""
    ref, why = reference_for(ctx)
    if not isinstance(ref, GoldenReference) or str(ctx.params.get("reference") or "").strip() == "golden":
        return ref, why
    checkpoint = served_checkpoint(ctx)
    image = _image_for(ctx.recipe)
    if checkpoint is None or image is None:
        return ref, why
    both = FallbackReference(ref, COMPUTED.get(checkpoint, image, ctx.recipe.model.id if ctx.recipe else None))
    return both, both.source


def served_checkpoint(ctx: ReferenceRequest) -> Path | None:
    """The checkpoint the server serves, when it is on this machine: `--param reference_checkpoint=PATH`, else a
    CPU recipe's prepared weights."""
    given = ctx.params.get("reference_checkpoint")
    return Path(str(given)) if given else local_checkpoint(ctx.recipe)


def _image_for(recipe: "Recipe | None") -> ImageEnv | None:
    from ..image import cpu_image, cpu_image_ready

    if recipe is not None and recipe.image.kind != "vllm-cpu":
        return None
    return cpu_image() if cpu_image_ready() else None
