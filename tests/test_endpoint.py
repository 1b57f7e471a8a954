"""cookbook/endpoint.py and the launcher's log parsing: /metrics and KV pool sizes; the one request path and its
one error mapping (an HTTP 500 is the same fail for a check, a haystack probe and bench)."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from cookbook import haystack
from cookbook.bench import run_batch, short_requests
from cookbook.checks import run_checks
from cookbook.checks.registry import CHECKS, CheckContext, CheckOutcome, CheckSpec
from cookbook.endpoint import (
    Deadline,
    Endpoint,
    kv_pool_from_metrics,
    metric_value,
    normalize_base_url,
    parse_metrics,
    request_failure,
    status_failure,
)
from cookbook.errors import ConnectionLost, RequestFailed, RequestRejected, RequestTimeout, ServerDown
from cookbook.launch import kv_pool_from_log

METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",kv_cache_size_tokens="93184",num_gpu_blocks="728"} 1.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1920.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 80.0
process_start_time_seconds 1.7646e+09
"""


def test_parse_metrics_and_values() -> None:
    metrics = parse_metrics(METRICS)
    assert metric_value(metrics, "vllm:prefix_cache_hits_total") == 2000.0
    assert metric_value(metrics, "vllm:prefix_cache_hits_total", engine="1") == 80.0
    assert metric_value(metrics, "process_start_time_seconds") == 1.7646e09
    assert metric_value(metrics, "nope") is None
    assert kv_pool_from_metrics(metrics) == 93184


def test_kv_pool_from_blocks_when_tokens_are_absent() -> None:
    metrics = parse_metrics('vllm:cache_config_info{block_size="128",num_gpu_blocks="10"} 1.0\n')
    assert kv_pool_from_metrics(metrics) == 1280


def test_kv_pool_from_log_lines() -> None:
    cpu = ["(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 93,184 tokens, Maximum concurrency"]
    gpu = ["INFO GPU KV cache size: 3,800,136 tokens, Maximum concurrency for 262,144 tokens per request: 14.50x"]
    gaudi = ["INFO hpu_worker.py: Usable num_blocks: 40603, actual allocated num_blocks: 40604"]
    assert kv_pool_from_log(cpu) == 93184
    assert kv_pool_from_log(gpu) == 3800136
    assert kv_pool_from_log(gaudi, block_size=128) == 40603 * 128
    assert kv_pool_from_log(gaudi) is None
    assert kv_pool_from_log(["nothing here"]) is None


def test_normalize_base_url() -> None:
    assert normalize_base_url("http://h:1/v1/") == "http://h:1"
    assert normalize_base_url("http://h:1") == "http://h:1"


# -- one request path, one error mapping ---------------------------------------------------------------------------


class _Answers500(BaseHTTPRequestHandler):
    """A server that is up (/health 200) but fails every API request with HTTP 500."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(500, b'{"error": {"message": "boom", "type": "InternalServerError", "code": 500}}')

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server_500() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers500)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_http_500_is_a_fail_in_a_check_a_haystack_probe_and_bench(server_500: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(ctx: CheckContext) -> CheckOutcome:  # a long-context probe's request, as the needle grid sends it
        haystack.ask(ctx.endpoint, {"messages": [{"role": "user", "content": "where is the needle?"}]}, 5.0)
        return CheckOutcome(True, "answered")

    monkeypatch.setitem(CHECKS, "test-probe-500", CheckSpec("test-probe-500", "probe", probe, "core", lambda _ctx: None))
    results = run_checks(CheckContext(Endpoint(server_500, "m"), request_timeout_s=5.0), ["known-answer", "test-probe-500"])
    check, probe_result = results.checks
    assert (check.status, probe_result.status) == ("fail", "fail")
    assert check.result == "HTTP 500" and "HTTP 500: " in probe_result.result and "boom" in probe_result.result
    assert not results.stopped  # the server is up: a failed request is not "server down"

    batch = run_batch(Endpoint(server_500, "m"), short_requests(2, 8, 5.0))
    assert batch.failed == 2 and all(e.startswith("HTTP 500: ") and "boom" in e for e in batch.errors())

    with pytest.raises(RequestFailed) as failed:  # the one mapping: the same class and words for every caller
        Endpoint(server_500, "m").chat({"messages": [{"role": "user", "content": "hi"}]}, 5.0)
    assert failed.value.status_code == 500 and str(failed.value).startswith("HTTP 500: ")
    assert isinstance(status_failure(404, "no"), RequestRejected) and isinstance(status_failure(503, ""), RequestFailed)
    assert not isinstance(status_failure(503, ""), RequestRejected)


def test_request_failure_maps_timeouts_and_lost_connections_once() -> None:
    assert isinstance(request_failure(httpx2.ReadTimeout("late"), timeout_s=2), RequestTimeout)
    assert str(request_failure(httpx2.ReadTimeout("late"), timeout_s=2)) == "no answer within 2 s"
    budget = Deadline(0, "the run's budget")
    assert str(request_failure(httpx2.ReadTimeout("late"), timeout_s=2, budget=budget)) == (
        "no answer before the run's budget of 0 s ran out")
    assert isinstance(request_failure(httpx2.ReadError("cut"), healthy=lambda: True), ConnectionLost)
    assert isinstance(request_failure(httpx2.ConnectError("refused"), healthy=lambda: False), ServerDown)
    assert str(request_failure(httpx2.ReadError("cut"), "http://h/v1/x")).startswith("http://h/v1/x: connection lost")


def test_an_endpoint_for_another_thread_keeps_the_server_and_credentials_with_a_client_of_its_own() -> None:
    endpoint = Endpoint("http://user:secret@127.0.0.1:9", "m", timeout_s=60.0)
    client = endpoint.http()
    twin = endpoint.for_another_thread(10.0)
    assert (twin.base_url, twin.model, twin._auth, twin.timeout_s) == (endpoint.base_url, "m", ("user", "secret"), 10.0)
    assert twin._http is None and twin.http() is not client and endpoint._http is client
    twin.close()
    assert endpoint.for_another_thread().timeout_s == 60.0
    endpoint.close()


class _SlowHealth(BaseHTTPRequestHandler):
    """/health answers 200 after `delay_s`: a live server starved of CPU."""

    delay_s = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        import time

        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_slow_health_is_not_a_server_down_and_a_refused_one_is_at_once() -> None:
    import socket
    import time

    handler = type("Slow", (_SlowHealth,), {"delay_s": 0.6})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "m")
        assert endpoint.healthy(timeout_s=0.2, slow_retry_s=5.0)  # late, not gone: one more, longer try
        assert not endpoint.healthy(timeout_s=0.2, slow_retry_s=0)  # a poller's single try: late is a no
        assert not endpoint.healthy(timeout_s=0.2, slow_retry_s=0.3)  # later than both tries: a no
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as sock:  # a port nobody listens on: refused, a no without waiting out the retry
        sock.bind(("127.0.0.1", 0))
        refused = Endpoint(f"http://127.0.0.1:{sock.getsockname()[1]}", "m")
    started = time.monotonic()
    assert not refused.healthy(timeout_s=2.0, slow_retry_s=30.0)
    assert time.monotonic() - started < 2.0
