"""Faults of the long-context class for the fault proxy: each one must make the prefix-cache or needle probe fail.

They imitate what a broken prefix cache or long-context path does on a real server: a hit that resumes from the
wrong state (different text, shifted logprobs), a cache that reports what it did not do (cached tokens off the
block grid, cached tokens on a cold request, a `cache_salt` that isolates nothing), and an answer that loses the needle past some depth or length.
Pass an instance to `FaultProxy(url, fault)`; to name them, build a table of your own with
`fault_table(LONG_CONTEXT_FAULTS)`. They are not in `cookbook.faultproxy.FAULTS`, because the fault matrix of
tests/test_checks.py runs every fault there at the recipe's full lengths, which for these probes takes minutes on
the CPU server (their tests use short lengths).
"""
from __future__ import annotations

import re
import threading
from typing import Any, Callable

from collections.abc import Mapping
from types import MappingProxyType

from .faultproxy import Exchange, Fault, choices


def _usage_details(body: Any) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
        usage["prompt_tokens_details"] = details
    return details


def _is_hit(ex: Exchange, body: Any) -> bool:
    details = _usage_details(body)
    return ex.is_chat and ex.status == 200 and bool(details and details.get("cached_tokens"))


def _other_digits(text: str) -> str:
    """Every digit one higher (9 -> 0): a plausible answer that is not the needle."""
    return re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), text)


def _rewrite_answers(body: Any, rewrite: Callable[[str], str]) -> None:
    for choice in choices(body):
        message = choice.get("message") or {}
        if message.get("content"):
            message["content"] = rewrite(message["content"])


class HitDifferentText(Fault):
    """A cache hit resumes from the wrong state and answers something else, fluently (the tokens in its logprobs
    change with the text, as a real wrong-state hit's would)."""

    name = "hit-different-text"
    catches = ("prefix-cache",)
    symptom = r"the cold run"

    def response(self, ex: Exchange, body: Any) -> Any:
        if _is_hit(ex, body):
            _rewrite_answers(body, lambda text: _other_digits(text) + " Also, the weather is fine.")
            for choice in choices(body):
                for item in (choice.get("logprobs") or {}).get("content") or []:
                    item["token"] = _other_digits(str(item.get("token", "")))
        return body


class HitShiftedLogprobs(Fault):
    """A cache hit gives the same tokens with logprobs moved by `delta` (a small numerical drift, or a large one)."""

    name = "hit-shifted-logprobs"
    catches = ("prefix-cache",)
    symptom = r"logprobs"

    def __init__(self, delta: float = 0.5) -> None:
        self.delta = delta

    def response(self, ex: Exchange, body: Any) -> Any:
        if _is_hit(ex, body):
            for choice in choices(body):
                for item in (choice.get("logprobs") or {}).get("content") or []:
                    item["logprob"] = float(item["logprob"]) - self.delta
        return body


class CachedOffBlock(Fault):
    """A hit reports one token fewer than it cached: not a multiple of the block size."""

    name = "cached-off-block"
    catches = ("prefix-cache",)
    symptom = r"not a multiple"

    def response(self, ex: Exchange, body: Any) -> Any:
        if _is_hit(ex, body):
            details = _usage_details(body)
            assert details is not None
            details["cached_tokens"] = int(details["cached_tokens"]) - 1
        return body


class CachedOnCold(Fault):
    """The first request with a new cache_salt (a cold one) reports half its prompt as cached."""

    name = "cached-on-cold"
    catches = ("prefix-cache", "needles")
    symptom = r"cold"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._salts: set[str] = set()

    def response(self, ex: Exchange, body: Any) -> Any:
        salt = ex.params.get("cache_salt")
        if not ex.is_chat or ex.status != 200 or not salt:
            return body
        with self._lock:
            first = salt not in self._salts
            self._salts.add(salt)
        details = _usage_details(body)
        if first and details is not None:
            details["cached_tokens"] = int(body["usage"].get("prompt_tokens", 0)) // 2
        return body


class IgnoreCacheSalt(Fault):
    """The server ignores `cache_salt` (the proxy strips it from every request): requests that should be isolated
    share the cache, so a "cold" run may be a hit."""

    name = "ignore-cache-salt"
    catches = ("prefix-cache",)
    symptom = r"ignores cache_salt"

    def request(self, ex: Exchange) -> None:
        if ex.is_api and isinstance(ex.body, dict):
            ex.body.pop("cache_salt", None)
        return None


_NEEDLE = re.compile(r"The special magic number for .+? is:? (\d+)\.")


def needle_depth(content: str) -> float | None:
    """Where the needle sits in the request's document, as a fraction of its characters."""
    start, end = content.find("<document>"), content.rfind("</document>")
    match = _NEEDLE.search(content, max(start, 0))
    if start < 0 or end <= start or match is None:
        return None
    return (match.start() - start) / max(1, end - start)


class NeedleLostBeyond(Fault):
    """Answers lose the needle (another number comes back) when it sits deeper than `depth` or the prompt is at
    least `tokens` long: the shape of a long-context bug that only shows past some position."""

    name = "needle-lost-beyond"
    catches = ("needles",)
    symptom = r"expected \d+"

    def __init__(self, depth: float | None = 0.5, tokens: int | None = None) -> None:
        if depth is None and tokens is None:
            raise ValueError("give a depth, a length in tokens, or both")
        self.depth, self.tokens = depth, tokens

    def _loses(self, ex: Exchange, body: Any) -> bool:
        messages = ex.params.get("messages") or []
        content = str(messages[-1].get("content", "")) if messages else ""
        depth = needle_depth(content)
        if depth is None:
            return False
        prompt_tokens = int(((body.get("usage") or {}).get("prompt_tokens")) or 0)
        deep = self.depth is not None and depth > self.depth
        long = self.tokens is not None and prompt_tokens >= self.tokens
        return deep or long

    def response(self, ex: Exchange, body: Any) -> Any:
        if ex.is_chat and ex.status == 200 and isinstance(body, dict) and self._loses(ex, body):
            _rewrite_answers(body, _other_digits)
        return body


LONG_CONTEXT_FAULTS: Mapping[str, Fault] = MappingProxyType({
    f.name: f
    for f in (
        HitDifferentText(), HitShiftedLogprobs(), CachedOffBlock(), CachedOnCold(), IgnoreCacheSalt(),
        NeedleLostBeyond(),
    )
})
