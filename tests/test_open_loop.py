"""Unit tests of the open loop (the `rate` workload): arrivals, goodput and every figure by vllm bench serve's
definitions written out as formulas (its own functions live in the image, not in this venv), the datasets, the
wording, the report, the plot, the flags; a stand-in SSE server where requests must really be sent."""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cookbook import plots
from cookbook.bench import (
    BatchResult,
    BenchConfig,
    DatasetConfig,
    OpenLoopConfig,
    OpenLoopResult,
    StreamResult,
    arrival_offsets,
    dataset_requests,
    format_report,
    meets_objectives,
    open_loop_figure,
    open_loop_frame,
    parse_goodput,
    run_open_loop,
    run_performance_table,
)
from cookbook.bench.datasets import length_range
from cookbook.bench.open_loop import saturated
from cookbook.cli import main
from cookbook.cli.bench import _rates
from cookbook.compare import compare_runs, headline_metrics
from cookbook.endpoint import Endpoint
from cookbook.recipes import Recipe
from cookbook.errors import UsageError
from cookbook.results import Hardware, RunResults

from test_bench import fake_server  # noqa: F401  # the stand-in SSE server fixture

CPU = Hardware(kind="cpu", description="2 vCPU test box")


def _vllm_arrivals(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """vllm/benchmarks/serve.py get_request, as written there (0.32.0): np.random.seed(seed) in main_async, then a
    gamma gap per request of shape burstiness, scale 1 / (rate * burstiness), cumulated, rescaled to end at count / rate."""
    np.random.seed(seed)
    delays = []
    for _ in range(count):
        theta = 1.0 / (rate * burstiness)
        delays.append(np.random.gamma(shape=burstiness, scale=theta))
    for i in range(1, len(delays)):
        delays[i] += delays[i - 1]
    factor = (count / rate) / delays[-1]
    return [d * factor for d in delays]


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_arrivals_are_vllm_bench_serves_for_the_same_seed(burstiness: float) -> None:
    ours = arrival_offsets(50, 3.0, burstiness, seed=7)
    assert ours == pytest.approx(_vllm_arrivals(50, 3.0, burstiness, 7), rel=1e-12)
    assert ours[-1] == pytest.approx(50 / 3.0)
    assert ours != arrival_offsets(50, 3.0, burstiness, seed=8)


def test_burstiness_shapes_the_gaps() -> None:
    """Gamma gaps of shape b have a coefficient of variation of 1 / sqrt(b): 1 for Poisson, 0 for constant."""
    def cv(b: float) -> float:
        offsets = arrival_offsets(4000, 10.0, b, seed=1)
        gaps = [b2 - a for a, b2 in zip([0.0, *offsets], offsets)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv(1.0) == pytest.approx(1.0, abs=0.06)
    assert cv(0.25) == pytest.approx(2.0, abs=0.15)
    assert cv(4.0) == pytest.approx(0.5, abs=0.04)
    assert arrival_offsets(4, 2.0, math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


def _result(sent: float, ttft: float, e2e: float, tokens: int, ok: bool = True) -> StreamResult:
    itl = [(e2e - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return StreamResult(ok=ok, error="" if ok else "boom", output_tokens=tokens if ok else 0, prompt_tokens=10,
                        cached_tokens=4, ttft_s=ttft, e2e_s=e2e, itl_s=itl, sent_at=100.0 + sent)


def _vllm_metrics(records: list[tuple[float, float, int, bool]], duration: float, slos: dict[str, float]) -> dict[str, float]:
    """vllm/benchmarks/serve.py calculate_metrics (0.32.0) on (ttft, latency, output_len, success) per request:
    throughputs over the run's duration, TPOT over requests of more than one token, a failed request 0 tokens,
    goodput counting a request when every objective s (ms) satisfies s >= its metric, TPOT 0 for one token."""
    done = [(t, lat, n) for t, lat, n, ok in records if ok]
    tpots = [(lat - t) / (n - 1) for t, lat, n in done if n > 1]
    all_tpots = [(lat - t) / (n - 1) if n > 1 else 0.0 for t, lat, n in done]
    per_request = {"ttft": [t for t, _, _ in done], "tpot": all_tpots, "e2el": [lat for _, lat, _ in done]}
    good = sum(all(slos[k] / 1000 >= per_request[k][i] for k in slos) for i in range(len(done)))
    return {"request_throughput": len(done) / duration, "output_throughput": sum(n for _, _, n in done) / duration,
            "request_goodput": good / duration, "mean_ttft_ms": float(np.mean([t for t, _, _ in done])) * 1000,
            "p99_ttft_ms": float(np.percentile([t for t, _, _ in done], 99)) * 1000,
            "mean_tpot_ms": float(np.mean(tpots)) * 1000, "p99_tpot_ms": float(np.percentile(tpots, 99)) * 1000}


def _run() -> OpenLoopResult:
    results = [_result(0.0, 0.10, 1.0, 10), _result(0.5, 0.30, 1.6, 10), _result(1.0, 0.05, 0.05, 1),
               _result(1.5, 0.2, 2.4, 21), _result(2.0, 0.1, 0.1, 0, ok=False)]
    return OpenLoopResult(rate=2.5, burstiness=1.0, results=results, scheduled_s=[0.0, 0.49, 0.98, 1.5, 2.0],
                          started_at=100.0, duration_s=4.0, client_cpu_s=0.2, slos={"ttft": 250, "tpot": 100})


def test_every_figure_is_vllm_bench_serves_definition() -> None:
    run = _run()
    m = run.metrics()
    records = [(r.ttft_s or 0.0, r.e2e_s or 0.0, r.output_tokens, r.ok) for r in run.results]
    vllm = _vllm_metrics(records, run.duration_s, run.slos)
    assert m["request_throughput"] == pytest.approx(vllm["request_throughput"], abs=1e-4)
    assert m["output_tokens_per_s"] == pytest.approx(vllm["output_throughput"], abs=0.01)
    assert m["request_goodput"] == pytest.approx(vllm["request_goodput"], abs=1e-4)
    assert m["ttft_ms_mean"] == pytest.approx(vllm["mean_ttft_ms"], abs=1e-3)
    assert m["ttft_ms_p99"] == pytest.approx(vllm["p99_ttft_ms"], abs=1e-3)
    assert m["tpot_ms_mean"] == pytest.approx(vllm["mean_tpot_ms"], abs=1e-3)
    assert m["tpot_ms_p99"] == pytest.approx(vllm["p99_tpot_ms"], abs=1e-3)
    # by hand: one misses TTFT (300 > 250 ms), one TPOT (110 > 100 ms), the one-token request meets TPOT as 0
    assert (m["completed"], m["failed"], m["good_requests"]) == (4, 1, 2)
    assert m["cached_prompt_fraction"] == pytest.approx(0.4)
    assert m["send_lag_ms_p50"] == pytest.approx(0.0) and m["send_lag_ms_max"] == pytest.approx(20.0)
    assert m["client_core_share"] == pytest.approx(0.05) and m["client_cpu_us_per_token"] == pytest.approx(4761.9)
    assert m["max_in_flight"] == 2


def test_the_closed_loop_aggregate_is_vllm_bench_serves_output_throughput() -> None:
    """The definitions the 2026-12-01 discrepancy asked about, pinned: both tools divide the completed requests'
    output tokens (usage.completion_tokens; a failed request counts 0) by the run's wall time (from just before the
    first send to the end of the last answer), with no warm-up inside it. If either side drifts (a duration from
    the first token, tokens counted from chunks, failed requests' tokens), this fails."""
    results = [_result(0.0, 0.2, 2.0, 64), _result(0.0, 0.25, 2.4, 64), _result(0.0, 0.3, 0.3, 0, ok=False)]
    batch = BatchResult(streams=3, results=results, wall_s=2.5)
    vllm = _vllm_metrics([(r.ttft_s or 0, r.e2e_s or 0, r.output_tokens, r.ok) for r in results], 2.5, {})
    assert batch.aggregate_tokens_per_s == pytest.approx(vllm["output_throughput"])
    assert batch.metrics()["ttft_ms_mean"] == pytest.approx(vllm["mean_ttft_ms"], abs=1e-3)
    assert batch.metrics()["tpot_ms_mean"] == pytest.approx(vllm["mean_tpot_ms"], abs=1e-3)


def test_goodput_objectives_follow_vllm_bench() -> None:
    one_token = StreamResult(ok=True, output_tokens=1, ttft_s=0.1, e2e_s=0.1)
    assert meets_objectives(one_token, {"tpot": 0})  # TPOT counts as 0 for one token
    at_bound = StreamResult(ok=True, output_tokens=3, ttft_s=0.5, e2e_s=0.7)
    assert meets_objectives(at_bound, {"ttft": 500, "tpot": 100, "e2el": 700})  # s >= r: the bound itself meets it
    assert not meets_objectives(at_bound, {"ttft": 499.9})
    assert not meets_objectives(StreamResult(ok=False, error="x"), {})
    assert parse_goodput(["ttft:500", "tpot:50.5", "e2el:2000"]) == {"ttft": 500, "tpot": 50.5, "e2el": 2000}
    for bad, said in (("ttft", "KEY:MS"), ("itl:5", "KEY:MS"), ("ttft:x", "needs a number"), ("tpot:-1", "non-negative")):
        with pytest.raises(UsageError, match=said):
            parse_goodput([bad])


def test_achieved_rate_follows_until_saturation() -> None:
    steady = OpenLoopResult(2.0, 1.0, [_result(i * 0.5, 0.1, 1.0, 8) for i in range(9)], [i * 0.5 for i in range(9)],
                            100.0, 5.0)
    assert steady.achieved_rate() == pytest.approx(2.0)
    assert not saturated(steady.metrics())
    # a server that finishes one request a second whatever is offered: each answer waits for the one before
    queued = OpenLoopResult(2.0, 1.0, [_result(i * 0.5, 0.1 + i * 0.5, 1.0 + i * 0.5, 8) for i in range(9)],
                            [i * 0.5 for i in range(9)], 100.0, 9.0)
    assert queued.achieved_rate() == pytest.approx(1.0)
    assert saturated(queued.metrics())


def test_random_lengths_spread_as_vllm_bench_draws_them() -> None:
    assert length_range(100, 0.25) == (75, 125) and length_range(32, 0.0) == (32, 32)
    config = DatasetConfig(input_len=40, output_len=20, range_ratio=0.5)
    requests = dataset_requests(200, config, seed=3, timeout_s=5)
    outputs = {r.max_tokens for r in requests}
    assert min(outputs) >= 10 and max(outputs) <= 30 and len(outputs) > 10
    words = [len(r.messages[0]["content"].split()) for r in requests]
    assert 19 <= min(words) and max(words) <= 59  # "i:" and length - 2 words
    assert requests == dataset_requests(200, config, seed=3, timeout_s=5)
    assert requests != dataset_requests(200, config, seed=4, timeout_s=5)


def test_shared_prefix_groups_share_a_long_prefix() -> None:
    config = DatasetConfig(name="shared-prefix", prefix_groups=3, prefix_len=200, input_len=10, output_len=8)
    requests = dataset_requests(12, config, seed=0, timeout_s=5)
    prefixes = [r.messages[0]["content"].split("\nQuestion")[0] for r in requests]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in set(prefixes))
    assert all(len(p.split()) >= 195 for p in prefixes)
    assert len({r.messages[0]["content"] for r in requests}) == 12  # each request its own suffix
    assert prefixes[:3] != sorted(prefixes[:3]) or len(set(prefixes[:4])) > 1  # interleaved, not one group at a time


def _sharegpt(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "share.json"
    path.write_text(json.dumps(data))
    return path


def test_a_sharegpt_file_gives_prompts_and_answer_lengths(tmp_path: Path) -> None:
    entries = [{"conversations": [{"from": "human", "value": f"question number {i} please answer"},
                                  {"from": "gpt", "value": " ".join(["word"] * (5 + i))}]} for i in range(5)]
    entries.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a b c d e"}]})
    config = DatasetConfig(name="sharegpt", path=_sharegpt(tmp_path, entries))
    requests = dataset_requests(8, config, seed=0, timeout_s=5, count_tokens=lambda text: len(text.split()))
    assert len(requests) == 8 and {r.max_tokens for r in requests} <= set(range(5, 10))
    assert all(r.messages[0]["content"] != "hi" for r in requests)  # 1 token: too short, skipped as vllm skips it
    fixed = dataset_requests(3, config.model_copy(update={"sharegpt_output_len": 7}), 0, 5, lambda t: len(t.split()))
    assert {r.max_tokens for r in fixed} == {7}


@pytest.mark.parametrize("content, said", [
    (None, "no such file"), ("{not json", "not JSON"), ('{"a": 1}', "expected a JSON list"),
    ('[{"conversations": [{"from": "human", "value": "x"}]}]', "no entry with two conversation turns"),
])
def test_a_bad_sharegpt_file_is_one_line_naming_it(tmp_path: Path, content: str | None, said: str) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=said) as error:
        dataset_requests(2, DatasetConfig(name="sharegpt", path=path), 0, 5, lambda t: 5)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_cli_refuses_a_bad_dataset_file_before_any_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing.json"
    code = main(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--workloads", "rate",
                 "--dataset", "sharegpt", "--dataset-path", str(missing)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(missing) in err[0] and "no such file" in err[0]
    code = main(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--workloads", "rate", "--goodput", "ttft=5"])
    assert code == 2 and "--goodput" in capsys.readouterr().err


def test_rates_flag() -> None:
    assert _rates("auto") is None and _rates("0.5,1,2") == [0.5, 1.0, 2.0]
    for bad in ("0,1", "1,x", "inf", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _rates(bad)


def _open_results(slos: dict[str, float] | None = None) -> RunResults:
    config = OpenLoopConfig(rates=[1.0, 2.0], requests=5, goodput=slos if slos is not None else {"ttft": 250, "tpot": 100})
    rows = []
    for rate in (1.0, 2.0):
        run = _run()
        run.rate = rate
        run.slos = config.goodput
        rows.append({**run.metrics(), "errors": "", "saturated": rate > 1})
    results = RunResults(recipe="r", model="m", hardware=CPU)
    results.performance.append(open_loop_figure(rows, config, CPU, "per-call"))
    return results


def test_the_figure_states_goodput_saturation_overhead_and_hardware() -> None:
    results = _open_results()
    figure = results.figure("open-loop")
    assert figure is not None
    assert figure.result == ("goodput 0.50 req/s at 1 req/s offered (TTFT <= 250 ms, TPOT <= 100 ms); "
                             "saturated at 2 req/s offered")
    assert "Poisson arrivals at 1, 2 req/s" in figure.label and "random prompts, 128 tokens in" in figure.label
    assert "2 vCPU test box" in figure.measured_as and "% of a core" in figure.measured_as
    assert figure.label.startswith("Open loop on 2 vCPU test box, ")  # the report's and page's row names the hardware
    assert figure.metrics["goodput_requests_per_s"] == 0.5 and figure.metrics["saturation_rate"] == 2.0
    assert figure.failed_requests == 2 and len(figure.details["rows"]) == 2
    text = format_report(results)
    assert "Open loop (" in text and "Goodput req/s" in text and "goodput objectives: ttft <= 250 ms" in text
    assert list(open_loop_frame(results)["offered_rate"]) == [1.0, 2.0]
    plain = _open_results({}).figure("open-loop")
    assert plain is not None and plain.result.startswith("1.00 req/s, ") and "goodput_requests_per_s" not in plain.metrics


def test_the_open_loop_plot_renders(tmp_path: Path) -> None:
    results = _open_results()
    builders = plots.bench_figures(results)
    assert "open_loop" in builders
    path = plots.save(builders["open_loop"](), tmp_path / "open_loop.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_treats_goodput_as_a_headline_and_a_drop_as_a_regression() -> None:
    assert headline_metrics("open-loop")[0] == "goodput_requests_per_s"
    a, b = _open_results(), _open_results()
    b.performance[0].metrics["goodput_requests_per_s"] = 0.25
    worse = [d for d in compare_runs(a, b).deltas if d.metric == "goodput_requests_per_s"]
    assert worse and worse[0].regression and worse[0].better == "higher"


def test_requests_leave_on_schedule_against_a_stand_in(fake_server: Endpoint) -> None:  # noqa: F811
    requests = dataset_requests(6, DatasetConfig(input_len=8, output_len=4), 0, 10)
    offsets = [0.0, 0.05, 0.1, 0.3, 0.31, 0.5]
    run_open_loop(fake_server, requests[:1], rate=1.0)  # the process's first request builds the client: not timed
    started = time.perf_counter()
    run = run_open_loop(fake_server, requests, rate=12.0, offsets=offsets, slos={"e2el": 5000})
    assert time.perf_counter() - started >= 0.5
    m = run.metrics()
    assert m["completed"] == 6 and m["generated_tokens"] == 24 and m["good_requests"] == 6
    sent = [r.sent_at - run.started_at for r in run.results if r.sent_at is not None]
    assert all(s >= o for s, o in zip(sent, offsets)) and m["send_lag_ms_max"] < 200
    assert run.duration_s >= max(s + (r.e2e_s or 0) for s, r in zip(sent, run.results))


def test_the_rate_workload_runs_in_the_bench(fake_server: Endpoint) -> None:  # noqa: F811
    config = BenchConfig(warmup=False, kv_sample_interval_s=0, open_loop=OpenLoopConfig(
        rates=[20.0, 40.0], requests=4, dataset=DatasetConfig(input_len=8, output_len=3), goodput={"ttft": 5000}))
    results = run_performance_table(fake_server, None, config, CPU, ["rate"])
    figure = results.figure("open-loop")
    assert figure is not None and [r["offered_rate"] for r in figure.details["rows"]] == [20.0, 40.0]
    assert figure.failed_requests == 0 and set(figure.details["samples"]) == {"20", "40"}
    assert isinstance(pd.DataFrame(figure.details["rows"]), pd.DataFrame)
    # the closed loop's discrepancy of 2026-12-01 was sampled against greedy work: every report says which it ran
    assert "greedy sampling, temperature 0" in results.performance_note and "--temperature 0" in results.performance_note


@pytest.mark.integration
def test_the_open_loop_on_the_real_cpu_server(cpu_server: Endpoint, cpu_recipe: Recipe) -> None:
    """A short open loop of shared-prefix requests on the real server: every request generates exactly what was
    asked, the server's prompt counts agree with the words sent, goodput and the achieved rate are measured, and
    requests after a group's first are served from the prefix cache under load."""
    dataset = DatasetConfig(name="shared-prefix", prefix_groups=2, prefix_len=300, input_len=8, output_len=8)
    config = BenchConfig(warmup=True, kv_sample_interval_s=0, open_loop=OpenLoopConfig(
        rates=[4.0], requests=8, dataset=dataset, goodput={"e2el": 60_000}))
    results = run_performance_table(cpu_server, cpu_recipe, config, workloads=["rate"])
    figure = results.figure("open-loop")
    assert figure is not None and figure.failed_requests == 0, figure and figure.details.get("errors")
    row = figure.details["rows"][0]
    assert row["completed"] == 8 and row["generated_tokens"] == 8 * 8
    assert row["good_requests"] == 8 and row["request_goodput"] == pytest.approx(8 / row["duration_s"], rel=1e-3)
    assert 8 * 300 <= row["prompt_tokens"] <= 8 * (300 + 8 + 80)  # words are tokens, plus the chat template
    assert row["cached_prompt_fraction"] > 0.3  # the prefix cache served the groups' shared prefix
    assert row["achieved_rate"] > 0 and row["client_core_share"] is not None
    assert "cpu" == results.hardware.kind and results.hardware.description in figure.measured_as
