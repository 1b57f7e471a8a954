"""Sending the probes' one request shape (cookbook.completions): alone, released together, staggered, or as a gate
that holds the engine in a long prefill while others queue; and the filler prompts the probes send."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...completions import Completion, completion_body, excerpt, new_salt, parse_completion
from ...endpoint import Endpoint
from ...errors import CookbookError, RequestFailed
from ...haystack import filler_text
from ...results import Evidence
from ..registry import CheckContext, CheckFailed

SECONDS_PER_TOKEN = 0.02  # on top of the check's request timeout: a loaded 2-vCPU machine prefills ~100 tokens/s


def timeout_for(ctx: CheckContext, tokens: int) -> float:
    return ctx.request_timeout_s + tokens * SECONDS_PER_TOKEN


def complete(endpoint: Endpoint, body: dict[str, Any], timeout_s: float, clock: float | None = None) -> Completion:
    """One non-streamed completion; an HTTP error answer fails the check with the request as evidence. Times are
    seconds since `clock` (time.monotonic()) when given."""
    origin = clock if clock is not None else time.monotonic()
    sent = time.monotonic() - origin
    try:
        data = endpoint.post("/v1/completions", body, timeout_s)
    except RequestFailed as exc:
        if exc.status_code is None:
            raise
        raise CheckFailed(
            f"HTTP {exc.status_code} from /v1/completions",
            [Evidence(request=excerpt(body), response={"status": exc.status_code, "body": exc.body[:300]},
                      note=f"HTTP {exc.status_code}: {exc.body[:200]}")],
        ) from None
    result = parse_completion(data)
    result.sent_s = round(sent, 4)
    result.done_s = round(time.monotonic() - origin, 4)
    return result


def solo(endpoint: Endpoint, prompt: list[int], max_tokens: int, timeout_s: float, tag: str = "solo") -> Completion:
    """The baseline: the request alone, cold (its own salt)."""
    return complete(endpoint, completion_body(endpoint.model, prompt, max_tokens, new_salt(tag)), timeout_s)


def in_parallel(calls: list[Callable[[], Completion]]) -> list[Completion]:
    """Run the calls on threads released together; the first error is raised after all have ended."""
    results: list[Completion | None] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls)) if calls else None

    def run(index: int) -> None:
        try:
            if start is not None:
                start.wait(timeout=30)
            results[index] = calls[index]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _after(delay_s: float, call: Callable[[], Completion]) -> Callable[[], Completion]:
    def delayed() -> Completion:
        time.sleep(delay_s)
        return call()

    return delayed


def staggered(calls: list[Callable[[], Completion]], gap_s: float) -> list[Completion]:
    """Like `in_parallel`, but started `gap_s` apart, so the server receives them in this order."""
    return in_parallel([_after(i * gap_s, call) for i, call in enumerate(calls)])


def sender(endpoint: Endpoint, body: dict[str, Any], timeout_s: float, clock: float | None = None) -> Callable[[], Completion]:
    """A call that sends `body` (for `in_parallel` and `staggered`)."""
    return lambda: complete(endpoint, body, timeout_s, clock)


class Gate:
    """A streamed cold request whose long prefill holds the engine while a burst queues behind it; records when it
    was sent and when its first token came (the end of its prefill step), both seconds from `clock`."""

    def __init__(self, endpoint: Endpoint, prompt: list[int], timeout_s: float, clock: float) -> None:
        self.body = completion_body(endpoint.model, prompt, 2, new_salt("gate"))
        self.endpoint, self.timeout_s, self.clock = endpoint, timeout_s, clock
        self.sent_s: float | None = None
        self.first_s: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.sent_s = time.monotonic() - self.clock
        try:
            first = self.endpoint.stream_first_event("/v1/completions", self.body, self.timeout_s)
        except CookbookError as exc:  # the gate only holds the engine; its own answer does not matter
            self.error = str(exc)
            return
        self.first_s = None if first is None else first - self.clock

    def start(self) -> "Gate":
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(timeout=self.timeout_s)


class PromptSource:
    """Token-id prompts from the project's generated filler, tokenized once by the server under test; prompt `name`
    of a seed is the same for the same server."""

    def __init__(self, endpoint: Endpoint, seed: int | str = 0) -> None:
        self.endpoint = endpoint
        self.seed = seed
        self._cache: dict[str, list[int]] = {}

    def tokens(self, name: str, count: int) -> list[int]:
        key = f"{self.seed}:{name}"
        ids = self._cache.get(key, [])
        sentences = max(16, count // 8)
        while len(ids) < count:
            ids = self.endpoint.tokenize(filler_text(f"engine-states:{key}", sentences))
            sentences *= 2
        self._cache[key] = ids
        return ids[:count]
