"""What an open loop sends: random lengths with a spread, a shared-prefix workload, or a ShareGPT-shaped JSON file.

Lengths are drawn the way `vllm bench serve --dataset-name random` draws them (integer-uniform in
[len x (1 - ratio), len x (1 + ratio)], seeded), and every prompt is built from single-token English words, so that
a prompt of N words is about N tokens on a BPE tokenizer; the server's own count (`usage.prompt_tokens`, chat
template included) is what the results record. The shared-prefix workload gives each of its groups one long common
prefix, so that under load every request after a group's first can be served from the prefix cache (the results
record `cached_tokens`). Nothing here talks to a server: a ShareGPT file's answers are measured by the token counter
the caller passes (`/tokenize` from the CLI).
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import UsageError
from .client import StreamRequest

DatasetName = Literal["random", "shared-prefix", "sharegpt"]
DATASETS: tuple[str, ...] = ("random", "shared-prefix", "sharegpt")

# Common English words that BPE tokenizers (GPT-2 style, SmolLM2's, Llama's) keep as one token with a leading space.
WORDS = tuple(
    "the of and to in is was for on that with as by at from his her it an be this are or had not but were which "
    "they one you all we can their has been more there when who will no if out so said what up its about into than "
    "them only other new some time could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since against go came right "
    "used take three".split()
)

# ShareGPT entries vllm bench serve would skip as too short to time (its `is_valid_sequence` minimum).
SHAREGPT_MIN_TOKENS = 4


class DatasetConfig(BaseModel):
    """Which requests an open loop sends; the lengths are tokens of the user message (words, see the module)."""

    model_config = ConfigDict(extra="forbid")

    name: DatasetName = Field("random", description="random, shared-prefix or sharegpt (needs path)")
    input_len: int = Field(128, gt=0, description="Mean prompt length (random) or per-request suffix (shared-prefix)")
    output_len: int = Field(128, gt=0, description="Mean output tokens, fixed per request with ignore_eos")
    range_ratio: float = Field(0.0, ge=0, lt=1, description="Spread of both lengths: uniform in len x (1 -/+ ratio)")
    prefix_groups: int = Field(4, gt=0, description="shared-prefix: groups, each sharing one long prefix")
    prefix_len: int = Field(512, gt=0, description="shared-prefix: tokens of each group's common prefix")
    path: Path | None = Field(None, description="sharegpt: the JSON file (a list of {conversations: [...]})")
    sharegpt_output_len: int | None = Field(
        None, gt=0, description="sharegpt: fixed output tokens instead of each entry's answer length"
    )


def length_range(mean: int, ratio: float) -> tuple[int, int]:
    """The integer range vllm bench's random dataset draws a length from: [floor(mean(1-r)), ceil(mean(1+r))]."""
    return max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _request(text: str, output_len: int, timeout_s: float) -> StreamRequest:
    return StreamRequest([{"role": "user", "content": text}], output_len, timeout_s)


def random_requests(count: int, config: DatasetConfig, seed: int, timeout_s: float) -> list[StreamRequest]:
    """`count` prompts of random words, input and output lengths drawn uniformly around the configured means."""
    rng = random.Random(f"random:{seed}")
    low_in, high_in = length_range(config.input_len, config.range_ratio)
    low_out, high_out = length_range(config.output_len, config.range_ratio)
    out = []
    for i in range(count):
        length, answer = rng.randint(low_in, high_in), rng.randint(low_out, high_out)
        out.append(_request(f"{i}: {_words(rng, max(1, length - 2))}", answer, timeout_s))  # "i:" is about 2 tokens
    return out


def shared_prefix_requests(count: int, config: DatasetConfig, seed: int, timeout_s: float) -> list[StreamRequest]:
    """`count` prompts in `prefix_groups` groups: each group's long common prefix, then a short suffix of its own;
    groups interleaved in a seeded order, so that the prefix cache is exercised under load, not one group at a time."""
    rng = random.Random(f"shared-prefix:{seed}")
    prefixes = [f"Document {g}: {_words(rng, max(1, config.prefix_len - 3))}" for g in range(config.prefix_groups)]
    low_in, high_in = length_range(config.input_len, config.range_ratio)
    low_out, high_out = length_range(config.output_len, config.range_ratio)
    groups = [i % config.prefix_groups for i in range(count)]
    rng.shuffle(groups)
    return [
        _request(f"{prefixes[g]}\nQuestion {i}: {_words(rng, rng.randint(low_in, high_in))}",
                 rng.randint(low_out, high_out), timeout_s)
        for i, g in enumerate(groups)
    ]


def read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(prompt, answer) of every entry with two turns; a file that is not ShareGPT-shaped is one line naming it."""
    where = f"--dataset-path {path}"
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: cannot be read ({type(exc).__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, list):
        raise UsageError(f"{where}: expected a JSON list of {{\"conversations\": [...]}} entries, got {type(data).__name__}")
    pairs = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, answer = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(answer, str) and prompt.strip():
            pairs.append((prompt, answer))
    if not pairs:
        raise UsageError(f"{where}: no entry with two conversation turns ({len(data)} entries; "
                         "expected [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, {\"from\": \"gpt\", ...}]}])")
    return pairs


def sharegpt_requests(count: int, config: DatasetConfig, seed: int, timeout_s: float,
                      count_tokens: Callable[[str], int], max_model_len: int | None = None) -> list[StreamRequest]:
    """`count` entries of a ShareGPT-shaped file in a seeded order (repeated if it holds fewer), each its first turn
    as the prompt and its second turn's length in tokens (or `sharegpt_output_len`) as the fixed output; entries
    shorter than SHAREGPT_MIN_TOKENS or longer than the context are skipped, as vllm bench serve skips them."""
    if config.path is None:
        raise UsageError("--dataset sharegpt needs --dataset-path FILE")
    pairs = read_sharegpt(config.path)
    random.Random(f"sharegpt:{seed}").shuffle(pairs)
    out: list[StreamRequest] = []
    for prompt, answer in pairs:
        if len(out) >= count:
            break
        prompt_len = count_tokens(prompt)
        output_len = config.sharegpt_output_len or count_tokens(answer)
        if prompt_len < SHAREGPT_MIN_TOKENS or output_len < SHAREGPT_MIN_TOKENS:
            continue
        if max_model_len is not None and prompt_len + output_len > max_model_len:
            continue
        out.append(_request(prompt, output_len, timeout_s))
    if not out:
        raise UsageError(f"--dataset-path {config.path}: no entry fits (at least {SHAREGPT_MIN_TOKENS} tokens of prompt "
                         f"and answer{f', at most {max_model_len} together' if max_model_len else ''})")
    return [out[i % len(out)] for i in range(count)]


def dataset_requests(count: int, config: DatasetConfig, seed: int, timeout_s: float,
                     count_tokens: Callable[[str], int] | None = None, max_model_len: int | None = None) -> list[StreamRequest]:
    """The requests of one open-loop run, by the dataset's name."""
    if config.name == "random":
        return random_requests(count, config, seed, timeout_s)
    if config.name == "shared-prefix":
        return shared_prefix_requests(count, config, seed, timeout_s)
    if count_tokens is None:
        raise UsageError("--dataset sharegpt: needs a server to count the answers' tokens (/tokenize)")
    return sharegpt_requests(count, config, seed, timeout_s, count_tokens, max_model_len)


def describe(config: DatasetConfig) -> str:
    """The dataset in a few words, for a figure's label."""
    spread = f" +/-{config.range_ratio:.0%}" if config.range_ratio else ""
    if config.name == "random":
        return f"random prompts, {config.input_len}{spread} tokens in, {config.output_len}{spread} out"
    if config.name == "shared-prefix":
        return (f"{config.prefix_groups} groups sharing a {config.prefix_len}-token prefix, {config.input_len}{spread} "
                f"tokens of suffix, {config.output_len}{spread} out")
    out = f"{config.sharegpt_output_len} tokens out" if config.sharegpt_output_len else "answers' lengths out"
    return f"ShareGPT file {config.path.name if config.path else '?'}, {out}"
