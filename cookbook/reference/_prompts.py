"""The oracle's prompt set, built around the served model's layout (KV block size, sliding windows, context), and
which prompt positions a golden file keeps."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

from ..haystack import filler_text


@dataclass(frozen=True)
class Layout:
    """What the prompt set is built around: the server's KV block size, the model's sliding windows, the context."""

    block_size: int | None
    windows: tuple[int, ...]
    max_model_len: int
    block_size_from: str = ""
    windows_from: str = ""


# Short prompts: plain text, no chat template (the ids go to /v1/completions as they are).
SHORT_PROMPTS = (
    "The capital of France is",
    "Question: What is 12 + 12?\nAnswer:",
    "def fibonacci(n):\n    ",
)
FILLER_SEED = "oracle"


@dataclass
class OraclePrompt:
    """One prompt of the oracle's set: its kind, why it is there, and its token ids."""

    kind: Literal["short", "blocks", "window", "long"]
    why: str
    prompt_ids: list[int]
    text: str | None = None


def _filler_ids(tokenize: Callable[[str], list[int]], tokens: int) -> list[int]:
    sentences = max(16, tokens // 8)
    ids = tokenize(filler_text(FILLER_SEED, sentences))
    while len(ids) < tokens:
        sentences *= 2
        ids = tokenize(filler_text(FILLER_SEED, sentences))
    return ids[:tokens]


def build_prompts(
    tokenize: Callable[[str], list[int]], layout: Layout, max_new_tokens: int, long_tokens: int | None = None
) -> tuple[list[OraclePrompt], list[str]]:
    """The oracle's prompt set for a served model's layout, and notes on what was left out and why.

    Short prompts; one crossing three KV blocks and ending mid-block (block size from the server); one longer than
    twice each sliding window the model's config declares; one near the served context."""
    notes: list[str] = []
    room = layout.max_model_len - max_new_tokens
    prompts = [OraclePrompt("short", "a short prompt", tokenize(text), text) for text in SHORT_PROMPTS]
    lengths: list[tuple[Literal["blocks", "window", "long"], int, str]] = []
    if layout.block_size:
        n = 3 * layout.block_size + layout.block_size // 2
        lengths.append(("blocks", n, f"crosses 3 KV blocks of {layout.block_size} tokens ({layout.block_size_from})"))
    else:
        notes.append("no block size known: no block-crossing prompt")
    for window in layout.windows:
        n = 2 * window + (layout.block_size or 16) // 2
        if n <= room:
            lengths.append(("window", n, f"past twice the sliding window of {window} tokens ({layout.windows_from})"))
        else:
            notes.append(f"the sliding window of {window} tokens is too close to the context for a prompt past it")
    long_n = min(long_tokens or room, room)
    lengths.append(("long", long_n, f"near the served context of {layout.max_model_len} tokens"))
    filler: list[int] = []
    for kind, n, why in lengths:
        if n > room:
            notes.append(f"{kind}: {n} tokens do not fit the served context ({layout.max_model_len}); left out")
            continue
        if any(p.kind != "short" and len(p.prompt_ids) == n for p in prompts):
            continue
        if len(filler) < n:
            filler = _filler_ids(tokenize, max(n, long_n))
        prompts.append(OraclePrompt(kind, why, filler[:n]))
    return prompts, notes


def recorded_positions(length: int, budget: int = 384, edge: int = 64) -> list[int]:
    """Which prompt positions a golden file keeps: all of a short prompt; of a long one, its first and last `edge`
    and an even stride through the middle (about `budget` in all), so a file stays in the hundreds of KB."""
    if length - 1 <= budget:
        return list(range(1, length))
    stride = max(1, math.ceil(length / budget))
    keep = set(range(1, edge + 1)) | set(range(stride, length, stride)) | set(range(length - edge, length))
    return sorted(p for p in keep if 1 <= p < length)
