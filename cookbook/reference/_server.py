"""Another server as the reference, and the one served request the oracle reads: greedy /v1/completions on raw
token ids with prompt_logprobs, read into token ids and top-k dicts."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..endpoint import Endpoint
from ..errors import ServerError
from ..completions import completion_body, parse_completion
from ._types import RefPosition, RefScore, _now


class ServerReference:
    """A trusted server (another image, another machine) scoring the same token ids through vLLM's
    /v1/completions: prompt_logprobs for the prompt, greedy with logprobs for the continuation."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 600.0, what: str | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.what = what

    @property
    def source(self) -> str:
        extra = f" ({self.what})" if self.what else ""
        return f"another server: {self.endpoint.base_url} serving {self.endpoint.model}{extra}, queried {_now()}"

    def can_score(self, prompt_ids: list[int]) -> bool:
        return bool(prompt_ids)

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        served = complete_with_logprobs(self.endpoint, prompt_ids, max_new_tokens, top_k, self.timeout_s)
        prompt: list[RefPosition | None] = [None]  # only the first position has no logprob (ignore below)
        prompt += [
            RefPosition(tok, lp, top)  # type: ignore[arg-type]
            for tok, lp, top in zip(prompt_ids[1:], served.prompt_logprobs[1:], served.prompt_top[1:])
        ]
        greedy = [RefPosition(t, lp, top) for t, lp, top in zip(served.tokens, served.logprobs, served.top)]
        return RefScore(self.source, prompt, greedy)


# -- one served request with every logprob the oracle compares -------------------------------------------------------


@dataclass
class Served:
    """A greedy /v1/completions answer with prompt_logprobs, read into token ids and top-k dicts."""

    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]]
    prompt_logprobs: list[float | None]  # the prompt token's logprob at each position (first None)
    prompt_top: list[dict[int, float]]  # top-k at each prompt position ({} at the first)
    prompt_rank1: list[int | None]  # the served argmax at each prompt position
    seconds: float
    body: dict[str, Any]


def completions_body(endpoint: Endpoint, prompt_ids: list[int], max_new_tokens: int, top_k: int) -> dict[str, Any]:
    """The one request shape (cookbook.completions) with prompt_logprobs: raw token ids in, so that served and
    reference see identical ids (no chat template in between); a fresh cache_salt, so every prompt is computed cold
    (a hit's numerics are the prefix-cache probe's business)."""
    return completion_body(endpoint.model, prompt_ids, max_new_tokens, top_k=top_k, prompt_logprobs=top_k)


def complete_with_logprobs(
    endpoint: Endpoint, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5, timeout_s: float = 120.0
) -> Served:
    body = completions_body(endpoint, prompt_ids, max_new_tokens, top_k)
    started = time.monotonic()
    data = endpoint.post("/v1/completions", body, timeout_s, where="/v1/completions")
    seconds = time.monotonic() - started
    answer = parse_completion(data)
    entries = answer.prompt_logprobs or []
    ranks = answer.prompt_ranks or []
    if len(entries) != len(prompt_ids):
        raise ServerError(
            f"/v1/completions: prompt_logprobs has {len(entries)} entries for a {len(prompt_ids)}-token prompt"
        )
    prompt_lp: list[float | None] = []
    prompt_top: list[dict[int, float]] = []
    rank1: list[int | None] = []
    for i, entry in enumerate(entries):
        if entry is None:
            prompt_lp.append(None)
            prompt_top.append({})
            rank1.append(None)
            continue
        rank = ranks[i] if i < len(ranks) else {}
        prompt_lp.append(entry.get(prompt_ids[i]))
        prompt_top.append({t: lp for t, lp in entry.items() if t in rank and rank[t] <= top_k})
        first = [t for t, r in rank.items() if r == 1]
        rank1.append(first[0] if first else None)
    return Served(answer.token_ids, answer.logprobs, answer.top, prompt_lp, prompt_top, rank1, round(seconds, 3), body)
