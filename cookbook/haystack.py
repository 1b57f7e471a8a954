"""Token-exact haystacks with a needle, and the one greedy request both long-context probes send.

The filler is prose the project generates itself from a seeded grammar (no data set download) and holds no digits,
so a needle's number cannot be found anywhere else in the prompt. Lengths are counted by the server under test:
the whole chat prompt (template included) is measured with vLLM's ``/tokenize`` and trimmed until it is exactly
the target, so "65K" means 65K of that model's tokens. Each needle's key and value come from a seeded RNG per cell.
"""
from __future__ import annotations

import random
import re
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .completions import maybe_token_id
from .endpoint import Endpoint
from .errors import CookbookError, ServerDown

# Seconds a long request may take on top of the check's base timeout, per prompt token (about 100 tokens/s: slow
# enough for the 2-vCPU CPU server and for a Gaudi card compiling a new shape, still bounded).
SECONDS_PER_PROMPT_TOKEN = 0.01
_MAX_FIT_ROUNDS = 8
# Alternatives returned per generated token: at the first token where a hit parts from its cold run, both runs'
# top-k tell a flip on a near-tie from a wrong-state hit.
TOP_K = 5

# -- filler: deterministic prose with no digits -------------------------------------------------------------------

_SUBJECTS = (
    "The old lighthouse keeper", "A young gardener", "The village baker", "Our neighbour", "The tired traveller",
    "A quiet student", "The ferry captain", "The librarian", "A curious child", "The shepherd",
    "The carpenter", "A wandering painter", "The station master", "The orchard owner", "A retired sailor",
    "The schoolteacher", "The miller", "A patient fisherman", "The clockmaker", "The innkeeper",
)
_VERBS = (
    "walked along", "painted", "watched", "repaired", "wrote about", "remembered", "crossed", "cleaned",
    "described", "photographed", "visited", "measured", "sketched", "followed", "admired", "swept",
)
_OBJECTS = (
    "the narrow harbour", "the wooden bridge", "the stone wall by the church", "the empty market square",
    "the orchard on the hill", "the road to the next town", "the frozen pond", "the garden behind the school",
    "the tall grass near the river", "the old mill", "the lanterns on the pier", "the fields of barley",
    "the path through the forest", "the boats in the bay", "the roof of the town hall", "the cliffs above the sea",
)
_TAILS = (
    "before the rain began", "while the bells were ringing", "on a grey and windy morning", "after supper",
    "as the tide went out", "without saying a word", "in the pale evening light", "long before anyone woke",
    "when the snow had melted", "with great care", "as the swallows returned", "during the long summer",
    "under a cloudless sky", "while the kettle boiled", "as the market closed", "in the first week of autumn",
)
_ASIDES = (
    "Nobody in the town thought this was unusual.", "It had been that way for as long as anyone could remember.",
    "The weather was calm and the streets were quiet.", "Later that day the wind changed direction.",
    "Few people noticed, and fewer still cared.", "It was the kind of day that passes without a story.",
)
_KEYS = (
    "the blue door", "the silver lighthouse", "the northern orchard", "the red ferry", "the stone bridge",
    "the copper kettle", "the hidden garden", "the winter market", "the painted boat", "the old clock tower",
    "the green lantern", "the quiet library", "the eastern gate", "the yellow kite", "the marble fountain",
)



def filler_sentences(seed: int | str, count: int) -> list[str]:
    """`count` sentences of neutral prose, the same for the same seed; no digits anywhere."""
    rng = random.Random(f"filler:{seed}")
    sentences: list[str] = []
    for _ in range(count):
        if rng.random() < 0.15:
            sentences.append(rng.choice(_ASIDES))
        else:
            sentences.append(
                f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
            )
    return sentences


def filler_text(seed: int | str, count: int) -> str:
    """Sentences joined by single spaces: cut anywhere, the text never ends in whitespace that the prompt would
    lose, so each filler token adds one prompt token and the fitting below converges."""
    return " ".join(filler_sentences(seed, count))


# -- needles -------------------------------------------------------------------------------------------------------


class Needle(BaseModel):
    """A fact hidden in the haystack and the question that asks for it."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="What the number belongs to, e.g. 'the blue door'")
    value: str = Field(description="The number (seven digits by default) the answer must contain exactly")

    @property
    def sentence(self) -> str:
        return f"The special magic number for {self.key} is: {self.value}."

    @property
    def instruction(self) -> str:
        """Said before the document. Naming the key up front (and the colon in the sentence) gave SmolLM2-135M
        5/6 instead of 2/6 at 7.6K tokens, depth 0.1; the scoring is the same."""
        return (
            f"Below is a long document. Somewhere in it is the special magic number for {self.key}. "
            "Read the document, then answer the question after it."
        )

    @property
    def question(self) -> str:
        return f"What is the special magic number for {self.key}? Answer with the number only."

    def found_in(self, answer: str | None) -> bool:
        """Exact match: the whole number appears in the answer, not as part of a longer run of digits."""
        if not answer:
            return False
        return re.search(rf"(?<!\d){re.escape(self.value)}(?!\d)", answer) is not None


DEFAULT_DIGITS = 7
MIN_DIGITS = 4  # 9,000 values: a model that lost the needle guesses it about once in 9,000 cells


def make_needle(seed: int | str, digits: int = DEFAULT_DIGITS) -> Needle:
    """A needle the model cannot guess: a random key and a random value of `digits` digits (no leading zero),
    fixed by `seed`. Seven digits by default; a small model copies a shorter number more reliably from far back,
    and a lost or altered needle still fails (exact match)."""
    if digits < MIN_DIGITS:
        raise ValueError(f"a needle needs at least {MIN_DIGITS} digits, got {digits}")
    rng = random.Random(f"needle:{seed}")
    key = rng.choice(_KEYS)
    value = rng.randint(10 ** (digits - 1), 10**digits - 1)
    return Needle(key=key, value=str(value))


def longest_frame_needle() -> Needle:
    """The needle with the longest key and value: its frame bounds the shortest prompt any cell can have."""
    return Needle(key=max(_KEYS, key=len), value="9" * 7)


# -- token-exact haystacks -----------------------------------------------------------------------------------------


class Haystack(BaseModel):
    """One chat prompt of exactly `prompt_tokens` tokens (as the server counts them) with a needle at a depth."""

    target_tokens: int = Field(description="The length asked for, in this model's tokens")
    prompt_tokens: int = Field(description="The length /tokenize measured for the whole chat prompt")
    depth: float = Field(description="Requested needle depth, a fraction of the filler")
    actual_depth: float = Field(description="Where the needle landed: filler tokens before it / all filler tokens")
    filler_tokens: int = Field(description="Filler tokens around the needle")
    filler_after: int = Field(0, description="Filler tokens between the needle and the question")
    needle: Needle
    messages: list[dict[str, str]] = Field(repr=False, description="The chat messages to send")


def _messages(document: str, needle: Needle) -> list[dict[str, str]]:
    content = f"{needle.instruction}\n\n<document>\n{document}\n</document>\n\n{needle.question}"
    return [{"role": "user", "content": content}]


def _tokenize(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's /tokenize with a body Endpoint.tokenize does not send (chat messages), or for its max_model_len."""
    return endpoint.post("/tokenize", {"model": endpoint.model, **body})


def chat_prompt_tokens(endpoint: Endpoint, messages: list[dict[str, str]]) -> int:
    """Tokens of the chat prompt as the server will count them (template and generation prompt included)."""
    return int(_tokenize(endpoint, {"messages": messages, "add_generation_prompt": True})["count"])


def frame_tokens(endpoint: Endpoint, needle: Needle) -> int:
    """Tokens of the prompt with the needle and no filler: the shortest haystack this server can be given."""
    return chat_prompt_tokens(endpoint, _messages(needle.sentence, needle))


def build_haystack(endpoint: Endpoint, target_tokens: int, depth: float, needle: Needle, seed: int | str) -> Haystack:
    """A prompt of exactly `target_tokens` tokens: filler cut at token boundaries, the needle after a sentence."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth {depth} is outside 0..1")
    frame = frame_tokens(endpoint, needle)
    budget = target_tokens - frame
    if budget < 0:
        raise CookbookError(f"a {target_tokens}-token haystack is shorter than its own prompt frame ({frame} tokens)")
    sentences = max(8, budget // 8)  # a sentence is 10 to 20 tokens in the usual tokenizers
    filler = endpoint.tokenize(filler_text(seed, sentences))
    while len(filler) < budget + 64:  # room for the trimming rounds below
        sentences *= 2
        filler = endpoint.tokenize(filler_text(seed, sentences))
    full_stop = endpoint.tokenize(".")
    before = _sentence_boundary(filler, round(depth * budget), budget, full_stop[-1] if full_stop else None)
    after = budget - before
    prefix = endpoint.detokenize(filler[:before]) if before else ""
    tried: set[int] = set()
    for _ in range(_MAX_FIT_ROUNDS):
        while after in tried:  # a cut whose tokens merge with the next: step past it
            after += 1
        tried.add(after)
        suffix = endpoint.detokenize(filler[before : before + after]) if after > 0 else ""
        document = " ".join(part.strip() for part in (prefix, needle.sentence, suffix) if part.strip())
        messages = _messages(document, needle)
        counted = chat_prompt_tokens(endpoint, messages)
        if counted == target_tokens:
            return Haystack(
                target_tokens=target_tokens,
                prompt_tokens=counted,
                depth=depth,
                actual_depth=before / max(1, before + after),
                filler_tokens=before + after,
                filler_after=after,
                needle=needle,
                messages=messages,
            )
        after += target_tokens - counted
        if after < 0 or before + after > len(filler):
            break
    raise CookbookError(f"could not fit a haystack to exactly {target_tokens} tokens (last try: {counted})")


def _sentence_boundary(tokens: list[int], position: int, budget: int, full_stop: int | None) -> int:
    """The sentence end nearest to `position` within `budget` (so the needle never splits a sentence), moving it
    by at most a twentieth of the budget; `position` itself when there is none that close."""
    position = min(max(0, position), budget)
    window = min(200, budget // 20)
    if full_stop is None or position == 0 or window == 0:
        return position
    best: int | None = None
    for index in range(max(1, position - window), min(budget, len(tokens), position + window) + 1):
        if tokens[index - 1] == full_stop and (best is None or abs(index - position) < abs(best - position)):
            best = index
    return position if best is None else best


# -- the request both probes send ----------------------------------------------------------------------------------


class Answer(BaseModel):
    """One greedy chat answer with what the probes compare: text, token logprobs, cached tokens, time."""

    text: str = Field(description="message.content ('' when absent)")
    reasoning: str = Field("", description="reasoning_content, for servers with a reasoning parser")
    tokens: list[str] = Field(default_factory=list, description="Generated tokens, from logprobs.content")
    logprobs: list[float] = Field(default_factory=list, description="The chosen token's logprob, token by token")
    top: list[list[tuple[str, float]]] = Field(
        default_factory=list, description="Per generated token, its top_logprobs as (token, logprob), best first"
    )
    prompt_tokens: int | None = Field(None, description="usage.prompt_tokens")
    cached_tokens: int | None = Field(None, description="usage.prompt_tokens_details.cached_tokens; None if absent")
    finish_reason: str | None = None
    seconds: float = Field(description="Wall time of the request, end to end (time to the whole answer)")
    usage: dict[str, Any] = Field(default_factory=dict, description="The response's usage block, as sent")

    @property
    def token_ids(self) -> list[int | None]:
        """The generated tokens' ids when asked with `token_ids=True` ('token_id:N'); None for a token named by text."""
        return [maybe_token_id(token) for token in self.tokens]


def new_salt() -> str:
    """A cache_salt nobody has used: its request starts cold."""
    return f"cookbook-{uuid.uuid4().hex}"


def request_body(
    endpoint: Endpoint,
    messages: list[dict[str, str]],
    salt: str,
    max_tokens: int,
    logprobs: bool = True,
    token_ids: bool = False,
) -> dict[str, Any]:
    """The probes' greedy request; `token_ids`: logprobs name tokens as 'token_id:N' (a reference scores ids)."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_salt": salt,
    }
    if logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = TOP_K
        if token_ids:
            body["return_tokens_as_token_ids"] = True
    return body


def chat_prompt_ids(endpoint: Endpoint, messages: list[dict[str, str]]) -> list[int]:
    """The chat prompt's token ids as the server will see them (template and generation prompt included)."""
    return [int(t) for t in _tokenize(endpoint, {"messages": messages, "add_generation_prompt": True})["tokens"]]


# A long request's deadline allows this many times the server's measured prefill pace (when it is known).
PACE_HEADROOM = 4.0


def request_timeout(base_s: float, prompt_tokens: int, pace_s_per_token: float | None = None) -> float:
    """The base timeout plus each prompt token's share: SECONDS_PER_PROMPT_TOKEN, or PACE_HEADROOM times the server's
    measured prefill pace when that is slower (a host without native bf16, a loaded machine): never a fixed bar a
    slow but working server cannot meet."""
    per_token = SECONDS_PER_PROMPT_TOKEN
    if pace_s_per_token is not None:
        per_token = max(per_token, PACE_HEADROOM * pace_s_per_token)
    return base_s + prompt_tokens * per_token


def prime_prefill_pace(endpoint: Endpoint, sentences: int = 60, timeout_s: float = 600.0) -> int:
    """One cold prompt of filler (a fresh salt first, so nothing of it is cached) with one output token, so that a
    fresh server's /metrics hold a prefill pace (endpoint.prefill_pace_from_metrics) before its first long request.
    Returns the prompt tokens it prefilled."""
    prompt = f"{new_salt()} {filler_text(new_salt(), sentences)}"
    answer = endpoint.post("/v1/completions", {"model": endpoint.model, "prompt": prompt, "max_tokens": 1,
                                               "temperature": 0.0}, timeout_s=timeout_s)
    return int((answer.get("usage") or {}).get("prompt_tokens") or 0)


def ask(endpoint: Endpoint, body: dict[str, Any], timeout_s: float) -> Answer:
    """Send one non-streamed chat request and read what the probes need from its response."""
    reply = endpoint.chat(body, timeout_s, where="/v1/chat/completions")
    seconds = reply.seconds
    data = reply.body
    choice = data["choices"][0]
    message = choice.get("message") or {}
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    content = (choice.get("logprobs") or {}).get("content") or []
    return Answer(
        text=message.get("content") or "",
        reasoning=message.get("reasoning_content") or message.get("reasoning") or "",
        tokens=[str(item.get("token", "")) for item in content],
        logprobs=[float(item["logprob"]) for item in content],
        top=[_top(item) for item in content],
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        finish_reason=choice.get("finish_reason"),
        seconds=round(seconds, 3),
        usage=usage,
    )


def _top(item: dict[str, Any]) -> list[tuple[str, float]]:
    pairs = [(str(t.get("token", "")), float(t["logprob"])) for t in item.get("top_logprobs") or [] if "logprob" in t]
    return sorted(pairs, key=lambda pair: -pair[1])


def body_excerpt(body: dict[str, Any], keep: int = 160) -> dict[str, Any]:
    """The request as evidence: every field, but a long message shown as its start, its end and its length."""
    shown = dict(body)
    messages = []
    for message in body.get("messages", []):
        text = message.get("content", "")
        if len(text) > 2 * keep:
            text = f"{text[:keep]} [... {len(text) - 2 * keep} characters ...] {text[-keep:]}"
        messages.append({**message, "content": text})
    shown["messages"] = messages
    return shown


# -- lengths -------------------------------------------------------------------------------------------------------


def fit_lengths(lengths: list[int], max_model_len: int, answer_tokens: int) -> list[int]:
    """Lengths capped so that prompt and answer fit the context, duplicates dropped, order kept."""
    limit = max_model_len - answer_tokens
    fitted: list[int] = []
    for length in lengths:
        capped = min(int(length), limit)
        if capped not in fitted:
            fitted.append(capped)
    return fitted


def server_max_model_len(endpoint: Endpoint) -> int:
    """The context the server was started with, as /tokenize reports it."""
    return int(_tokenize(endpoint, {"prompt": "", "add_special_tokens": False})["max_model_len"])


class ServedModel(BaseModel):
    """What the server under test says about the model it serves, for probes that must not assume one layout:
    the context (/tokenize), the prefix cache's labels (/metrics `vllm:cache_config_info`) and, where the served
    checkpoint is a folder this machine can read (/v1/models `root`), its config.json."""

    max_model_len: int = Field(description="The context the server was started with")
    cache_config: dict[str, str] = Field(default_factory=dict, description="vllm:cache_config_info labels")
    sliding_windows: list[int] = Field(default_factory=list, description="Distinct attention windows, in tokens")
    server_window: int | None = Field(None, description="The window the server reports (cache_config_info)")
    config_windows: list[int] = Field(default_factory=list, description="The windows config.json declares")
    max_positions: int | None = Field(
        None, description="Positions the model was made for: config.json max_position_embeddings (x a RoPE factor)"
    )
    layer_types: list[str] = Field(default_factory=list, description="config.json layer_types, when it has them")
    dtype: str | None = Field(None, description="config.json dtype (torch_dtype)")
    config_source: str | None = Field(None, description="Where the config came from; None when unreadable here")

    @property
    def block_size(self) -> int | None:
        value = self.cache_config.get("block_size", "")
        return int(value) if value.isdigit() else None

    def contradictions(self) -> list[str]:
        """Where the server runs the model otherwise than its config.json says (a window or a context imposed at
        launch, e.g. by --hf-overrides or --max-model-len): legal settings that break long prompts."""
        said: list[str] = []
        if self.config_source is None:
            return said
        if self.server_window is not None and self.server_window not in self.config_windows:
            declared = ", ".join(str(w) for w in self.config_windows) or "none"
            said.append(
                f"the server applies a {self.server_window:,}-token sliding window; the served model's config.json "
                f"declares {declared}"
            )
        if self.max_positions and self.max_model_len > self.max_positions:
            said.append(
                f"the served context {self.max_model_len:,} is longer than the {self.max_positions:,} positions the "
                "model was made for (config.json max_position_embeddings)"
            )
        return said

    def beyond(self, tokens_back: int) -> str | None:
        """Why a fact this many tokens before the question may be out of reach, if a window explains it."""
        reach = [w for w in self.sliding_windows if w < tokens_back]
        if not reach or (self.layer_types and "full_attention" in self.layer_types and self.server_window is None):
            return None  # some layers see everything: a window alone does not explain a loss
        return f"beyond the served {max(reach):,}-token sliding window"


def sliding_windows(config: dict[str, Any] | None) -> tuple[int, ...]:
    """Every sliding-window size the config declares: `sliding_window` when some layer slides (`layer_types` with
    'sliding_attention', `use_sliding_window`, or no layer_types at all), Mistral-style `sliding_window` lists,
    and the same under `text_config` for multimodal configs."""
    if not config:
        return ()
    windows: set[int] = set()
    for cfg in (config, config.get("text_config") or {}):
        value = cfg.get("sliding_window")
        if value is None or cfg.get("use_sliding_window") is False:
            continue
        layer_types = cfg.get("layer_types")
        if layer_types and not any("sliding" in str(t) for t in layer_types):
            continue
        values = value if isinstance(value, list) else [value]
        windows.update(int(v) for v in values if isinstance(v, (int, float)) and v)
    return tuple(sorted(windows))


def _windows_from_config(config: dict[str, Any]) -> tuple[list[int], list[str]]:
    """The config's sliding windows (`sliding_windows`: `sliding_window` where some layer slides, Mistral-style,
    Qwen2's `use_sliding_window`, `text_config`) and its `layer_types`."""
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    return list(sliding_windows(config)), [str(t) for t in text.get("layer_types") or []]


def _max_positions(config: dict[str, Any]) -> int | None:
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    positions = text.get("max_position_embeddings")
    if not isinstance(positions, int) or positions <= 0:
        return None
    factor = 1.0
    for scaling in (text.get("rope_scaling"), text.get("rope_parameters")):
        entries = [scaling] if isinstance(scaling, dict) else []
        entries += [v for v in (scaling or {}).values() if isinstance(v, dict)] if isinstance(scaling, dict) else []
        for entry in entries:
            value = entry.get("factor")
            if isinstance(value, (int, float)) and value > factor:
                factor = float(value)
    return int(positions * factor)


def served_model(endpoint: Endpoint, metrics: list[Any] | None = None) -> ServedModel:
    """The served model's layout facts, from the server itself (and its config.json when it is readable here)."""
    import json
    from pathlib import Path

    context = server_max_model_len(endpoint)
    try:
        metrics = endpoint.metrics() if metrics is None else metrics
    except ServerDown:
        raise
    except CookbookError:  # no /metrics behind some proxies: the labels are simply unknown
        metrics = []
    cache = next((m.labels for m in metrics if m.name.startswith("vllm:cache_config_info")), {})
    facts = ServedModel(max_model_len=context, cache_config=dict(cache))
    label_window = cache.get("sliding_window", "")
    if label_window.isdigit():
        facts.server_window = int(label_window)
        facts.sliding_windows = [int(label_window)]
    try:
        models = endpoint.models()
    except CookbookError:  # no /v1/models behind some proxies
        models = []
    root = next((m.get("root") for m in models if m.get("id") == endpoint.model), None)
    config_path = Path(str(root)) / "config.json" if root else None
    if config_path is not None and config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            windows, facts.layer_types = _windows_from_config(config)
            facts.config_windows = windows
            facts.sliding_windows = sorted(set(facts.sliding_windows) | set(windows))
            facts.max_positions = _max_positions(config)
            dtype = config.get("dtype") or config.get("torch_dtype")
            facts.dtype = str(dtype) if dtype else None
            facts.config_source = str(config_path)
    return facts


def format_tokens(count: int) -> str:
    """The seeds' way of writing a length: 65K, 126K, 1.5K; below a thousand, the number itself."""
    if count < 1000:
        return str(count)
    if count % 1000 == 0 or count >= 10_000:
        return f"{round(count / 1000)}K"
    return f"{count / 1000:.1f}".rstrip("0").rstrip(".") + "K"


def join_words(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


def seed_param(params: dict[str, Any]) -> int | str:
    """The probes' seed from check parameters; a notebook may pass None for 'the default', which is 0."""
    seed = params.get("seed")
    return 0 if seed is None else seed
