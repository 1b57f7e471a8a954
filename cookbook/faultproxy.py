"""A fault-injecting HTTP proxy in front of a real server: the proof that each check catches its bug.

    with FaultProxy("http://127.0.0.1:8000", "drop-min-p") as proxy:
        endpoint = Endpoint(proxy.base_url, model)   # the min-p check must now fail, naming the symptom

The proxy listens on 127.0.0.1 (a free port unless given), forwards every request to the upstream server and lets
a `Fault` rewrite the traffic. Streamed (SSE) responses pass through event by event, as the server sends them.

The Fault interface
-------------------
Subclass `Fault` and override only the hooks you need. Every hook runs in the thread of the request it is about,
so a fault may block (briefly) to wait for another request; shared state needs the fault's own lock.

- `request(ex) -> Reply | None`: before forwarding. Edit `ex.body` (the request JSON) in place, or return a
  `Reply(status, body)` to answer without asking the server (a 500, a 503 from /health...). Raise `KillServer`
  to stop the proxy: the connection drops and every later connection is refused, as when a server dies.
- `response(ex, body) -> body`: a non-streamed JSON response (any status: `ex.status`); return it rewritten.
- `chunk(ex, event) -> list[event]`: one streamed SSE event's JSON; return the events to send instead
  (`[]` drops it, `[event]` keeps it). `data: [DONE]` is not shown to faults.
- `text(ex, text) -> text`: a non-JSON response body, e.g. /metrics.

`Exchange` (`ex`) is one proxied request: `method`, `path`, `body` (parsed JSON or None), `status` (upstream's,
once known), `state` (a dict private to this request) and `in_flight()` (API requests the proxy is handling right
now, this one included), which is what faults that only show under concurrency key on. Class attributes say what a
fault is for: `name`, `catches` (the checks that must fail under it) and `symptom` (a regular expression the
failing check's result or evidence matches).

A fault that keeps state (counters, a partner request) sets it up in `reset()`, which `fresh()` calls on a copy.
`FAULTS` names one instance per fault and is read-only (a test cannot change what the next test sees);
`make_fault(name)` (or `FaultProxy(url, name)`) gives a fresh copy, so every proxy starts clean. A caller that wants
other families by name too builds its own table with `fault_table(LONG_CONTEXT_FAULTS, ...)` and passes it to
`make_fault(name, table)`. `Chain(a, b)` applies several in order, e.g. an adapter plus a fault.
"""
from __future__ import annotations

import copy
import json
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable

import httpx2

from .errors import CookbookError
from .launch import free_port

_HOP_HEADERS = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding", "keep-alive"}
_API_PREFIX = "/v1/"


@dataclass
class Reply:
    """An answer a fault gives instead of the server's."""

    status: int
    body: Any = None  # JSON-serializable, or str for text

    def payload(self) -> tuple[bytes, str]:
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain; charset=utf-8"
        return json.dumps(self.body if self.body is not None else {}).encode(), "application/json"


class KillServer(Exception):
    """Raised by a fault hook: the proxy stops, so the server looks dead (connections refused)."""


@dataclass
class Exchange:
    """One proxied request, as faults see it."""

    id: int
    method: str
    path: str
    body: Any
    in_flight: Callable[[], int]
    status: int | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.path.split("?")[0].endswith("/chat/completions")

    @property
    def is_api(self) -> bool:
        return self.path.startswith(_API_PREFIX)

    @property
    def params(self) -> dict[str, Any]:
        return self.body if isinstance(self.body, dict) else {}


class Fault:
    """No fault: every hook passes traffic through unchanged. Subclasses override what they need."""

    name: str = "none"
    catches: tuple[str, ...] = ()  # checks that must fail under this fault
    symptom: str = ""  # regular expression the failing check's result or evidence matches

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Set up per-proxy state (counters, locks); called by fresh()."""

    def fresh(self) -> "Fault":
        new = copy.copy(self)
        new.reset()
        return new

    def request(self, ex: Exchange) -> Reply | None:
        return None

    def response(self, ex: Exchange, body: Any) -> Any:
        return body

    def chunk(self, ex: Exchange, event: dict[str, Any]) -> list[dict[str, Any]]:
        return [event]

    def text(self, ex: Exchange, text: str) -> str:
        return text


class Chain(Fault):
    """Several faults (or adapters) in order: requests through each, responses and chunks back through each."""

    def __init__(self, *faults: Fault) -> None:
        self.faults = faults

    def reset(self) -> None:
        self.faults = tuple(f.fresh() for f in self.faults)

    def request(self, ex: Exchange) -> Reply | None:
        for f in self.faults:
            reply = f.request(ex)
            if reply is not None:
                return reply
        return None

    def response(self, ex: Exchange, body: Any) -> Any:
        for f in self.faults:
            body = f.response(ex, body)
        return body

    def chunk(self, ex: Exchange, event: dict[str, Any]) -> list[dict[str, Any]]:
        events = [event]
        for f in self.faults:
            events = [out for e in events for out in f.chunk(ex, e)]
        return events

    def text(self, ex: Exchange, text: str) -> str:
        for f in self.faults:
            text = f.text(ex, text)
        return text


# ---------------------------------------------------------------------------------------------------------------
# The named faults


def choices(body: Any) -> list[dict[str, Any]]:
    return [c for c in (body.get("choices") or []) if isinstance(c, dict)] if isinstance(body, dict) else []


def _corrupt(text: str) -> str:
    """Every digit one higher (9 -> 0), every word of four letters or more reversed: plausible but wrong."""
    shifted = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), text)
    return re.sub(r"[^\W\d_]{4,}", lambda m: m.group()[::-1], shifted)


class WrongAnswers(Fault):
    name = "wrong-answers"
    catches = ("known-answer",)
    symptom = r"wrong answer"

    def response(self, ex: Exchange, body: Any) -> Any:
        if ex.is_chat:
            for choice in choices(body):
                message = choice.get("message") or {}
                if message.get("content"):
                    message["content"] = _corrupt(message["content"])
        return body


class SwapConcurrent(Fault):
    """Answers crossed between requests in flight together, as when batch rows get mixed up."""

    name = "swap-concurrent"
    catches = ("known-answer-concurrent",)
    symptom = r"another prompt in flight"
    wait_s = 5.0

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, Any] | None = None

    def response(self, ex: Exchange, body: Any) -> Any:
        if not ex.is_chat or ex.status != 200 or ex.in_flight() < 2:
            return body
        with self._lock:
            partner = self._waiting
            if partner is not None:
                self._waiting = None
                partner["other"] = body["choices"]
                mine = partner["body"]["choices"]
                partner["done"].set()
                return {**body, "choices": mine}
            slot = {"body": body, "other": None, "done": threading.Event()}
            self._waiting = slot
        slot["done"].wait(self.wait_s)
        with self._lock:
            if self._waiting is slot:  # nobody came: answer unchanged
                self._waiting = None
        return {**body, "choices": slot["other"]} if slot["other"] is not None else body


class DropParam(Fault):
    """A request parameter silently dropped before the server sees it (the server then ignores it)."""

    def __init__(self, param: str, name: str, catches: tuple[str, ...], symptom: str) -> None:
        self.param, self.name, self.catches, self.symptom = param, name, catches, symptom

    def request(self, ex: Exchange) -> Reply | None:
        if ex.is_api:
            ex.params.pop(self.param, None)
        return None


class BatchedSamplingIgnored(Fault):
    """Sampling controls ignored for requests that share a batch, as with stale sampling rows after a reorder."""

    name = "batched-sampling-ignored"
    catches = ("sampling-concurrent",)
    symptom = r"with others in flight"
    params = ("logit_bias", "min_p", "min_tokens", "bad_words", "seed", "response_format")

    def request(self, ex: Exchange) -> Reply | None:
        if ex.is_chat and ex.in_flight() > 1:
            for name in self.params:
                ex.params.pop(name, None)
        return None


class ShortTopLogprobs(Fault):
    name = "short-top-logprobs"
    catches = ("top-logprobs",)
    symptom = r"19 entries"

    def response(self, ex: Exchange, body: Any) -> Any:
        for choice in choices(body):
            tokens = (choice.get("logprobs") or {}).get("content") or []
            if tokens and tokens[len(tokens) // 2].get("top_logprobs"):
                tokens[len(tokens) // 2]["top_logprobs"].pop()
        return body


class BrokenToolStream(Fault):
    """Streamed tool-call argument chunks lost: the first one ("broken": the JSON no longer parses) or all
    of them ("missing")."""

    name = "broken-tool-stream"
    catches = ("tool-call-streamed",)
    symptom = r"arguments"

    def __init__(self, mode: str = "broken") -> None:
        if mode not in ("broken", "missing"):
            raise ValueError(f"mode: 'broken' or 'missing', not {mode!r}")
        self.mode = mode

    def chunk(self, ex: Exchange, event: dict[str, Any]) -> list[dict[str, Any]]:
        for choice in choices(event):
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("arguments"):
                    seen = ex.state.get("argument_chunks", 0)
                    ex.state["argument_chunks"] = seen + 1
                    if self.mode == "missing" or seen == 0:
                        function["arguments"] = ""
        return [event]


class IgnoreToolResult(Fault):
    """The tool message never reaches the model."""

    name = "ignore-tool-result"
    catches = ("tool-result",)
    symptom = r"returned values"

    def request(self, ex: Exchange) -> Reply | None:
        if ex.is_chat and isinstance(ex.params.get("messages"), list):
            ex.params["messages"] = [m for m in ex.params["messages"] if m.get("role") != "tool"]
        return None


class NoToolCall(Fault):
    """The model's tool call is lost: plain text comes back instead."""

    name = "no-tool-call"
    catches = ("tool-call-auto",)
    symptom = r"no tool call"

    def response(self, ex: Exchange, body: Any) -> Any:
        for choice in choices(body):
            message = choice.get("message") or {}
            if message.get("tool_calls"):
                message["tool_calls"] = []
                message["content"] = "I cannot look up the weather."
                choice["finish_reason"] = "stop"
        return body

    def chunk(self, ex: Exchange, event: dict[str, Any]) -> list[dict[str, Any]]:
        for choice in choices(event):
            (choice.get("delta") or {}).pop("tool_calls", None)
        return [event]


class PromptLogprobs500(Fault):
    """The first prompt_logprobs request kills the engine: HTTP 500, then /health 503 and every request 500."""

    name = "prompt-logprobs-500"
    catches = ("prompt-logprobs",)
    symptom = r"HTTP 500.*unhealthy"

    def reset(self) -> None:
        self.dead = False

    def request(self, ex: Exchange) -> Reply | None:
        if ex.params.get("prompt_logprobs") is not None:
            self.dead = True
        if not self.dead:
            return None
        if ex.path.startswith("/health"):
            return Reply(503, "")
        return Reply(500, {"error": {"message": "EngineCore encountered an issue. See stack trace for the root cause.",
                                     "type": "InternalServerError", "code": 500}})


class Restart(Fault):
    """The server restarted during the run: /metrics reports a later process start time after its first answer."""

    name = "restart"
    catches = ("server-health",)
    symptom = r"restart"

    def reset(self) -> None:
        self._lock = threading.Lock()
        self.metrics_seen = 0

    def text(self, ex: Exchange, text: str) -> str:
        if not ex.path.startswith("/metrics"):
            return text
        with self._lock:
            self.metrics_seen += 1
            if self.metrics_seen == 1:
                return text
        return re.sub(
            r"^(process_start_time_seconds(?:\{[^}]*\})?\s+)(\S+)",
            lambda m: f"{m.group(1)}{float(m.group(2)) + 120.0!r}",
            text,
            flags=re.M,
        )


class KillAfter(Fault):
    """The server dies after `after` API requests: the proxy stops listening and drops every connection."""

    name = "kill-server"
    symptom = r"server down"  # every check from the one that hit it on: not run

    def __init__(self, after: int = 10) -> None:
        self.after = after
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self.seen = 0

    def request(self, ex: Exchange) -> Reply | None:
        if ex.is_api:
            with self._lock:
                self.seen += 1
                if self.seen > self.after:
                    raise KillServer
        return None


class ForceToolChoice(Fault):
    """Not a fault, an adapter: `tool_choice: auto` becomes "required" and the request greedy. It lets a model that
    never calls under auto (SmolLM2-135M) show that the tool-call-auto check passes good calls and catches a lost
    one; greedy, because sampled at 0.6 the 135M model sometimes names another city (1 try in 5 in one CI run),
    and the proof is about the check, not about the model's sampling."""

    name = "force-tool-choice"

    def request(self, ex: Exchange) -> Reply | None:
        if ex.is_chat and ex.params.get("tools") and ex.params.get("tool_choice", "auto") == "auto":
            ex.params["tool_choice"] = "required"
            ex.params["temperature"] = 0
        return None


FAULTS: Mapping[str, Fault] = MappingProxyType({
    f.name: f
    for f in (
        WrongAnswers(),
        SwapConcurrent(),
        DropParam("logit_bias", "drop-logit-bias", ("logit-bias",), r"biased token"),
        DropParam("min_p", "drop-min-p", ("min-p",), r"not the most likely"),
        DropParam("min_tokens", "drop-min-tokens", ("min-tokens",), r"before min_tokens"),
        DropParam("bad_words", "drop-bad-words", ("bad-words",), r"banned word"),
        DropParam("response_format", "ignore-json-schema", ("json-schema",), r"not JSON|schema"),
        DropParam("seed", "ignore-seed", ("seed",), r"same seed"),
        BatchedSamplingIgnored(),
        ShortTopLogprobs(),
        BrokenToolStream(),
        IgnoreToolResult(),
        NoToolCall(),
        PromptLogprobs500(),
        Restart(),
        KillAfter(),
    )
})


def fault_table(*families: Mapping[str, Fault]) -> dict[str, Fault]:
    """A new table of the core faults plus `families` (e.g. `faults_longctx.LONG_CONTEXT_FAULTS`), the caller's own:
    the shared `FAULTS` never changes, so no test or run can leak a registration into another."""
    table = dict(FAULTS)
    for family in families:
        for name, fault in family.items():
            if table.get(name, fault) is not fault:
                raise CookbookError(f"fault {name!r} is defined twice")
            table[name] = fault
    return table


def make_fault(name: str, table: Mapping[str, Fault] = FAULTS) -> Fault:
    """A fresh instance of the named fault (its own state), looked up in `table` (the core faults by default)."""
    if name not in table:
        raise CookbookError(f"unknown fault {name!r} (known: {', '.join(table)})")
    return table[name].fresh()


# ---------------------------------------------------------------------------------------------------------------
# The proxy


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-request (its deadline ran out, a reset) has nothing to answer: no traceback in the run's
        output. Anything else is still printed."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FaultProxy:
    """A real HTTP proxy on 127.0.0.1 in front of `upstream_base_url`, injecting `fault` (a name or a Fault)."""

    def __init__(
        self, upstream_base_url: str, fault: Fault | str | None = None, port: int | None = None, timeout_s: float = 120.0
    ) -> None:
        self.upstream = upstream_base_url.rstrip("/").removesuffix("/v1")
        self.fault: Fault = make_fault(fault) if isinstance(fault, str) else (fault or Fault())
        self.port = port or free_port()
        self.timeout_s = timeout_s
        self.requests = 0  # every request the proxy received
        self._lock = threading.Lock()
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx2.Client | None = None
        self.killed = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self._client = httpx2.Client(base_url=self.upstream, timeout=self.timeout_s)
        self._server = _Server(("127.0.0.1", self.port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"faultproxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection; later connections are refused."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close(self) -> None:
        self.stop()
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- used by the handler ---------------------------------------------------------------------------------------

    def _kill(self) -> None:
        """Called on a handler thread (never the serving one), so shutdown() cannot deadlock."""
        self.killed = True
        self.stop()

    def _in_flight_now(self) -> int:
        with self._lock:
            return self._in_flight


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection; a streamed body ends when the connection closes

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: tests read results, not logs
            return

        def setup(self) -> None:
            super().setup()
            with proxy._lock:
                proxy._connections.add(self.connection)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                with proxy._lock:
                    proxy._connections.discard(self.connection)

        def do_GET(self) -> None:
            self._proxy()

        def do_POST(self) -> None:
            self._proxy()

        def do_DELETE(self) -> None:
            self._proxy()

        def _proxy(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = None
            with proxy._lock:
                proxy.requests += 1
                ex = Exchange(proxy.requests, self.command, self.path, body, proxy._in_flight_now)
                if ex.is_api:
                    proxy._in_flight += 1
            try:
                self._handle(ex, raw)
            except KillServer:
                proxy._kill()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            except (OSError, httpx2.HTTPError):  # client gone, or upstream unreachable: the connection just drops
                self.close_connection = True
            except Exception as exc:  # a bug in a fault: say so instead of hanging the client
                self._send(502, json.dumps({"error": {"message": f"fault proxy: {exc!r}"}}).encode(), "application/json")
            finally:
                if ex.is_api:
                    with proxy._lock:
                        proxy._in_flight -= 1

        def _handle(self, ex: Exchange, raw: bytes) -> None:
            reply = proxy.fault.request(ex)
            if reply is not None:
                payload, content_type = reply.payload()
                self._send(reply.status, payload, content_type)
                return
            assert proxy._client is not None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            content = json.dumps(ex.body).encode() if ex.body is not None else raw
            request = proxy._client.build_request(self.command, self.path, headers=headers, content=content or None)
            upstream = proxy._client.send(request, stream=True)
            try:
                ex.status = upstream.status_code
                content_type = upstream.headers.get("content-type", "")
                if content_type.startswith("text/event-stream"):
                    self._stream(ex, upstream)
                    return
                out = upstream.read()
                if out and content_type.startswith("application/json"):
                    out = json.dumps(proxy.fault.response(ex, json.loads(out))).encode()
                elif out:
                    out = proxy.fault.text(ex, out.decode(errors="replace")).encode()
                self._send(upstream.status_code, out, content_type or "application/octet-stream")
            finally:
                upstream.close()

        def _send(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self, ex: Exchange, upstream: httpx2.Response) -> None:
            self.send_response(upstream.status_code)
            self.send_header("Content-Type", upstream.headers.get("content-type", "text/event-stream"))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            data_lines: list[str] = []
            for line in upstream.iter_lines():
                if line.startswith("data:"):
                    data_lines.append(line[5:].lstrip())
                    continue
                if line == "" and data_lines:
                    self._send_event(ex, "\n".join(data_lines))
                    data_lines = []
                elif line:
                    self.wfile.write(f"{line}\n".encode())
            if data_lines:
                self._send_event(ex, "\n".join(data_lines))

        def _send_event(self, ex: Exchange, data: str) -> None:
            try:
                event = json.loads(data)
            except ValueError:  # [DONE] and anything else that is not JSON pass through as they are
                events_out = [data]
            else:
                events_out = [json.dumps(e) for e in proxy.fault.chunk(ex, event)]
            for out in events_out:
                self.wfile.write(f"data: {out}\n\n".encode())
                self.wfile.flush()

    return Handler
