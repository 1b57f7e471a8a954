"""The benchmark's client: streamed chat requests, timed the way `vllm bench serve` times them, in concurrent batches.

Every request streams through the `openai` async client with `stream_options.include_usage`, and every output length
is fixed with `ignore_eos` and `max_tokens`, so two runs generate the same tokens. Times are taken the way
`vllm bench serve` takes them: TTFT at the first token chunk, inter-token latency between token chunks, end to end
at the last token chunk, TPOT = (end to end - TTFT) / (tokens - 1) (benchmarks/parity_vllm_bench.py holds the two
side by side). The client stays light so that it never competes with the server it measures (on the CPU recipe they
share two cores): the stream is read as raw server-sent events rather than parsed into SDK objects, and the openai
client runs over aiohttp (openai's `DefaultAioHttpClient`: a C HTTP parser, connections kept alive as `vllm bench
serve` keeps them, TLS) instead of the generic stack (httpcore's pure-Python h11 parser on anyio, about 2.5 times the
CPU per token; benchmarks/client_overhead.py measures it). Each request is bounded by a timeout; a failed request is
counted and shown beside the figure, never dropped silently from a mean, and what failed is worded by the one
mapping every caller shares (`cookbook.endpoint.request_failure`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import gc
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

import httpx2  # the openai client's HTTP library

from ..endpoint import Endpoint, metric_value, request_failure
from ..errors import CookbookError, ServerDown, ServerError
from .stats import Outliers, Summary, _round, outliers, summarize

T = TypeVar("T")
# The running request's timing state: a request hook of the HTTP client stamps the moment the request is handed to
# the transport (which then connects or takes a kept-alive connection, and sends), so that the openai client's own
# request building (about 1 ms, 20 ms for a process's first request) is not counted as the server's TTFT; vllm
# bench's clock likewise starts as its HTTP session is handed the request.
_TIMING: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("cookbook_bench_timing", default=None)


class _FirstWave:
    """Holds the first `size` requests of a batch at the request hook until all of them are built, then lets them go
    together: "N streams at once" means at once, however long the openai client takes to build each request."""

    def __init__(self, size: int) -> None:
        self.size, self.arrived, self.released = size, 0, asyncio.Event()

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.size:
            self.released.set()

    async def wait(self) -> None:
        if not self.released.is_set():
            self.arrive()
            await self.released.wait()


_WAVE: contextvars.ContextVar[_FirstWave | None] = contextvars.ContextVar("cookbook_bench_wave", default=None)


@dataclass(frozen=True)
class StreamRequest:
    """One chat request of a workload: fixed output length, optional fresh cache salt, its own time bound."""

    messages: list[dict[str, str]]
    max_tokens: int
    timeout_s: float
    cache_salt: str | None = None


@dataclass
class StreamResult:
    """What one streamed request measured; times in seconds from the moment the request was sent."""

    ok: bool = False
    error: str = ""
    prompt_tokens: int | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    usage_missing: bool = False
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunks: int = 0  # events that carried tokens: vLLM merges a stream's deltas into one event when its reader lags
    text: str = ""
    finish_reason: str | None = None
    sent_at: float | None = None  # perf_counter() when the request went to the transport (an open loop's timeline)

    @property
    def tokens_per_s(self) -> float | None:
        """End to end, TTFT included: the seeds' per-stream figure."""
        return self.output_tokens / self.e2e_s if self.ok and self.e2e_s else None

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class _SSE:
    """Server-sent events from raw bytes: the data payloads of complete events."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines))
        return payloads


def _take_event(result: StreamResult, payload: bytes, at: float, state: dict[str, float]) -> bool:
    """Fold one event into the result; False at [DONE]. A token chunk carries text, a tool call or the finish."""
    if payload == b"[DONE]":
        state["done"] = 1
        return False
    event = json.loads(payload)
    if event.get("error"):
        error = event["error"]
        result.error = str(error.get("message", error) if isinstance(error, dict) else error)[:300]
        return False
    choices = event.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        if text or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls") or choice.get("finish_reason"):
            if result.ttft_s is None:
                result.ttft_s = at - state["sent"]
            else:
                result.itl_s.append(at - state["last"])
            state["last"] = at
            state["chunks"] += 1
            result.text += text
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    usage = event.get("usage")
    if usage:
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.prompt_tokens = usage.get("prompt_tokens")
        result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        state["usage"] = 1
    return True


# After [DONE], how long the body's last chunk may take to arrive. A body left unread cannot go back to the
# connection pool: the next request would open a new connection, which `vllm bench serve` never does.
DRAIN_S = 1.0


async def _drain(chunks: Any) -> None:
    """Read what is left of a response body (the terminating chunk after [DONE]), for at most DRAIN_S."""

    async def rest() -> None:
        async for _ in chunks:
            pass

    try:
        await asyncio.wait_for(rest(), DRAIN_S)
    except (asyncio.TimeoutError, httpx2.TransportError):
        pass  # a server that keeps the body open after [DONE] costs this request its connection, nothing more


async def _stream_one(client: Any, model: str, request: StreamRequest, temperature: float) -> StreamResult:
    # The openai client raises APIStatusError on an HTTP error before the first byte of the stream is read.
    extra: dict[str, Any] = {"ignore_eos": True}
    if request.cache_salt:
        extra["cache_salt"] = request.cache_salt
    result = StreamResult()
    sent = time.perf_counter()
    state = {"sent": sent, "last": sent, "chunks": 0, "usage": 0}

    async def read() -> None:
        _TIMING.set(state)
        async with client.chat.completions.with_streaming_response.create(
            model=model,
            messages=request.messages,
            max_tokens=request.max_tokens,
            temperature=temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        ) as response:
            parser = _SSE()
            chunked = "chunked" in response.http_response.headers.get("transfer-encoding", "").lower()
            chunks = response.http_response.aiter_raw().__aiter__()
            try:
                async for data in chunks:
                    at = time.perf_counter()
                    for payload in parser.feed(data):
                        if not _take_event(result, payload, at, state):
                            if state.get("done"):  # [DONE]: read the body's end too, so the connection is reused
                                await _drain(chunks)
                            return
            except httpx2.TransportError as exc:
                if chunked:  # the answer was cut inside its chunked body: say so, it is what the server did
                    raise httpx2.RemoteProtocolError("the server closed the connection inside a chunked body") from exc
                raise

    try:
        await asyncio.wait_for(read(), timeout=request.timeout_s)
    except asyncio.TimeoutError:
        result.error = f"no complete answer within {request.timeout_s:g} s"
    except Exception as exc:  # any failure of this request (HTTP status, connection, payload) is counted, never raised
        result.error = str(request_failure(exc, timeout_s=request.timeout_s))[:400]
    wave = _WAVE.get()
    if wave is not None and not state.get("at_transport"):
        wave.arrive()  # failed before it was sent: the rest of the first wave must not wait for it
    result.chunks = int(state["chunks"])
    if not state["usage"]:
        result.usage_missing = True
        result.output_tokens = int(state["chunks"])
    result.sent_at = state["sent"]
    result.e2e_s = state["last"] - state["sent"] if result.ttft_s is not None else None
    if not result.error and result.ttft_s is not None and not state.get("done"):
        result.error = "the stream ended before [DONE]"  # cut off: its tokens and times are not the whole answer
    result.ok = not result.error and result.ttft_s is not None
    if not result.ok and not result.error:
        result.error = "the stream ended before the first token"
    return result


async def _at_send(request: httpx2.Request) -> None:
    """The HTTP client's request hook, the timing hook: holds a first-wave request until its whole wave is built,
    then starts the request's clock (connecting, or taking a kept-alive connection, and sending count; building
    the request does not)."""
    timing = _TIMING.get()
    wave = _WAVE.get()
    if wave is not None:
        if timing is not None:
            timing["at_transport"] = 1
        await wave.wait()
    if timing is not None:
        timing["sent"] = timing["last"] = time.perf_counter()


def _client(endpoint: Endpoint, concurrency: int) -> Any:
    """An AsyncOpenAI for the benchmark over aiohttp: no retries, no per-read timer (each request is bounded as a
    whole by its caller), a connection per stream in flight kept alive for the next request, the timing hook."""
    slots = max(100, concurrency)
    return endpoint.async_openai(
        timeout_s=httpx2.Timeout(None, connect=30.0), max_retries=0,
        limits=httpx2.Limits(max_connections=slots, max_keepalive_connections=slots),
        event_hooks={"request": [_at_send]},
    )


@dataclass
class BatchResult:
    """`streams` requests in flight at once (more queue behind a semaphore), timed from the first send."""

    streams: int
    results: list[StreamResult]
    wall_s: float
    client_cpu_s: float = 0.0  # CPU seconds this process spent while the batch ran
    other_requests_at_start: int | None = None
    other_requests_at_end: int | None = None
    load_average: float | None = None  # this machine's 1-minute load average as the batch ended (shared machines)

    @property
    def ok(self) -> list[StreamResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> int:
        return len(self.results) - len(self.ok)

    @property
    def generated_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def aggregate_tokens_per_s(self) -> float | None:
        """Tokens of every completed stream over the batch's wall time."""
        return self.generated_tokens / self.wall_s if self.ok and self.wall_s > 0 else None

    @property
    def per_stream_tokens_per_s(self) -> float | None:
        """Mean over completed streams of each stream's own tokens/s, end to end (what one user sees)."""
        rates = [r.tokens_per_s for r in self.ok if r.tokens_per_s]
        return sum(rates) / len(rates) if rates else None

    def latency(self) -> dict[str, Summary]:
        ok = self.ok
        return {
            "ttft_ms": summarize([r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]),
            "itl_ms": summarize([x * 1e3 for r in ok for x in r.itl_s]),
            "tpot_ms": summarize([t * 1e3 for r in ok if (t := r.tpot_s) is not None]),
            "e2e_s": summarize([r.e2e_s for r in ok if r.e2e_s is not None]),
        }

    def samples(self) -> dict[str, list[Any]]:
        """Every completed request's own times, in request order, kept in the results so that a figure can show the
        distribution (and a stall as an outlier) from the results file alone: TTFT and end to end per request, the
        inter-token gaps per request (a list each: one gap between two events that carried tokens, so one fewer than
        `chunks`, which is fewer than the tokens when vLLM merged deltas for a reader that fell behind)."""
        ok = self.ok
        return {
            "ttft_ms": [_round(r.ttft_s * 1e3, 3) for r in ok if r.ttft_s is not None],
            "e2e_s": [_round(r.e2e_s, 4) for r in ok if r.e2e_s is not None],
            "itl_ms": [[round(x * 1e3, 3) for x in r.itl_s] for r in ok],
            "chunks": [r.chunks for r in ok],
        }

    def outliers(self) -> dict[str, Outliers]:
        """TTFT outliers over the requests, ITL outliers over every token gap of every request (stats.OUTLIER_RULE)."""
        ok = self.ok
        return {
            "ttft_ms": outliers([r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]),
            "itl_ms": outliers([x * 1e3 for r in ok for x in r.itl_s]),
        }

    def outlier_details(self) -> dict[str, dict[str, Any]]:
        """The outliers as the results keep them: rule, fence and count per latency (their samples are kept apart)."""
        return {name: found.model_dump(exclude={"indices"}) for name, found in self.outliers().items()}

    def metrics(self) -> dict[str, float | int | None]:
        """Numbers for the figure: the throughput, then mean/p50/p90/p99 of each latency, then the outlier counts."""
        values: dict[str, float | int | None] = {
            "streams": self.streams,
            "requests": len(self.results),
            "failed": self.failed,
            "generated_tokens": self.generated_tokens,
            "wall_s": _round(self.wall_s, 3),
            "aggregate_tokens_per_s": _round(self.aggregate_tokens_per_s, 2),
            "per_stream_tokens_per_s": _round(self.per_stream_tokens_per_s, 2),
        }
        for name, summary in self.latency().items():
            for stat in ("mean", "p50", "p90", "p99"):
                values[f"{name}_{stat}"] = _round(getattr(summary, stat), 3)
        for name, found in self.outliers().items():
            values[f"{name}_outliers"] = found.count
        return values

    def errors(self) -> list[str]:
        return [r.error for r in self.results if not r.ok]


def _others_in_flight(endpoint: Endpoint) -> int | None:
    """Requests the server is running or queueing (other users of a shared server); None when it cannot say."""
    try:
        metrics = endpoint.metrics()
    except (ServerError, OSError):
        return None
    running = metric_value(metrics, "vllm:num_requests_running")
    waiting = metric_value(metrics, "vllm:num_requests_waiting")
    if running is None and waiting is None:
        return None
    return int((running or 0) + (waiting or 0))


async def _batch(endpoint: Endpoint, requests: list[StreamRequest], concurrency: int, temperature: float) -> tuple[list[StreamResult], float, float]:
    client = _client(endpoint, concurrency)
    gate = asyncio.Semaphore(concurrency)
    _WAVE.set(_FirstWave(min(concurrency, len(requests))))  # the tasks below inherit it

    async def limited(request: StreamRequest) -> StreamResult:
        async with gate:
            return await _stream_one(client, endpoint.model, request, temperature)

    gc.collect()
    gc.freeze()  # as vllm bench does: no collector pauses over the long-lived objects while timing
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(r) for r in requests))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        gc.unfreeze()
        await client.close()
    return list(results), wall, cpu


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from synchronous code, also inside a notebook whose event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def run_batch(endpoint: Endpoint, requests: list[StreamRequest], concurrency: int | None = None, temperature: float = 0.0) -> BatchResult:
    """Send `requests` with at most `concurrency` in flight (default: all at once) and time them."""
    if not requests:
        raise CookbookError("run_batch: no requests")
    concurrency = concurrency or len(requests)
    if endpoint.budget is not None:  # no request outlives the run's budget
        left = max(0.01, endpoint.budget.remaining())
        requests = [dataclasses.replace(r, timeout_s=min(r.timeout_s, left)) for r in requests]
    before = _others_in_flight(endpoint)
    results, wall, cpu = _run(_batch(endpoint, requests, concurrency, temperature))
    after = _others_in_flight(endpoint)
    if not any(r.ok for r in results) and not endpoint.healthy():
        raise ServerDown(f"{endpoint.base_url}: the server stopped answering during the benchmark")
    return BatchResult(concurrency, results, wall, cpu, before, after, round(os.getloadavg()[0], 2))
