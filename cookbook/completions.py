"""The one request shape every probe and the reference use: greedy `/v1/completions` on token ids, read token by token.

Token-id prompts keep lengths and shared prefixes exact, and `return_tokens_as_token_ids` names every generated and
top-k token as `token_id:N`, so a run, its baseline and the reference speak of the same ids. This module builds
that request, reads its answer into a `Completion` (a `Trace` of generated ids, chosen logprobs and top-k, plus
usage and prompt logprobs), and holds the one parser of `token_id:N`.
"""
from __future__ import annotations

import math
import uuid
from typing import Any

from pydantic import BaseModel, Field

from .errors import ServerError

TOP_K = 5


def token_id(text: str) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) as 123; anything else is a server that ignored the flag."""
    found = maybe_token_id(text)
    if found is None:
        raise ServerError(f"/v1/completions: expected 'token_id:N' tokens (return_tokens_as_token_ids), got {text!r}")
    return found


def maybe_token_id(text: str | None) -> int | None:
    """The id in a `token_id:N` token, else None (a server or a fault that named the token by its text)."""
    head, _, number = str(text or "").partition(":")
    if head != "token_id" or not number.lstrip("-").isdigit():
        return None
    return int(number)


def _key(key: str) -> int:
    """A top-k or prompt_logprobs key: `token_id:N`, or a bare id (prompt_logprobs are keyed by id)."""
    return token_id(key) if str(key).startswith("token_id:") else int(key)


def new_salt(tag: str = "probe") -> str:
    """A `cache_salt` nobody has used: its request starts cold."""
    return f"cookbook-{tag}-{uuid.uuid4().hex}"


class Trace(BaseModel):
    """A greedy answer token by token: what a departure is found and judged on."""

    token_ids: list[int] = Field(default_factory=list, description="Generated token ids")
    logprobs: list[float] = Field(default_factory=list, description="The chosen token's logprob at each step")
    top: list[dict[int, float]] = Field(default_factory=list, description="Top-k token id -> logprob at each step")

    def at(self, index: int) -> tuple[int | None, float | None, dict[int, float]]:
        """(token, its logprob, top-k) at a step; None where the answer had ended."""
        token = self.token_ids[index] if index < len(self.token_ids) else None
        logprob = self.logprobs[index] if index < len(self.logprobs) else None
        return token, logprob, self.top[index] if index < len(self.top) else {}


class Completion(Trace):
    """One greedy /v1/completions answer: the trace plus what the probes read beside it."""

    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = Field(
        None, description="Per prompt position: its own token and the top-k (first None), when asked for"
    )
    prompt_ranks: list[dict[int, int]] | None = Field(
        None, description="Per prompt position: the rank vLLM gives each listed token (1 = its argmax)"
    )
    sent_s: float = Field(0.0, description="When it was sent, seconds from the probe's clock start")
    done_s: float = Field(0.0, description="When the whole answer was back, same clock")


def completion_body(
    model: str,
    prompt_ids: list[int],
    max_tokens: int,
    salt: str | None = None,
    top_k: int = TOP_K,
    prompt_logprobs: int | None = None,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Greedy, `logprobs: top_k`, ids in and out; a fresh salt (a cold run) unless one is given."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max(1, max_tokens),
        "temperature": 0,
        "logprobs": top_k,
        "cache_salt": salt or new_salt(),
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "ignore_eos": ignore_eos,
    }
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return body


def parse_completion(data: dict[str, Any]) -> Completion:
    """A /v1/completions response (first choice) as a Completion; a token not named by id is a ServerError."""
    choice = (data.get("choices") or [{}])[0]
    lp = choice.get("logprobs") or {}
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    raw_prompt = choice.get("prompt_logprobs", data.get("prompt_logprobs"))
    prompt: list[dict[int, float] | None] | None = None
    ranks: list[dict[int, int]] | None = None
    if raw_prompt is not None:
        prompt, ranks = [], []
        for entry in raw_prompt:
            if entry is None:
                prompt.append(None)
                ranks.append({})
                continue
            prompt.append({_key(k): float(v["logprob"] if isinstance(v, dict) else v) for k, v in entry.items()})
            ranks.append({_key(k): int(v["rank"]) for k, v in entry.items() if isinstance(v, dict) and v.get("rank")})
    return Completion(
        token_ids=[token_id(t) for t in lp.get("tokens") or []],
        logprobs=[float(x) if x is not None else -math.inf for x in lp.get("token_logprobs") or []],
        top=[{token_id(k): float(v) for k, v in (step or {}).items()} for step in lp.get("top_logprobs") or []],
        text=choice.get("text") or "",
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        finish_reason=choice.get("finish_reason"),
        prompt_logprobs=prompt,
        prompt_ranks=ranks,
    )


def excerpt(body: dict[str, Any]) -> dict[str, Any]:
    """A request as evidence: a token-id prompt shown as its length and ends."""
    shown = dict(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 16:
        shown["prompt"] = f"[{len(prompt)} token ids: {prompt[:6]} ... {prompt[-6:]}]"
    return shown
