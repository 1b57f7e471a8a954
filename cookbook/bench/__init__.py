"""Throughput and latency: the seeds' Performance table, the detail behind it, and a concurrency sweep.

Four parts: `client` (streamed requests timed like `vllm bench serve`, in concurrent batches, over the openai
client's aiohttp transport), `workloads` (what is sent: single stream, N streams, cold long prompts, the sweep),
`stats` (percentiles, summaries, outliers), `kvcache` (KV-cache usage sampled from /metrics during a run),
`figures` (the results file's Figure records and their wording; plots are cookbook.plots), `measured` (the cold
prompts a needle check of the same run already sent to the same server, read instead of sent twice), and
`open_loop` and `datasets` (the `rate` workload: requests sent at a rate, Poisson or gamma arrivals, from random,
shared-prefix or ShareGPT-shaped data, with goodput, as `vllm bench serve --request-rate`), `tables` (the text
report and DataFrames for notebooks). Results are `Figure`s of the shared
`RunResults` (names stable: single-stream, n-streams, cold-prompt-<length>, sweep), each with the seeds' "measured
as" wording and the hardware that produced it.
"""
from __future__ import annotations

from .client import BatchResult, StreamRequest, StreamResult, run_batch
from .figures import MEASURED_AS, cold_figure, n_streams_figure, single_stream_figure, sweep_figure
from .kvcache import KV_USAGE_METRICS, KvSampler, KvTrace, kv_usage
from .measured import MeasuredCold, needle_cold_runs
from .stats import OUTLIER_RULE, Outliers, Summary, outliers, percentile, summarize
from .datasets import DATASETS, DatasetConfig, dataset_requests
from .open_loop import (
    OpenLoopConfig,
    OpenLoopResult,
    arrival_offsets,
    meets_objectives,
    open_loop_figure,
    parse_goodput,
    run_open_loop,
    run_rate_sweep,
)
from .tables import detail_frame, format_report, open_loop_frame, sweep_frame
from .workloads import (
    SEED_LONG_FRACTIONS,
    SHORT_TOPICS,
    TABLE,
    WORKLOADS,
    BenchConfig,
    Progress,
    long_lengths,
    run_performance_table,
    run_sweep,
    short_prompts,
    short_requests,
    sweep_levels,
)

__all__ = [
    "KV_USAGE_METRICS", "MEASURED_AS", "OUTLIER_RULE", "SEED_LONG_FRACTIONS", "SHORT_TOPICS", "TABLE", "WORKLOADS",
    "DATASETS", "BatchResult", "MeasuredCold", "needle_cold_runs", "BenchConfig", "DatasetConfig", "OpenLoopConfig", "OpenLoopResult",
    "arrival_offsets", "dataset_requests", "meets_objectives", "open_loop_figure", "open_loop_frame", "parse_goodput",
    "run_open_loop", "run_rate_sweep", "KvSampler", "KvTrace", "Outliers", "Progress", "StreamRequest", "StreamResult", "Summary",
    "cold_figure", "detail_frame", "format_report", "kv_usage", "long_lengths", "n_streams_figure", "outliers", "percentile",
    "run_batch", "run_performance_table", "run_sweep", "short_prompts", "short_requests", "single_stream_figure",
    "summarize", "sweep_figure", "sweep_frame", "sweep_levels",
]
