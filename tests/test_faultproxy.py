"""The fault proxy's mechanics: pass-through, rewriting hooks, SSE event by event, per-request state, stopping.

The unit tests put the proxy in front of a small recording upstream (this file's `_Upstream`): it stands in for
the server only to show what the proxy forwards. What each fault does to the real checks is in test_checks.py.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest

from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.faultproxy import (
    FAULTS,
    BrokenToolStream,
    Chain,
    DropParam,
    Exchange,
    Fault,
    FaultProxy,
    ForceToolChoice,
    KillAfter,
    Reply,
    _corrupt,
    fault_table,
    make_fault,
)
from cookbook.launch import free_port

HOLD_S = 10.0  # how long the upstream holds a request for its partner or the client: only ever reached on a failure


class _Upstream:
    """Records every request; /v1/chat/completions answers with the request it saw (streamed: three events, with a
    tool call whose arguments come in three fragments).

    Two orderings are made by construction, never by sleeping: requests with `"together": true` are held until both
    are in the server at once (a barrier), and a `"lockstep": true` stream sends each event only once the client has
    read the one before (`client_read`), so a proxy that buffered the stream could not deliver it (`lockstep` records
    for each event whether the client had it before the next was sent)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.together = threading.Barrier(2, timeout=HOLD_S)
        self.client_read = threading.Event()
        self.lockstep: list[bool] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, b"# HELP x\nprocess_start_time_seconds 1000.5\nvllm:other 1\n", "text/plain")
                else:
                    self._send(200, b"", "application/json")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.seen.append(body)
                if body.get("together"):
                    upstream.together.wait()  # both requests are in flight at the proxy now
                if not body.get("stream"):
                    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": body.get("tag", "")}}]}
                    self._send(200, json.dumps(answer).encode(), "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for fragment in ['{"city"', ': "Par', 'is"}']:
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}
                    self.wfile.write(f"data: {json.dumps({'choices': [{'delta': delta}]})}\n\n".encode())
                    self.wfile.flush()
                    if body.get("lockstep"):
                        upstream.lockstep.append(upstream.client_read.wait(HOLD_S))
                        upstream.client_read.clear()
                self.wfile.write(b"data: [DONE]\n\n")

            def _send(self, status: int, payload: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[_Upstream]:
    server = _Upstream()
    yield server
    server.close()


def _chat(proxy: FaultProxy, **body: Any) -> httpx2.Response:
    return httpx2.post(f"{proxy.base_url}/v1/chat/completions", json={"model": "m", **body}, timeout=10)


def _events(proxy: FaultProxy, lockstep: _Upstream | None = None) -> list[str]:
    """The data of each streamed event, as the client receives them (`lockstep`: telling the upstream each one)."""
    out = []
    body = {"stream": True, "lockstep": lockstep is not None}
    with httpx2.stream("POST", f"{proxy.base_url}/v1/chat/completions", json=body, timeout=3 * HOLD_S) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                if lockstep is not None:
                    lockstep.client_read.set()
    return out


def test_passes_requests_and_responses_through_unchanged(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url) as proxy:
        response = _chat(proxy, tag="x", min_p=0.5)
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "x"
        assert upstream.seen[-1] == {"model": "m", "tag": "x", "min_p": 0.5}
        assert httpx2.get(f"{proxy.base_url}/health").status_code == 200
        assert "process_start_time_seconds 1000.5" in httpx2.get(f"{proxy.base_url}/metrics").text
        assert proxy.requests == 3


def test_streams_event_by_event(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url) as proxy:
        events = _events(proxy, lockstep=upstream)
    assert len(events) == 4 and events[-1] == "[DONE]"
    assert upstream.lockstep == [True, True, True], "the proxy buffered the stream instead of passing events on"


def test_drop_param_rewrites_the_request(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, "drop-min-p") as proxy:
        _chat(proxy, min_p=1.0, seed=3)
    assert upstream.seen[-1] == {"model": "m", "seed": 3}


def test_wrong_answers_rewrite_the_response(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, "wrong-answers") as proxy:
        assert _chat(proxy, tag="12 + 12 = 24, Paris").json()["choices"][0]["message"]["content"] == "23 + 23 = 35, siraP"


def test_corrupt_is_plausible_but_wrong() -> None:
    assert _corrupt("A week is 7 days.") == "A keew is 8 syad."
    assert _corrupt("9") == "0"


def test_a_fault_can_answer_instead_of_the_server(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, "prompt-logprobs-500") as proxy:
        assert _chat(proxy, tag="ok").status_code == 200
        assert httpx2.get(f"{proxy.base_url}/health").status_code == 200
        failed = _chat(proxy, prompt_logprobs=5)
        assert failed.status_code == 500 and "EngineCore" in failed.text
        assert httpx2.get(f"{proxy.base_url}/health").status_code == 503
        assert _chat(proxy, tag="after").status_code == 500
    assert all("prompt_logprobs" not in seen for seen in upstream.seen), "the failing request reached the server"


def test_restart_changes_the_start_time_after_the_first_metrics(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, "restart") as proxy:
        endpoint = Endpoint(proxy.base_url, "m")
        assert endpoint.process_start_time() == 1000.5
        assert endpoint.process_start_time() == 1120.5
        endpoint.close()


@pytest.mark.parametrize("mode, arguments", [("broken", ': "Paris"}'), ("missing", "")])
def test_broken_tool_stream_loses_argument_chunks(upstream: _Upstream, mode: str, arguments: str) -> None:
    with FaultProxy(upstream.url, BrokenToolStream(mode)) as proxy:
        events = [json.loads(data) for data in _events(proxy) if data != "[DONE]"]
    fragments = [e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for e in events]
    assert "".join(fragments) == arguments


def test_a_chunk_hook_can_drop_events(upstream: _Upstream) -> None:
    class DropAll(Fault):
        def chunk(self, ex: Exchange, event: dict[str, Any]) -> list[dict[str, Any]]:
            return []

    with FaultProxy(upstream.url, DropAll()) as proxy:
        assert _events(proxy) == ["[DONE]"]


def test_swap_concurrent_crosses_answers_only_with_others_in_flight(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, "swap-concurrent") as proxy:
        assert _chat(proxy, tag="alone").json()["choices"][0]["message"]["content"] == "alone"
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda tag: _chat(proxy, tag=tag, together=True).json(), ["a", "b"]))
    assert [a["choices"][0]["message"]["content"] for a in answers] == ["b", "a"]


def test_kill_refuses_every_later_connection(upstream: _Upstream) -> None:
    with FaultProxy(upstream.url, KillAfter(after=1)) as proxy:
        assert _chat(proxy, tag="1").status_code == 200
        with pytest.raises(httpx2.TransportError):
            _chat(proxy, tag="2")
        with pytest.raises(httpx2.ConnectError):
            httpx2.get(f"{proxy.base_url}/health", timeout=5)
        assert proxy.killed


def test_a_client_reset_mid_body_is_dropped_quietly(upstream: _Upstream, capfd: pytest.CaptureFixture[str]) -> None:
    """A client that resets its connection before its body arrives (a deadline ran out) leaves no traceback in the
    run's output, and the proxy serves the next request."""
    with FaultProxy(upstream.url) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        client.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: 1000\r\n\r\n{\"model\"")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        client.close()
        assert _chat(proxy).status_code == 200
        deadline = time.monotonic() + 5  # the reset connection's handler has ended once no connection is open
        while proxy._connections and time.monotonic() < deadline:
            time.sleep(0.02)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "ConnectionResetError" not in out + err, err


def test_chain_and_adapter(upstream: _Upstream) -> None:
    chain = Chain(ForceToolChoice(), DropParam("seed", "drop-seed", (), ""))
    with FaultProxy(upstream.url, chain) as proxy:
        _chat(proxy, tools=[{"type": "function"}], tool_choice="auto", seed=1)
    assert upstream.seen[-1] == {"model": "m", "tools": [{"type": "function"}], "tool_choice": "required", "temperature": 0}


def test_fault_hook_bug_answers_502(upstream: _Upstream) -> None:
    class Buggy(Fault):
        def request(self, ex: Exchange) -> Reply | None:
            raise RuntimeError("oops")

    with FaultProxy(upstream.url, Buggy()) as proxy:
        response = _chat(proxy)
    assert response.status_code == 502 and "oops" in response.text


def test_registry_names_and_fresh_state() -> None:
    assert all(name == f.name for name, f in FAULTS.items())
    first, second = make_fault("restart"), make_fault("restart")
    first.metrics_seen = 5  # type: ignore[attr-defined]
    assert second.metrics_seen == 0  # type: ignore[attr-defined]
    with pytest.raises(CookbookError, match="unknown fault"):
        make_fault("no-such-fault")


def test_the_shared_table_is_read_only_and_each_caller_builds_its_own() -> None:
    """No test can register a fault into the table the next test (or the fault matrix) reads."""
    from cookbook.faults_longctx import LONG_CONTEXT_FAULTS
    from cookbook.faults_oracle import ORACLE_FAULTS
    from cookbook.faults_states import STATE_FAULTS_BY_NAME

    names = list(FAULTS)
    for family in (FAULTS, LONG_CONTEXT_FAULTS, ORACLE_FAULTS, STATE_FAULTS_BY_NAME):
        with pytest.raises(TypeError):
            family["planted"] = Fault()  # type: ignore[index]
        with pytest.raises(AttributeError):
            family.clear()  # type: ignore[attr-defined]
    mine, theirs = fault_table(LONG_CONTEXT_FAULTS), fault_table(LONG_CONTEXT_FAULTS)
    assert mine == theirs and mine is not theirs
    mine["planted"] = Fault()
    assert "planted" not in theirs and "planted" not in FAULTS and list(FAULTS) == names
    assert set(LONG_CONTEXT_FAULTS) <= set(mine) and not set(LONG_CONTEXT_FAULTS) & set(FAULTS)
    assert type(make_fault("needle-lost-beyond", mine)) is type(LONG_CONTEXT_FAULTS["needle-lost-beyond"])
    with pytest.raises(CookbookError, match="unknown fault 'needle-lost-beyond'"):
        make_fault("needle-lost-beyond")  # the shared table never learned it
    with pytest.raises(CookbookError, match="'restart' is defined twice"):
        fault_table({"restart": make_fault("restart")})


@pytest.mark.integration
def test_real_server_stream_passes_through(cpu_server: Endpoint) -> None:
    body = {"model": cpu_server.model, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
            "temperature": 0, "stream": True}

    def chunks(base_url: str) -> list[str]:
        with httpx2.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            return [json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    for line in response.iter_lines() if line.startswith("data: {") and '"choices":[{' in line.replace(" ", "")]

    with FaultProxy(cpu_server.base_url) as proxy:
        assert "".join(chunks(proxy.base_url)) == "".join(chunks(cpu_server.base_url))
