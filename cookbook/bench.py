"""Throughput and latency: the seeds' Performance table, the detail behind it, and a concurrency sweep.

Every request streams through the `openai` async client with `stream_options.include_usage`, and every output length
is fixed with `ignore_eos` and `max_tokens`, so two runs generate the same tokens. Times are taken the way
`vllm bench serve` takes them: TTFT at the first token chunk, inter-token latency between token chunks, end to end
at the last token chunk, TPOT = (end to end - TTFT) / (tokens - 1) (benchmarks/parity_vllm_bench.py holds the two
side by side). The client stays light so that it never competes with the server it measures (on the CPU recipe they
share two cores): the stream is read as raw server-sent events rather than parsed into SDK objects, and for plain
http the openai client runs over a small HTTP/1.1 transport on asyncio streams instead of the generic stack
(httpcore's pure-Python h11 parser on anyio, which re-arms the socket and a cancel scope on every chunk); together
they cut the client's CPU per token about threefold, to about what `vllm bench serve` spends. Each request is bounded
by a timeout; a failed request is counted and shown beside the figure, never dropped silently from a mean.

Results are `Figure`s of the shared `RunResults` (names stable: single-stream, n-streams, cold-prompt-<length>,
sweep), each with the seeds' "measured as" wording and the hardware that produced it, and DataFrames for notebooks.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import gc
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Coroutine, Iterable, Sequence, TypeVar

import httpx2  # the openai client's HTTP library (a dependency of openai)
from pydantic import BaseModel, ConfigDict, Field

from . import haystack
from .endpoint import Endpoint, metric_value
from .errors import CookbookError, RequestTimeout, ServerDown, ServerError
from .pages import performance_rows
from .recipes import Recipe
from .results import Figure, Hardware, RunResults, now, run_hardware
from .roofline import RooflineRow, roofline_rows, verdict

if TYPE_CHECKING:
    import pandas as pd

MEASURED_AS = "per-call, one server; times are end to end and include time to first token"
# The seeds' cold-prompt lengths as fractions of their 262,144-token context, for recipes without needle lengths.
SEED_LONG_FRACTIONS = (65_000 / 262_144, 131_000 / 262_144, 244_000 / 262_144)
WORKLOADS = ("single", "streams", "cold", "sweep")
TABLE = ("single", "streams", "cold")
SHORT_TOPICS = (
    "a lighthouse keeper who finds a message in a bottle", "the history of the printing press",
    "how a bridge is designed and built", "a day in the life of a honeybee", "the water cycle",
    "a journey across a desert by camel", "how bread rises", "the first flight across the Atlantic",
    "a robot learning to paint", "the life of a medieval blacksmith", "how volcanoes form",
    "a chess tournament in a small town", "the migration of whales", "how a clock works",
    "a market day in an old harbour town", "the invention of the telescope",
)

Progress = Callable[[str], None]
T = TypeVar("T")
# The running request's timing state: the transport stamps the moment it is handed the request (then connects and
# sends), so that the openai client's own request building (about 1 ms, 20 ms for a process's first request) is not
# counted as the server's TTFT; vllm bench's clock likewise starts as its HTTP session is handed the request.
_TIMING: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("cookbook_bench_timing", default=None)


class _FirstWave:
    """Holds the first `size` requests of a batch at the transport until all of them are built, then lets them go
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


class BenchConfig(BaseModel):
    """How the workloads run; the defaults are the seeds' (256 tokens, N = --max-num-seqs, 65K/131K/244K scaled)."""

    model_config = ConfigDict(extra="forbid")

    output_tokens: int = Field(256, gt=0, description="Tokens each short-prompt stream generates (the seeds: 256)")
    streams: int | None = Field(None, gt=0, description="N of the N-stream figure; default the recipe's --max-num-seqs, else 8")
    long_lengths: list[int] | None = Field(
        None, description="Cold prompt lengths in tokens; default the recipe's needle lengths, else the seeds' scaled to the context"
    )
    long_depths: list[float] | None = Field(
        None, description="Needle depths, one cold request each per length; default the recipe's, else [0.5]"
    )
    answer_tokens: int = Field(32, gt=0, description="Tokens of the answer to a cold prompt (fixed with ignore_eos)")
    sweep_levels: list[int] | None = Field(None, description="Concurrency levels of the sweep; default 1, 2, 4, ... up to N")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of every request")
    request_timeout_s: float = Field(300.0, gt=0, description="Bound on one short-prompt request, end to end")
    cold_timeout_s: float = Field(300.0, gt=0, description="Base bound on one cold request, plus 10 ms per prompt token")
    warmup: bool = Field(True, description="A short request first, and one cold prefill before the cold figures; neither counted")


# ---------------------------------------------------------------------------------------------------------------
# Statistics


class Summary(BaseModel):
    """Mean and percentiles of one latency over the requests of a figure (None when there is no sample)."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's and vllm bench's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(count=0)
    return Summary(
        count=len(values),
        mean=sum(values) / len(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
    )


# ---------------------------------------------------------------------------------------------------------------
# One streamed request


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
    text: str = ""
    finish_reason: str | None = None

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


async def _stream_one(client: Any, model: str, request: StreamRequest, temperature: float) -> StreamResult:
    import openai

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
            async for data in response.http_response.aiter_raw():
                at = time.perf_counter()
                for payload in parser.feed(data):
                    if not _take_event(result, payload, at, state):
                        return

    try:
        await asyncio.wait_for(read(), timeout=request.timeout_s)
    except asyncio.TimeoutError:
        result.error = f"no complete answer within {request.timeout_s:g} s"
    except openai.APIStatusError as exc:
        result.error = f"HTTP {exc.status_code}: {str(exc.message)[:300]}"
    except Exception as exc:  # any failure of this request (connection, protocol, payload) is counted, never raised
        result.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    wave = _WAVE.get()
    if wave is not None and not state.get("at_transport"):
        wave.arrive()  # failed before it was sent: the rest of the first wave must not wait for it
    if not state["usage"]:
        result.usage_missing = True
        result.output_tokens = int(state["chunks"])
    result.e2e_s = state["last"] - state["sent"] if result.ttft_s is not None else None
    if not result.error and result.ttft_s is not None and not state.get("done"):
        result.error = "the stream ended before [DONE]"  # cut off: its tokens and times are not the whole answer
    result.ok = not result.error and result.ttft_s is not None
    if not result.ok and not result.error:
        result.error = "the stream ended before the first token"
    return result


# ---------------------------------------------------------------------------------------------------------------
# A light transport for the openai client (plain http): one request per connection, read with asyncio streams

_SKIPPED_HEADERS = {b"host", b"connection", b"content-length", b"transfer-encoding", b"accept-encoding", b"keep-alive"}


class _Body(httpx2.AsyncByteStream):
    """A response body as it arrives: chunked transfer coding, a Content-Length, or up to the close."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunked: bool, length: int | None) -> None:
        self._reader, self._writer, self._chunked, self._length = reader, writer, chunked, length

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._reader
        if self._chunked:
            while True:
                line = await reader.readline()
                if not line:
                    raise httpx2.RemoteProtocolError("the server closed the connection inside a chunked body")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()).strip():  # trailers, up to the empty line
                        pass
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif self._length is not None:
            if self._length:
                yield await reader.readexactly(self._length)
        else:
            while data := await reader.read(65536):
                yield data

    async def aclose(self) -> None:
        self._writer.close()


class _Transport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams for a benchmark client: each request on its own connection (Connection: close),
    no compression, no timer per read (every request is bounded as a whole by its caller). The generic stack
    (httpcore's h11 parser on anyio) costs about twice the CPU per streamed token; on the CPU recipe the client
    shares two cores with the server it measures."""

    def __init__(self, connect_timeout_s: float = 30.0) -> None:
        self._connect_timeout_s = connect_timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timing = _TIMING.get()
        wave = _WAVE.get()
        if wave is not None:
            if timing is not None:
                timing["at_transport"] = 1
            await wave.wait()
        if timing is not None:  # the clock starts here: connecting and sending count, building the request does not
            timing["sent"] = timing["last"] = time.perf_counter()
        url = request.url
        body = await request.aread()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, url.port or 80, limit=2**20), self._connect_timeout_s
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise httpx2.ConnectError(f"{url.host}:{url.port}: {exc or type(exc).__name__}", request=request) from None
        head = [b"%s %s HTTP/1.1" % (request.method.encode(), url.raw_path), b"Host: %s" % url.netloc]
        head += [b"%s: %s" % (k, v) for k, v in request.headers.raw if k.lower() not in _SKIPPED_HEADERS]
        head += [b"Content-Length: %d" % len(body), b"Accept-Encoding: identity", b"Connection: close"]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        status = int((await reader.readline()).split(None, 2)[1])
        headers: list[tuple[bytes, bytes]] = []
        while (line := await reader.readline()).strip():
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
        fields = {k.lower(): v.lower() for k, v in headers}
        length = fields.get(b"content-length")
        stream = _Body(reader, writer, b"chunked" in fields.get(b"transfer-encoding", b""), int(length) if length else None)
        return httpx2.Response(status, headers=headers, stream=stream, request=request,
                               extensions={"http_version": b"HTTP/1.1"})


def _client(endpoint: Endpoint, timeout_s: float) -> Any:
    """An AsyncOpenAI for the benchmark: no retries, no per-read timer; the light transport for plain http."""
    from openai import AsyncOpenAI

    if not endpoint.base_url.startswith("http://"):
        return endpoint.async_openai(timeout_s=timeout_s, max_retries=0)
    http = httpx2.AsyncClient(transport=_Transport(), timeout=httpx2.Timeout(None, connect=30.0),
                              auth=endpoint.basic_auth(httpx2), follow_redirects=False)
    return AsyncOpenAI(base_url=endpoint.api_url, api_key=endpoint.api_key, max_retries=0, http_client=http)


# ---------------------------------------------------------------------------------------------------------------
# A batch of concurrent streams


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

    def metrics(self) -> dict[str, float | int | None]:
        """Numbers for the figure: the throughput, then mean/p50/p90/p99 of each latency."""
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
        return values

    def errors(self) -> list[str]:
        return [r.error for r in self.results if not r.ok]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


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
    client = _client(endpoint, max(r.timeout_s for r in requests))
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


# ---------------------------------------------------------------------------------------------------------------
# Workloads


def short_prompts(count: int) -> list[str]:
    """Short prompts (a dozen words), one topic per stream, the same for every run."""
    return [f"Write a long, detailed story about {SHORT_TOPICS[i % len(SHORT_TOPICS)]}." for i in range(count)]


def short_requests(count: int, output_tokens: int, timeout_s: float) -> list[StreamRequest]:
    return [StreamRequest([{"role": "user", "content": p}], output_tokens, timeout_s) for p in short_prompts(count)]


def sweep_levels(streams: int) -> list[int]:
    """1, 2, 4, ... up to `streams`, which is always the last level."""
    levels, level = [], 1
    while level < streams:
        levels.append(level)
        level *= 2
    return [*levels, streams]


def long_lengths(config: BenchConfig, recipe: Recipe | None, max_model_len: int) -> list[int]:
    """The cold-prompt lengths: asked for, else the recipe's needle lengths, else the seeds' scaled to the context;
    always capped so that prompt and answer fit."""
    if config.long_lengths:
        lengths = list(config.long_lengths)
    elif recipe is not None and recipe.verification.needles is not None and recipe.verification.needles.lengths:
        lengths = list(recipe.verification.needles.lengths)
    else:
        lengths = [int(round(max_model_len * f, -2)) for f in SEED_LONG_FRACTIONS]
    return haystack.fit_lengths(lengths, max_model_len, config.answer_tokens)


def _long_depths(config: BenchConfig, recipe: Recipe | None) -> list[float]:
    if config.long_depths:
        return list(config.long_depths)
    if recipe is not None and recipe.verification.needles is not None and recipe.verification.needles.depths:
        return list(recipe.verification.needles.depths)
    return [0.5]


def _streams(config: BenchConfig, recipe: Recipe | None) -> int:
    return config.streams or (recipe.max_num_seqs if recipe is not None else 8)


def _fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _fmt_seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _measured_as(extra: str, hardware: Hardware) -> str:
    parts = [MEASURED_AS, extra, f"on {hardware.description}"]
    return "; ".join(p for p in parts if p)


def _batch_details(batch: BatchResult, hardware: Hardware) -> dict[str, Any]:
    details: dict[str, Any] = {
        "hardware": hardware.model_dump(),
        "latency": {name: s.model_dump() for name, s in batch.latency().items()},
        "client_cpu_s": round(batch.client_cpu_s, 4),
        "other_requests_at_start": batch.other_requests_at_start,
        "other_requests_at_end": batch.other_requests_at_end,
        "client_load_average": batch.load_average,
        "output_tokens_per_request": sorted({r.output_tokens for r in batch.ok}),
    }
    if batch.failed:
        details["errors"] = batch.errors()
    if any(r.usage_missing for r in batch.results):
        details["note"] = "the server sent no usage block: tokens counted from the stream's chunks"
    return details


def single_stream_figure(batch: BatchResult, output_tokens: int, hardware: Hardware) -> Figure:
    metrics = {**batch.metrics(), "output_tokens": output_tokens, "tokens_per_s": batch.metrics()["per_stream_tokens_per_s"]}
    rate = metrics["tokens_per_s"]
    return Figure(
        name="single-stream",
        label=f"One stream, short prompt, {output_tokens} tokens",
        result=f"{_fmt_rate(rate)} tokens/s" if rate is not None else "failed",  # type: ignore[arg-type]
        measured_as=_measured_as("", hardware),
        metrics=metrics,
        failed_requests=batch.failed,
        details=_batch_details(batch, hardware),
    )


def n_streams_figure(batch: BatchResult, output_tokens: int, hardware: Hardware) -> Figure:
    metrics = {**batch.metrics(), "output_tokens": output_tokens}
    aggregate, per_stream = batch.aggregate_tokens_per_s, batch.per_stream_tokens_per_s
    result = f"{_fmt_rate(aggregate)} tokens/s aggregate, {_fmt_rate(per_stream)} per stream" if aggregate else "failed"
    noun = "stream, short prompt" if batch.streams == 1 else "streams, short prompts"
    return Figure(
        name="n-streams",
        label=f"{batch.streams} {noun}, {output_tokens} tokens each",
        result=result,
        measured_as=_measured_as("aggregate = all tokens over the wall time; per stream = mean of each stream's own rate", hardware),
        metrics=metrics,
        failed_requests=batch.failed,
        details=_batch_details(batch, hardware),
    )


def cold_figure(length: int, runs: list[tuple[float, StreamResult, dict[str, Any]]], answer_tokens: int, hardware: Hardware, warmup_s: float | None) -> Figure:
    """One cold-prompt length: every depth's request, time to the (fixed-length) answer as a value or a range."""
    ok = [r for _, r, _ in runs if r.ok and r.e2e_s is not None]
    seconds = [r.e2e_s for r in ok if r.e2e_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if seconds:
        low, high = min(seconds), max(seconds)
        shown = _fmt_seconds(low) if _fmt_seconds(low) == _fmt_seconds(high) else f"{_fmt_seconds(low)} to {_fmt_seconds(high)}"
        result = f"{shown} s to the answer"
    else:
        result = "failed"
    metrics: dict[str, float | int | None] = {
        "prompt_tokens": length,
        "requests": len(runs),
        "failed": len(runs) - len(ok),
        "seconds_to_answer_min": _round(min(seconds), 3) if seconds else None,
        "seconds_to_answer_max": _round(max(seconds), 3) if seconds else None,
        "seconds_to_answer_mean": _round(sum(seconds) / len(seconds), 3) if seconds else None,
        "ttft_s_min": _round(min(ttfts), 3) if ttfts else None,
        "ttft_s_max": _round(max(ttfts), 3) if ttfts else None,
        "prefill_tokens_per_s": _round(length / (sum(ttfts) / len(ttfts)), 1) if ttfts else None,
    }
    requests = []
    for depth, r, info in runs:
        requests.append({
            "depth": depth, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "ttft_s": _round(r.ttft_s, 3), "seconds_to_answer": _round(r.e2e_s, 3), "output_tokens": r.output_tokens,
            "error": r.error or None, **info,
        })
    details: dict[str, Any] = {"hardware": hardware.model_dump(), "requests": requests, "answer_tokens": answer_tokens}
    if len(ok) < len(runs):
        details["errors"] = [r.error for _, r, _ in runs if not r.ok]
    if warmup_s is not None:
        details["warmup_cold_prefill_s"] = round(warmup_s, 3)
    return Figure(
        name=f"cold-prompt-{haystack.format_tokens(length)}",
        label=f"Cold prompt of {haystack.format_tokens(length)} tokens (needle)",
        result=result,
        measured_as=_measured_as(
            f"cold: a fresh cache_salt per request; the prompt is exactly {length:,} tokens by /tokenize; "
            f"the answer is {answer_tokens} tokens", hardware),
        metrics=metrics,
        failed_requests=len(runs) - len(ok),
        details=details,
    )


def _cold_runs(endpoint: Endpoint, length: int, depths: list[float], config: BenchConfig) -> list[tuple[float, StreamResult, dict[str, Any]]]:
    runs = []
    timeout = haystack.request_timeout(config.cold_timeout_s, length)
    for depth in depths:
        seed = f"bench:{length}:{depth}"
        needle = haystack.make_needle(seed)
        try:
            stack = haystack.build_haystack(endpoint, length, depth, needle, seed)
        except ServerDown:
            raise
        except CookbookError as exc:  # a length this server cannot be given (shorter than the prompt frame ...)
            runs.append((depth, StreamResult(error=f"building the prompt: {exc}"), {}))
            continue
        request = StreamRequest(stack.messages, config.answer_tokens, timeout, haystack.new_salt())
        batch = run_batch(endpoint, [request], 1, config.temperature)
        result = batch.results[0]
        info = {"needle_found": needle.found_in(result.text), "asked_prompt_tokens": stack.prompt_tokens,
                "client_load_average": batch.load_average}
        runs.append((depth, result, info))
    return runs


def _short_batch(endpoint: Endpoint, streams: int, config: BenchConfig) -> BatchResult:
    return run_batch(endpoint, short_requests(streams, config.output_tokens, config.request_timeout_s), streams, config.temperature)


def _warm_up(endpoint: Endpoint, config: BenchConfig) -> None:
    run_batch(endpoint, short_requests(1, 16, config.request_timeout_s), 1, config.temperature)


def run_sweep(
    endpoint: Endpoint,
    recipe: Recipe | None = None,
    config: BenchConfig | None = None,
    progress: Progress | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> "pd.DataFrame":
    """Aggregate and per-stream tokens/s and latency percentiles at 1, 2, 4, ... N streams, one row per level
    (appended to `rows` as each level ends, so that a caller keeps the levels measured if a later one fails)."""
    config = config or BenchConfig()
    levels = config.sweep_levels or sweep_levels(_streams(config, recipe))
    rows = [] if rows is None else rows
    for level in levels:
        if progress:
            progress(f"sweep: {level} stream(s) x {config.output_tokens} tokens")
        batch = _short_batch(endpoint, level, config)
        rows.append({**batch.metrics(), "output_tokens": config.output_tokens,
                     "client_cpu_s": round(batch.client_cpu_s, 4), "other_requests_at_start": batch.other_requests_at_start,
                     "client_load_average": batch.load_average, "errors": "; ".join(batch.errors())})
    return _frame(rows)


def _frame(rows: list[dict[str, Any]]) -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame(rows)


def sweep_figure(frame: "pd.DataFrame", hardware: Hardware) -> Figure:
    """The sweep as one figure: the aggregate at each level in the result, every row in details['rows']."""
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]
    levels = [int(r["streams"]) for r in rows]
    rates = ", ".join(_fmt_rate(r["aggregate_tokens_per_s"]) for r in rows)
    peak = max(rows, key=lambda r: r["aggregate_tokens_per_s"] or 0)
    tokens = int(rows[0]["output_tokens"]) if rows else 0
    failed = sum(int(r["failed"]) for r in rows)
    return Figure(
        name="sweep",
        label=f"Concurrency sweep, {levels[0]} to {levels[-1]} streams, short prompts, {tokens} tokens each",
        result=f"{rates} tokens/s aggregate at {', '.join(map(str, levels))} streams",
        measured_as=_measured_as("each level is its own run, all of its streams sent at once", hardware),
        metrics={"peak_aggregate_tokens_per_s": peak["aggregate_tokens_per_s"], "peak_streams": peak["streams"]},
        failed_requests=failed,
        details={"hardware": hardware.model_dump(), "rows": rows},
    )


def _hardware(endpoint: Endpoint, recipe: Recipe | None, hardware: Hardware | None) -> Hardware:
    return run_hardware(hardware, recipe, endpoint.base_url)


def run_performance_table(
    endpoint: Endpoint,
    recipe: Recipe | None = None,
    config: BenchConfig | None = None,
    hardware: Hardware | None = None,
    workloads: Iterable[str] = TABLE,
    progress: Progress | None = None,
) -> RunResults:
    """The seeds' Performance table (single stream, N streams, cold long prompts), optionally the sweep, as
    RunResults; decode figures carry their roofline row when the recipe and the hardware are known."""
    config = config or BenchConfig()
    wanted = list(dict.fromkeys(workloads))
    unknown = [w for w in wanted if w not in WORKLOADS]
    if unknown:
        raise CookbookError(f"--workloads: unknown workload {unknown[0]!r} (known: table, {', '.join(WORKLOADS)})")
    hardware = _hardware(endpoint, recipe, hardware)
    say = progress or (lambda _line: None)
    results = RunResults(
        recipe=recipe.id if recipe else "(none)",
        model=endpoint.model,
        hardware=hardware,
        image=recipe.image.label.replace("`", "") if recipe else "",
        performance_note=f"Single runs on the server above, {hardware.description} (measured as: {MEASURED_AS}).",
        started_at=now(),
    )
    try:
        results.kv_pool_tokens = endpoint.kv_pool_tokens()
    except (ServerError, OSError):
        pass
    step = {"name": "warm-up"}
    try:
        _run_workloads(endpoint, recipe, config, hardware, wanted, results, say, step)
    except ServerError as exc:  # the server died, stalled or the budget ran out: keep every figure measured so far
        results.stopped = f"stopped during {step['name']}: {exc}"
        say(f"{results.stopped}; the figures measured before it are kept")
    if recipe is not None:
        _attach_roofline(results, recipe)
    results.finished_at = now()
    return results


def _run_workloads(endpoint: Endpoint, recipe: Recipe | None, config: BenchConfig, hardware: Hardware, wanted: list[str],
                   results: RunResults, say: Progress, step: dict[str, str]) -> None:
    """The workloads in order, each figure appended as soon as it is measured; `step` names the one running."""

    def begin(name: str) -> None:
        step["name"] = name
        budget = endpoint.budget
        if budget is not None and budget.expired:
            raise RequestTimeout(f"{budget.describe()} was used up")

    progress = say
    streams = _streams(config, recipe)
    begin("warm-up")
    if config.warmup and any(w != "cold" for w in wanted):
        say("warm-up: one short request (not counted)")
        _warm_up(endpoint, config)
    if "single" in wanted:
        begin("single-stream")
        say(f"single-stream: 1 stream x {config.output_tokens} tokens")
        batch = _short_batch(endpoint, 1, config)
        results.performance.append(single_stream_figure(batch, config.output_tokens, hardware))
    if "streams" in wanted:
        begin("n-streams")
        say(f"n-streams: {streams} streams x {config.output_tokens} tokens")
        batch = _short_batch(endpoint, streams, config)
        results.performance.append(n_streams_figure(batch, config.output_tokens, hardware))
    if "cold" in wanted:
        begin("cold prompts")
        lengths = long_lengths(config, recipe, haystack.server_max_model_len(endpoint))
        depths = _long_depths(config, recipe)
        warmup_s: float | None = None
        if config.warmup and lengths:
            say(f"warm-up: one cold prefill of {lengths[0]:,} tokens (not counted)")
            warm = _cold_runs(endpoint, lengths[0], [depths[0]], config.model_copy(update={"answer_tokens": 1}))
            warmup_s = warm[0][1].e2e_s
        for length in lengths:
            begin(f"cold-prompt-{haystack.format_tokens(length)}")
            say(f"cold prompts: {length:,} tokens at {len(depths)} depth(s)")
            runs = _cold_runs(endpoint, length, depths, config)
            results.performance.append(cold_figure(length, runs, config.answer_tokens, hardware, warmup_s))
            warmup_s = None
    if "sweep" in wanted:
        begin("sweep")
        rows: list[dict[str, Any]] = []
        try:
            run_sweep(endpoint, recipe, config, progress, rows)
        finally:  # the levels measured before a failure are kept
            if rows:
                results.performance.append(sweep_figure(_frame(rows), hardware))


def _attach_roofline(results: RunResults, recipe: Recipe) -> None:
    """MBU into each decode figure's metrics, the whole row into its details (sweep rows get an mbu column)."""
    rows = {row.figure: row for row in roofline_rows(recipe, results.performance, results.hardware)}
    for figure in results.performance:
        row = rows.get(figure.name)
        if row is not None:
            figure.metrics["mbu"] = round(row.mbu, 5)
            figure.metrics["roofline_bound_tokens_per_s"] = round(row.bound_tokens_per_s, 1)
            figure.details["roofline"] = row.model_dump()
        if figure.name == "sweep":
            for level in figure.details.get("rows", []):
                sweep_row = rows.get(f"sweep@{level['streams']}")
                level["mbu"] = round(sweep_row.mbu, 5) if sweep_row else None


# ---------------------------------------------------------------------------------------------------------------
# Tables for notebooks and the terminal


def detail_frame(results: RunResults) -> "pd.DataFrame":
    """The detail behind the table: per figure, requests, failures, and TTFT / ITL / TPOT / E2E p50, p90, p99."""
    rows = []
    for figure in results.performance:
        if figure.name == "sweep":
            continue
        m = figure.metrics
        row: dict[str, Any] = {"figure": figure.name, "requests": m.get("requests"), "failed": figure.failed_requests}
        if figure.name.startswith("cold-prompt-"):
            row.update({"ttft_s_min": m.get("ttft_s_min"), "ttft_s_max": m.get("ttft_s_max"),
                        "e2e_s_min": m.get("seconds_to_answer_min"), "e2e_s_max": m.get("seconds_to_answer_max")})
        else:
            for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_s"):
                for stat in ("p50", "p90", "p99"):
                    row[f"{name}_{stat}"] = m.get(f"{name}_{stat}")
        row["mbu"] = m.get("mbu")
        rows.append(row)
    return _frame(rows)


def sweep_frame(results: RunResults) -> "pd.DataFrame":
    """The sweep's rows back as a DataFrame (from a results file too)."""
    figure = results.figure("sweep")
    return _frame(figure.details.get("rows", []) if figure else [])


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)]


def _stat(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_report(results: RunResults, rows: list[RooflineRow] | None = None, recipe: Recipe | None = None) -> str:
    """The Performance table as the seeds show it (Test | Result), the detail table, and the roofline lines."""
    out = [f"Performance on {results.hardware.description} ({results.model}, {results.started_at})",
           f"measured as: {MEASURED_AS}", ""]
    out += _text_table(("Test", "Result"), performance_rows(results))
    detail = []
    for figure in results.performance:
        m = figure.metrics
        if figure.name == "sweep":
            continue
        if figure.name.startswith("cold-prompt-"):
            ttft = f"{_stat(m.get('ttft_s_min'), 2)} to {_stat(m.get('ttft_s_max'), 2)} s"
            detail.append((figure.name, str(m.get("requests")), str(figure.failed_requests), ttft, "-", "-",
                           f"{_stat(m.get('seconds_to_answer_min'), 2)} to {_stat(m.get('seconds_to_answer_max'), 2)} s"))
            continue
        cells = ["/".join(_stat(m.get(f"{n}_{s}"), d) for s in ("p50", "p90", "p99"))
                 for n, d in (("ttft_ms", 0), ("itl_ms", 1), ("tpot_ms", 1), ("e2e_s", 2))]
        detail.append((figure.name, str(m.get("requests")), str(figure.failed_requests), *cells))
    if detail:
        out += ["", "Detail (p50/p90/p99; TTFT, ITL, TPOT in ms, E2E in s; cold prompts: min to max)"]
        out += _text_table(("Figure", "Requests", "Failed", "TTFT", "ITL", "TPOT", "E2E"), detail)
    sweep = results.figure("sweep")
    if sweep is not None:
        out += ["", f"Sweep ({sweep.label})"]
        sweep_rows = [(str(r["streams"]), _stat(r.get("aggregate_tokens_per_s"), 1), _stat(r.get("per_stream_tokens_per_s"), 1),
                       _stat(r.get("ttft_ms_p50"), 0), _stat(r.get("tpot_ms_p50"), 1), _stat(r.get("tpot_ms_p99"), 1),
                       str(r.get("failed")), _stat(r.get("mbu") * 100 if r.get("mbu") is not None else None, 1))
                      for r in sweep.details.get("rows", [])]
        out += _text_table(("Streams", "Aggregate tok/s", "Per stream tok/s", "TTFT p50 ms", "TPOT p50 ms",
                            "TPOT p99 ms", "Failed", "MBU %"), sweep_rows)
    if rows is not None:
        out += ["", "Roofline (decode, weights only)"]
        if rows:
            out.append(f"hardware: {rows[0].hardware}")
            out += [row.line() for row in rows]
            if recipe is not None:
                out.append(f"verdict: {verdict(rows, recipe)}")
        else:
            out.append("not computed: the recipe or the hardware that produced the figures is not known")
    return "\n".join(out)
