"""The benchmark's figures as records of the results file (numbers, the seeds' wording, the hardware): no drawing
here (every plot is cookbook.plots)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .. import haystack
from ..results import Figure, Hardware
from .client import BatchResult, StreamResult
from .stats import _round

if TYPE_CHECKING:
    import pandas as pd

MEASURED_AS = "per-call, one server; times are end to end and include time to first token"



def _fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _fmt_seconds(value: float, scale: float | None = None) -> str:
    """Whole seconds from 10 s on, else tenths; `scale`: the value that decides the precision (a range's top)."""
    return f"{value:.0f}" if (value if scale is None else scale) >= 10 else f"{value:.1f}"


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
        "samples": batch.samples(),
        "outliers": batch.outlier_details(),
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
        result=f"{_fmt_rate(rate)} tokens/s" if rate is not None else "failed",
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
        measured_as=_measured_as("aggregate = output tokens (usage) of the completed streams over the wall time from "
                                 "just before the first send to the end of the last answer, as vllm bench serve's output "
                                 "throughput; per stream = mean of each stream's own rate", hardware),
        metrics=metrics,
        failed_requests=batch.failed,
        details=_batch_details(batch, hardware),
    )


def cold_figure(
    length: int, runs: list[tuple[float, StreamResult, dict[str, Any]]], answer_tokens: int, hardware: Hardware,
    warmup_s: float | None, measured_by: str = "",
) -> Figure:
    """One cold-prompt length: every depth's request, time to the (fixed-length) answer as a value or a range.
    `measured_by`: the runs are another check's requests of the same run (`bench.measured`), answers of their own
    length and not streamed, which the figure says."""
    ok = [r for _, r, _ in runs if r.ok and r.e2e_s is not None]
    seconds = [r.e2e_s for r in ok if r.e2e_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if seconds:
        low, high = min(seconds), max(seconds)
        low_shown = _fmt_seconds(low, high)  # both ends at one precision: never "10.0 to 10 s"
        shown = low_shown if low_shown == _fmt_seconds(high) else f"{low_shown} to {_fmt_seconds(high)}"
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
    if measured_by:
        details["measured_by"] = measured_by
    return Figure(
        name=f"cold-prompt-{haystack.format_tokens(length)}",
        label=f"Cold prompt of {haystack.format_tokens(length)} tokens (needle)",
        result=result,
        measured_as=_measured_as(_cold_measured_as(length, runs, answer_tokens, measured_by), hardware),
        metrics=metrics,
        failed_requests=len(runs) - len(ok),
        details=details,
    )


def _cold_measured_as(length: int, runs: list[tuple[float, StreamResult, dict[str, Any]]], answer_tokens: int,
                      measured_by: str) -> str:
    if not measured_by:
        return (f"cold: a fresh cache_salt per request; the prompt is exactly {length:,} tokens by /tokenize; "
                f"the answer is {answer_tokens} tokens")
    sizes = sorted({r.output_tokens for _, r, _ in runs if r.ok})
    answer = (f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}") if sizes else "no"
    return (f"cold: the requests of {measured_by} (a fresh cache_salt each; the prompt is exactly {length:,} tokens "
            f"by /tokenize), not streamed: time to the whole answer of {answer} tokens, no time to first token")


def sweep_figure(frame: "pd.DataFrame", hardware: Hardware, samples: dict[str, Any] | None = None) -> Figure:
    """The sweep as one figure: the aggregate at each level in the result, every row in details['rows'], each
    level's per-request samples (and their outliers) in details['samples'] by stream count."""
    rows: list[dict[str, Any]] = [
        {str(k): (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        for row in frame.to_dict("records")
    ]
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
        details={"hardware": hardware.model_dump(), "rows": rows, **({"samples": samples} if samples else {})},
    )
