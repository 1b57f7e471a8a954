"""One way to talk to any OpenAI-compatible vLLM server: the CPU one we start, a Gaudi box, or a proxy.

Everything downstream (checks, probes, benchmarks, notebooks) takes an `Endpoint`: a base URL and a model name,
plus the server-side extras vLLM offers beside the OpenAI API (/health, /metrics, /tokenize). Requests go out one
way (`Endpoint.chat`, `Endpoint.post`; the benchmark's async streams through the openai client) and what goes wrong
is mapped once (`request_failure`): an HTTP error status is `RequestFailed` (`RequestRejected` for 3xx/4xx), no
answer in time is `RequestTimeout`, a broken connection is `ConnectionLost`, or `ServerDown` when /health is gone too.
One HTTP library, httpx2 (the one the openai client is built on).
"""
from __future__ import annotations


import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx2

from .errors import ConnectionLost, RequestFailed, RequestRejected, RequestTimeout, ServerDown, ServerError, UsageError
from .secrets import register_secret, strip_url_credentials

DEFAULT_TIMEOUT_S = 60.0
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_base_url(url: str, flag: str = "--base-url") -> tuple[str, tuple[str, str] | None]:
    """An http(s) server URL as (the root without /v1 and without credentials, (user, password) or None).
    Anything else (no scheme or host, another scheme, a bad port, a broken IPv6 literal) is refused in one line."""
    text = str(url).strip()
    shown = strip_url_credentials(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{flag}: {shown!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag}: {shown!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000)")
    if parts.query or parts.fragment or any(c.isspace() for c in text):
        raise UsageError(f"{flag}: {shown!r}: a server URL has no spaces, query or fragment")
    auth = None
    if parts.username is not None or parts.password is not None:
        auth = (unquote(parts.username or ""), unquote(parts.password or ""))
        register_secret(auth[1])
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host + (f":{port}" if port is not None else "")
    root = urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root), auth


def normalize_base_url(url: str) -> str:
    """Accept http://host:port or http://host:port/v1; keep the server root (without /v1 and credentials)."""
    return parse_base_url(url)[0]


# ---------------------------------------------------------------------------------------------------------------
# Deadlines: a request is bounded as a whole (wall clock), not per read, and a run has a budget


class Deadline:
    """A wall-clock bound: `seconds` from now. A request's deadline is its timeout; a run's is its budget."""

    def __init__(self, seconds: float, what: str = "") -> None:
        self.seconds = float(seconds)
        self.what = what  # "the run's budget" for a budget; "" for a request
        self.at = time.monotonic() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def describe(self) -> str:
        return f"{self.what} of {self.seconds:g} s" if self.what else f"{self.seconds:g} s"


def earliest(*deadlines: Deadline | None) -> Deadline | None:
    found = [d for d in deadlines if d is not None]
    return min(found, key=lambda d: d.at) if found else None


class _Watchdog:
    """Shuts the request's socket down when its deadline passes, so that no read can go on: a server that trickles
    one byte a second (headers or body) or stalls cannot hold a request beyond its deadline."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline.remaining(), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        stream = info.get("return_value") if event.endswith(".complete") else None
        sock = getattr(stream, "get_extra_info", lambda _name: None)("socket")
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                if self.fired:
                    self._shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def deadline_transport(lib: Any, budget: Callable[[], Deadline | None] = lambda: None) -> Any:
    """An HTTP transport for `lib` (httpx2) on which the request's timeout is a
    wall-clock deadline for the whole request, capped by the run's budget (`budget()`). One fresh connection per
    request (no keep-alive), so the watchdog always knows the socket to shut down. Past the deadline the request
    fails with the library's ReadTimeout, whose message names the bound that ran out."""

    class _Stream(lib.SyncByteStream):
        def __init__(self, inner: Any, watchdog: _Watchdog, request: Any) -> None:
            self._inner, self._watchdog, self._request = inner, watchdog, request

        def __iter__(self) -> Any:
            try:
                for chunk in self._inner:
                    if self._watchdog.deadline.expired:
                        raise lib.ReadTimeout(_late(self._watchdog.deadline), request=self._request)
                    yield chunk
            except lib.TransportError as exc:
                if self._watchdog.fired or self._watchdog.deadline.expired:
                    raise lib.ReadTimeout(_late(self._watchdog.deadline), request=self._request) from None
                raise exc

        def close(self) -> None:
            self._watchdog.cancel()
            self._inner.close()

    class _Transport(lib.BaseTransport):
        def __init__(self) -> None:
            self._inner = lib.HTTPTransport(limits=lib.Limits(max_keepalive_connections=0))

        def handle_request(self, request: Any) -> Any:
            read = (request.extensions.get("timeout") or {}).get("read")
            unbudgeted = request.extensions.get(NO_BUDGET)  # /health: a probe must answer after the budget too
            deadline = earliest(Deadline(read) if read else None, None if unbudgeted else budget())
            if deadline is None:
                return self._inner.handle_request(request)
            if deadline.expired:
                raise lib.ReadTimeout(_late(deadline), request=request)
            watchdog = _Watchdog(deadline)
            outer = request.extensions.get("trace")

            def trace(event: str, info: dict[str, Any]) -> None:
                watchdog.trace(event, info)
                if outer is not None:
                    outer(event, info)

            request.extensions = {**request.extensions, "trace": trace}
            try:
                response = self._inner.handle_request(request)
            except lib.TransportError:
                watchdog.cancel()
                if watchdog.fired or deadline.expired:
                    raise lib.ReadTimeout(_late(deadline), request=request) from None
                raise
            except BaseException:
                watchdog.cancel()
                raise
            return lib.Response(response.status_code, headers=response.headers,
                                stream=_Stream(response.stream, watchdog, request), extensions=response.extensions)

        def close(self) -> None:
            self._inner.close()

    return _Transport()


NO_BUDGET = "cookbook_no_budget"  # a request extension: bounded by its own timeout only, not by the run's budget


def _late(deadline: Deadline) -> str:
    return f"no complete answer within {deadline.describe()}"


# ---------------------------------------------------------------------------------------------------------------
# One mapping of what goes wrong with a request, for every caller (checks, probes, bench)


def status_failure(status: int, body: str, where: str = "", location: str | None = None) -> RequestFailed:
    """An HTTP error answer as an error: 3xx (never followed: another origin's answer is never scored) and 4xx are
    `RequestRejected`, anything else `RequestFailed`; the message starts "HTTP <status>"."""
    what = f"HTTP {status}: a redirect to {location!r}, not followed" if 300 <= status < 400 else f"HTTP {status}: {body[:300]}"
    kind = RequestRejected if 300 <= status < 500 else RequestFailed
    return kind(f"{where}: {what}" if where else what, status_code=status, body=body)


def request_failure(
    exc: BaseException,
    where: str = "",
    timeout_s: float | None = None,
    budget: Deadline | None = None,
    healthy: Callable[[], bool] | None = None,
) -> ServerError:
    """What `exc`, raised while sending a request or reading its answer, means: no answer in time is
    `RequestTimeout` (naming the run's budget when that is what ran out), an HTTP error status is `RequestFailed`,
    a broken connection is `ConnectionLost`; a timeout or a broken connection is `ServerDown` instead when
    `healthy()` says /health is gone too. Works on the openai client's errors and on httpx2's; the message is
    prefixed with `where` when given."""
    import openai

    def said(what: str) -> str:
        return f"{where}: {what}" if where else what

    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        try:
            body = exc.response.text
        except (httpx2.ResponseNotRead, httpx2.StreamError):  # a streamed answer whose body was never read
            body = str(exc.message)
        return status_failure(exc.status_code, body, where, exc.response.headers.get("location"))
    if isinstance(exc, (openai.APITimeoutError, httpx2.TimeoutException, TimeoutError)):
        if healthy is not None and not healthy():
            return ServerDown(said(f"{type(exc).__name__}: server not reachable"))
        if budget is not None and budget.expired:
            return RequestTimeout(said(f"no answer before {budget.describe()} ran out"))
        return RequestTimeout(said(f"no answer within {timeout_s:g} s" if timeout_s else f"no answer in time ({exc})"))
    if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError, OSError)):
        if healthy is not None and not healthy():
            return ServerDown(said(f"{type(exc).__name__}: server not reachable"))
        return ConnectionLost(said(f"connection lost ({type(exc).__name__}: {str(exc)[:200]})" if str(exc) else
                                   f"connection lost ({type(exc).__name__})"))
    if isinstance(exc, (ValueError, KeyError, TypeError)):  # a 200 whose body is not the API's JSON
        return RequestFailed(said(f"not an API answer ({type(exc).__name__}: {str(exc)[:200]})"))
    return RequestFailed(said(f"{type(exc).__name__}: {str(exc)[:300]}"))


@dataclass
class ChatAnswer:
    """One answered chat request as JSON: the body (for a stream, only its usage) and every chunk when streamed."""

    body: dict[str, Any]
    seconds: float
    chunks: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Metric:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Metric]:
    """Prometheus text format, enough of it for vLLM's /metrics."""
    metrics: list[Metric] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _METRIC_LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        metrics.append(Metric(name, dict(_LABEL.findall(labels or "")), number))
    return metrics


def metric_value(metrics: list[Metric], name: str, **labels: str) -> float | None:
    """Sum of the samples called `name` whose labels include `labels` (None when there is none)."""
    found = [m.value for m in metrics if m.name == name and all(m.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


# The server's prefill pace is read once it has computed this many prompt tokens: fewer say too little.
PACE_MIN_TOKENS = 500
# A /health that gave no answer within its first timeout gets this much longer before the server counts as down
# (Endpoint.healthy): a server that is gone refuses the connection at once; one that is only starved of CPU answers late.
SLOW_HEALTH_RETRY_S = 30.0


def prefill_pace_from_metrics(metrics: list[Metric]) -> float | None:
    """Seconds per computed prompt token over the server's life so far (vLLM's request_prefill_time_seconds sum over
    request_prefill_kv_computed_tokens sum): how fast this server prefills here, on this host and under its load.
    Requests prefilled together each count their whole prefill time, so a batch reads slower: a deadline from it errs
    long. None before PACE_MIN_TOKENS tokens, or without the series."""
    seconds = metric_value(metrics, "vllm:request_prefill_time_seconds_sum")
    tokens = metric_value(metrics, "vllm:request_prefill_kv_computed_tokens_sum")
    if seconds is None or tokens is None or tokens < PACE_MIN_TOKENS or seconds <= 0:
        return None
    return seconds / tokens


def kv_pool_from_metrics(metrics: list[Metric]) -> int | None:
    """KV pool size in tokens from vllm:cache_config_info (kv_cache_size_tokens, or blocks x block size)."""
    for m in metrics:
        if m.name.startswith("vllm:cache_config_info"):
            tokens = m.labels.get("kv_cache_size_tokens")
            if tokens and tokens.isdigit():
                return int(tokens)
            blocks, block = m.labels.get("num_gpu_blocks"), m.labels.get("block_size")
            if blocks and block and blocks.isdigit() and block.isdigit():
                return int(blocks) * int(block)
    return None


@dataclass
class Endpoint:
    """A server to talk to. The API key, if any, comes from the environment and is never printed."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = DEFAULT_TIMEOUT_S
    _http: httpx2.Client | None = field(default=None, repr=False, compare=False)
    _auth: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    budget: Deadline | None = field(default=None, repr=False, compare=False)  # the run's, caps every request
    # seconds per prompt token this server prefills at, from its /metrics when a run starts (a long request's
    # deadline stretches by it: haystack.request_timeout); None until a run has read it
    prefill_pace: float | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The URL shown and written everywhere carries no credentials; they are kept aside for the requests.
        self.base_url, self._auth = parse_base_url(self.base_url)

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env) or "EMPTY"

    def _budget(self) -> Deadline | None:
        return self.budget

    def http(self) -> httpx2.Client:
        """Plain HTTP to the server: every request bounded by a wall-clock deadline (its timeout, capped by the
        run's budget), redirects never followed (an answer from another origin is never scored)."""
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.api_key}"}
            self._http = httpx2.Client(
                base_url=self.base_url, timeout=self.timeout_s, headers=headers, follow_redirects=False,
                auth=self.basic_auth(httpx2),
                transport=deadline_transport(httpx2, self._budget),
            )
        return self._http

    def openai(self, timeout_s: float | None = None, max_retries: int = 0) -> Any:
        """A synchronous OpenAI client with a wall-clock deadline per request, no silent retries and no redirects."""
        from openai import OpenAI

        http = httpx2.Client(
            follow_redirects=False, auth=self.basic_auth(httpx2),
            transport=deadline_transport(httpx2, self._budget), timeout=timeout_s or self.timeout_s,
        )
        return OpenAI(
            base_url=self.api_url, api_key=self.api_key, timeout=timeout_s or self.timeout_s, max_retries=max_retries,
            http_client=http,
        )

    def async_openai(self, timeout_s: float | httpx2.Timeout | None = None, max_retries: int = 0, **http: Any) -> Any:
        """An AsyncOpenAI over aiohttp (openai's DefaultAioHttpClient: keep-alive, TLS, a C HTTP parser), no silent
        retries and no redirects; `http` goes to the HTTP client (limits, event_hooks)."""
        from openai import AsyncOpenAI, DefaultAioHttpClient

        timeout = self.timeout_s if timeout_s is None else timeout_s
        client = DefaultAioHttpClient(follow_redirects=False, auth=self.basic_auth(httpx2), timeout=timeout, **http)
        return AsyncOpenAI(base_url=self.api_url, api_key=self.api_key, timeout=timeout, max_retries=max_retries,
                           http_client=client)

    # -- requests ------------------------------------------------------------------------------------------------

    def post(self, path: str, body: dict[str, Any], timeout_s: float | None = None, where: str | None = None) -> dict[str, Any]:
        """POST JSON to the server (/tokenize, /v1/completions ...) and return the JSON answer; anything else is
        raised as `request_failure` says, its message prefixed with `where` (default: the URL)."""
        timeout = timeout_s or self.timeout_s
        where = f"{self.base_url}{path}" if where is None else where
        try:
            response = self.http().post(path, json=body, timeout=timeout)
            if response.status_code != 200:
                raise status_failure(response.status_code, response.text, where, response.headers.get("location"))
            return dict(response.json())
        except ServerError:
            raise
        except Exception as exc:
            raise request_failure(exc, where, timeout, self.budget, self.healthy) from None

    def chat(self, body: dict[str, Any], timeout_s: float | None = None, stream: bool = False, where: str | None = "") -> ChatAnswer:
        """One chat completion (`model` added when missing), the one way checks and probes send one. Streamed, the
        answer keeps every chunk and its body only the usage (assembling the message is what a stream check checks).
        Failures are raised as `request_failure` says; by default their message is bare (no URL), for evidence."""
        path = "/v1/chat/completions"
        body = {"model": self.model, **body}
        timeout = timeout_s or self.timeout_s
        where = f"{self.base_url}{path}" if where is None else where
        started = time.monotonic()
        if not stream:
            return ChatAnswer(self.post(path, body, timeout, where=where), time.monotonic() - started)
        chunks = []
        try:
            with self.http().stream("POST", path, json={**body, "stream": True}, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise status_failure(response.status_code, response.text, where, response.headers.get("location"))
                for line in response.iter_lines():
                    data = line[5:].strip() if line.startswith("data:") else ""
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data) if data else None
                    if chunk and chunk.get("error"):
                        error = chunk["error"]
                        message = error.get("message", error) if isinstance(error, dict) else error
                        raise RequestFailed(f"{where + ': ' if where else ''}the stream carried an error: {str(message)[:300]}")
                    if chunk is not None:
                        chunks.append(chunk)
        except ServerError:
            raise
        except Exception as exc:
            raise request_failure(exc, where, timeout, self.budget, self.healthy) from None
        usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
        return ChatAnswer({"usage": usage}, time.monotonic() - started, chunks)

    def stream_first_event(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> float | None:
        """POST a streamed request, read it to its end, and return when (time.monotonic()) its first data line came,
        None if none did. Failures are raised as `request_failure` says (a probe's gate request, which only holds the
        engine while others queue)."""
        timeout = timeout_s or self.timeout_s
        where = f"{self.base_url}{path}"
        first: float | None = None
        try:
            with self.http().stream("POST", path, json={**body, "stream": True}, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise status_failure(response.status_code, response.text, where, response.headers.get("location"))
                for line in response.iter_lines():
                    if first is None and line.startswith("data:"):
                        first = time.monotonic()
        except ServerError:
            raise
        except Exception as exc:
            raise request_failure(exc, where, timeout, self.budget, self.healthy) from None
        return first

    def basic_auth(self, lib: Any) -> Any:
        """The --base-url's user:password as `lib`'s BasicAuth (None without): used, never shown."""
        return lib.BasicAuth(*self._auth) if self._auth else None

    # -- vLLM's extras ------------------------------------------------------------------------------------------

    def _get(self, path: str, timeout_s: float | None = None, budgeted: bool = True) -> httpx2.Response:
        try:
            extensions = {} if budgeted else {NO_BUDGET: True}
            return self.http().get(path, timeout=timeout_s or self.timeout_s, extensions=extensions)
        except (httpx2.ConnectError, httpx2.RemoteProtocolError, httpx2.ReadError) as exc:
            raise ServerDown(f"{self.base_url}{path}: {type(exc).__name__}: server not reachable") from None
        except httpx2.TimeoutException as exc:
            raise RequestTimeout(f"{self.base_url}{path}: {exc}") from None

    def healthy(self, timeout_s: float = 5.0, slow_retry_s: float = SLOW_HEALTH_RETRY_S) -> bool:
        """/health answers 200. A refused or broken connection is a no at once; no answer within `timeout_s` gets
        one more try of `slow_retry_s` first (0: none, for a caller that polls): on a loaded host a live server's
        /health can wait seconds, and a no here ends a run ("server down")."""
        try:
            return self._get("/health", timeout_s, budgeted=False).status_code == 200
        except RequestTimeout:
            if slow_retry_s <= 0:
                return False
        except ServerError:
            return False
        try:
            return self._get("/health", slow_retry_s, budgeted=False).status_code == 200
        except ServerError:
            return False

    def metrics(self) -> list[Metric]:
        response = self._get("/metrics")
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/metrics: HTTP {response.status_code}")
        return parse_metrics(response.text)

    def models(self) -> list[dict[str, Any]]:
        """The /v1/models entries (id, root, max_model_len ...)."""
        response = self._get("/v1/models")
        if response.status_code != 200:
            raise ServerError(f"{self.base_url}/v1/models: HTTP {response.status_code}")
        try:
            return list(response.json().get("data", []))
        except (ValueError, AttributeError) as exc:
            raise request_failure(exc, f"{self.base_url}/v1/models") from None

    def served_models(self) -> list[str]:
        return [m["id"] for m in self.models()]

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` in this model's tokenizer (vLLM's /tokenize)."""
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        return list(self.post("/tokenize", body)["tokens"])

    def detokenize(self, tokens: list[int]) -> str:
        return str(self.post("/detokenize", {"model": self.model, "tokens": tokens})["prompt"])

    def process_start_time(self) -> float | None:
        return metric_value(self.metrics(), "process_start_time_seconds")

    def kv_pool_tokens(self) -> int | None:
        return kv_pool_from_metrics(self.metrics())

    def for_another_thread(self, timeout_s: float | None = None) -> "Endpoint":
        """The same server, credentials and budget with an HTTP client of its own, for a background thread (an
        httpx2 client is not shared across threads)."""
        twin = replace(self, timeout_s=self.timeout_s if timeout_s is None else timeout_s)
        twin._http, twin._auth, twin.budget = None, self._auth, self.budget
        return twin

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
