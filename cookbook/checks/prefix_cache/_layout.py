"""What the prefix-cache probe expects of the server's cache: the layout (recipe or /metrics), the hit counter, and
the prompt lengths it derives when the recipe names none."""
from __future__ import annotations

import time

from pydantic import BaseModel, Field

from ...endpoint import Endpoint, metric_value
from ...errors import CookbookError, ServerDown
from ...haystack import ServedModel, format_tokens, frame_tokens, longest_frame_needle
from ..registry import CheckContext

HITS_METRIC = "vllm:prefix_cache_hits_total"
METRIC_SETTLE_S = 3.0  # the server may count a hit just after it answers
DEFAULT_PROMPTS = 8


class CacheLayout(BaseModel):
    """What the probe expects of the server's prefix cache."""

    enabled: bool = Field(description="Prefix caching on")
    block_size: int | None = Field(None, description="Tokens per cached block: cached_tokens is a multiple of it")
    hits_from_request: int = Field(2, description="The identical request by which a hit must have come")
    source: str = Field(description="Where the layout came from: 'recipe' or 'server /metrics'")
    sliding_windows: list[int] = Field(
        default_factory=list, description="Attention windows of the served model (config.json), for the prompt lengths"
    )

    def longest_hit(self, prompt_tokens: int) -> int:
        """Full blocks before the last prompt token: the most a hit can serve (0: this prompt never hits)."""
        if not self.enabled or not self.block_size:
            return 0
        return (prompt_tokens - 1) // self.block_size * self.block_size


def server_cache_config(endpoint: Endpoint) -> dict[str, str] | None:
    """The labels of vllm:cache_config_info (block_size, enable_prefix_caching, mamba_cache_mode ...), if any."""
    for metric in endpoint.metrics():
        if metric.name.startswith("vllm:cache_config_info"):
            return metric.labels
    return None


def layout_from_server(config: dict[str, str]) -> CacheLayout:
    enabled = config.get("enable_prefix_caching") == "True"
    block = config.get("block_size", "")
    return CacheLayout(
        enabled=enabled,
        block_size=int(block) if block.isdigit() else None,
        hits_from_request=hits_from_request(config),
        source="server /metrics",
    )


def hits_from_request(config: dict[str, str]) -> int:
    """In vLLM's hybrid 'align' mode a prefix is served from the cache from the third identical request."""
    return 3 if config.get("mamba_cache_mode") == "align" else 2


def default_prompt_tokens(
    max_model_len: int, answer_tokens: int, block_size: int | None, shortest: int, windows: list[int] = ()  # type: ignore[assignment]
) -> list[int]:
    """Prompt lengths for a recipe that names none, from what the server says: one shorter than a block (it must
    never hit), one just past a block boundary, then a geometric ladder to the context's end (never on a block
    boundary, so each has a partial last block), plus one past each sliding window and past twice it (a hit there
    must restore the window's blocks, not just the first ones)."""
    limit = max_model_len - answer_tokens
    if limit < shortest:
        return []
    block = block_size or 16
    lengths: set[int] = set()
    if shortest < block:
        lengths.add(max(shortest, block - max(1, block // 16)))
    start = max(shortest, 2 * block + max(1, block // 12))
    if start <= limit:
        lengths.add(start)
    for window in windows:
        for length in (window + block // 2 + 1, 2 * window + block // 2 + 1):
            if start < length <= limit:
                lengths.add(length)
    rungs = max(2, DEFAULT_PROMPTS - len(lengths))
    low = max(start, 3 * block)
    for i in range(1, rungs + 1):
        length = int(low * (limit / low) ** (i / rungs)) if limit > low else limit
        if length % block == 0:
            length -= max(1, block // 3)
        if shortest <= length <= limit:
            lengths.add(length)
    return sorted(lengths)


def read_hits(endpoint: Endpoint) -> float | None:
    """The server's prefix-cache hit counter (cached tokens since start), None when /metrics has none."""
    try:
        metrics = endpoint.metrics()
    except ServerDown:
        raise
    except CookbookError:  # no /metrics (HTTP 404 behind some proxies): the delta is simply not measured
        return None
    value = metric_value(metrics, HITS_METRIC, model_name=endpoint.model)
    return value if value is not None else metric_value(metrics, HITS_METRIC)


def hits_delta(endpoint: Endpoint, before: float | None, expected: int) -> float | None:
    """How far the hit counter moved since `before`, waiting briefly for it to reach `expected`."""
    if before is None:
        return None
    deadline = time.monotonic() + METRIC_SETTLE_S
    while True:
        after = read_hits(endpoint)
        if after is None:
            return None
        delta = after - before
        if delta >= expected or time.monotonic() >= deadline:
            return delta
        time.sleep(0.1)


def label_for(prompt_tokens: list[int], hits_from_request: int) -> str:
    lengths = sorted(prompt_tokens)
    span = format_tokens(lengths[0]) if len(lengths) == 1 else (
        f"{format_tokens(lengths[0])} to {format_tokens(lengths[-1])}"
    )
    nth = {2: "", 3: ", hit by the third identical request"}.get(hits_from_request, "")
    return (
        f"Prefix-cache hit vs cold (`cache_salt`), greedy, {len(lengths)} prompt{'s' if len(lengths) > 1 else ''} "
        f"of {span} tokens with a needle{nth}"
    )


def recipe_layout(ctx: CheckContext, served: ServedModel) -> tuple[CacheLayout, list[str]]:
    """The recipe's layout when there is a recipe (checked against the server's), else the server's own. What the
    recipe leaves out (block size, the hybrid's third-request hit) comes from the server."""
    server = served.cache_config or None
    if ctx.recipe is None:
        if server is None:
            raise CookbookError("prefix-cache: no recipe and no vllm:cache_config_info in /metrics to learn the layout")
        layout = layout_from_server(server)
        layout.sliding_windows = list(served.sliding_windows)
        return layout, []
    caching = ctx.recipe.prefix_caching
    seen = layout_from_server(server) if server is not None else None
    block = caching.block_size if caching.block_size is not None else (seen.block_size if seen else None)
    hits_from = caching.hits_from_request
    if "hits_from_request" not in caching.model_fields_set and seen is not None:
        hits_from = seen.hits_from_request
    layout = CacheLayout(
        enabled=caching.enabled,
        block_size=block,
        hits_from_request=hits_from,
        source="recipe" if caching.block_size is not None else "recipe, block size from server /metrics",
        sliding_windows=list(served.sliding_windows),
    )
    mismatches: list[str] = []
    if seen is not None:
        if seen.enabled != layout.enabled:
            mismatches.append(f"the recipe has prefix caching {'on' if layout.enabled else 'off'}, the server not")
        elif layout.enabled and seen.block_size != layout.block_size:
            mismatches.append(f"the recipe says {layout.block_size}-token blocks, the server reports {seen.block_size}")
    elif layout.enabled and layout.block_size is None:
        raise CookbookError(
            "prefix-cache: the recipe gives no prefix_caching.block_size and the server's /metrics has no "
            "vllm:cache_config_info to read it from"
        )
    return layout, mismatches


def shortest_prompt(endpoint: Endpoint) -> int:
    """The longest needle frame (instruction, needle, question, template) with this tokenizer, plus a margin."""
    return frame_tokens(endpoint, longest_frame_needle()) + 4
