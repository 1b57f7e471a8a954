"""Throughput and latency: the seeds' Performance table, the detail behind it, and a concurrency sweep.

Four parts: `client` (streamed requests timed like `vllm bench serve`, in concurrent batches, over the openai
client's aiohttp transport), `workloads` (what is sent: single stream, N streams, cold long prompts, the sweep),
`stats` (percentiles, summaries, outliers), `kvcache` (KV-cache usage sampled from /metrics during a run),
`figures` (the results file's Figure records and their wording; plots are cookbook.plots), and
`tables` (the text report and DataFrames for notebooks). Results are `Figure`s of the shared
`RunResults` (names stable: single-stream, n-streams, cold-prompt-<length>, sweep), each with the seeds' "measured
as" wording and the hardware that produced it.
"""
from __future__ import annotations

from .client import BatchResult, StreamRequest, StreamResult, run_batch
from .figures import MEASURED_AS, cold_figure, n_streams_figure, single_stream_figure, sweep_figure
from .kvcache import KV_USAGE_METRICS, KvSampler, KvTrace, kv_usage
from .stats import OUTLIER_RULE, Outliers, Summary, outliers, percentile, summarize
from .tables import detail_frame, format_report, sweep_frame
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
    "BatchResult", "BenchConfig", "KvSampler", "KvTrace", "Outliers", "Progress", "StreamRequest", "StreamResult", "Summary",
    "cold_figure", "detail_frame", "format_report", "kv_usage", "long_lengths", "n_streams_figure", "outliers", "percentile",
    "run_batch", "run_performance_table", "run_sweep", "short_prompts", "short_requests", "single_stream_figure",
    "summarize", "sweep_figure", "sweep_frame", "sweep_levels",
]
