"""Open-loop load: requests sent at a rate, whatever the server's answers do, as `vllm bench serve --request-rate`.

Arrivals are drawn as vllm bench serve draws them (`get_request` in vllm/benchmarks/serve.py): gaps from a gamma
distribution of shape `burstiness` and scale 1 / (rate x burstiness) (burstiness 1: a Poisson process; infinite: a
constant gap), from numpy's legacy generator seeded with `seed`, then scaled so that the last request leaves at
requests / rate. Each figure is vllm bench serve's (`calculate_metrics`): the duration runs from just before the
first send to the end of the last answer; request and output-token throughput are over that duration; goodput is
the requests that met every objective (TTFT, TPOT, end to end; a request of one token has TPOT 0) over it. Beside
them: the achieved rate (completions per second from the first completion to the last: it follows the offered
rate until the server saturates), and the client's own overhead at that rate (its CPU share of a core, and how
late each request left against its schedule).
"""
from __future__ import annotations

import asyncio
import gc
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from ..endpoint import Endpoint
from ..errors import CookbookError, ServerDown, UsageError
from ..progress import Progress, Task
from ..results import Figure, Hardware
from .client import StreamRequest, StreamResult, _client, _others_in_flight, _run, _stream_one
from .datasets import DatasetConfig, dataset_requests, describe
from .stats import _round, percentile, summarize

SLO_KEYS = ("ttft", "tpot", "e2el")  # vllm bench serve's --goodput keys, each in milliseconds
# The automatic sweep: from AUTO_START req/s, x AUTO_FACTOR per level, at most AUTO_LEVELS levels; it stops at the
# first level whose achieved rate falls more than FOLLOW_TOLERANCE below the offered one (saturated).
AUTO_START = 0.5
AUTO_FACTOR = 2.0
AUTO_LEVELS = 6
FOLLOW_TOLERANCE = 0.10


def parse_goodput(items: Iterable[str], flag: str = "--goodput") -> dict[str, float]:
    """`ttft:MS tpot:MS e2el:MS` (any of them) as vllm bench serve takes them; a bad item is one line naming it."""
    slos: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"{flag}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}, got {item!r}")
        try:
            ms = float(value)
        except ValueError:
            raise UsageError(f"{flag}: {key} needs a number of milliseconds, got {value!r}") from None
        if not (math.isfinite(ms) and ms >= 0):
            raise UsageError(f"{flag}: {key} must be a non-negative number of milliseconds, got {value!r}")
        slos[key] = ms
    return slos


class OpenLoopConfig(BaseModel):
    """The `rate` workload: which rates, how arrivals are drawn, what is sent, the objectives of goodput."""

    model_config = ConfigDict(extra="forbid")

    rates: list[float] | None = Field(None, description="Offered request rates (req/s) in order; None: the automatic sweep")
    requests: int = Field(32, gt=0, description="Requests sent at each rate")
    burstiness: float = Field(1.0, gt=0, description="Shape of the gamma arrivals: 1 Poisson, < 1 burstier, inf constant")
    seed: int = Field(0, description="Seed of the arrivals and of the random datasets")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    goodput: dict[str, float] = Field(default_factory=dict, description="Objectives in ms by key (ttft, tpot, e2el)")
    max_rate: float | None = Field(None, gt=0, description="The automatic sweep stops before exceeding this rate")


def arrival_offsets(count: int, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """Send times in seconds from the start, drawn as vllm bench serve's `get_request` draws them (see the module)."""
    import numpy as np

    if count <= 0 or not rate > 0:
        raise CookbookError(f"arrival_offsets: need requests > 0 and a positive rate, got {count}, {rate}")
    if math.isinf(rate):
        return [0.0] * count
    if math.isinf(burstiness):
        gaps = [1.0 / rate] * count
    else:
        generator = np.random.RandomState(seed)  # what np.random.seed(seed) then np.random.gamma use
        gaps = [float(generator.gamma(shape=burstiness, scale=1.0 / (rate * burstiness))) for _ in range(count)]
    offsets, total = [], 0.0
    for gap in gaps:
        total += gap
        offsets.append(total)
    scale = (count / rate) / offsets[-1] if offsets[-1] else 1.0
    return [o * scale for o in offsets]


def meets_objectives(result: StreamResult, slos: dict[str, float]) -> bool:
    """vllm bench serve's goodput test of one completed request: every objective (ms) met, TPOT 0 for one token."""
    if not result.ok or result.ttft_s is None or result.e2e_s is None:
        return False
    values = {"ttft": result.ttft_s, "tpot": result.tpot_s or 0.0, "e2el": result.e2e_s}
    return all(values[key] <= ms / 1e3 for key, ms in slos.items())


@dataclass
class OpenLoopResult:
    """One open-loop run at one offered rate: each request's result, its scheduled and actual send, the duration."""

    rate: float
    burstiness: float
    results: list[StreamResult]
    scheduled_s: list[float]  # each request's planned send, seconds from the start
    started_at: float  # perf_counter() just before the first send
    duration_s: float  # from just before the first send to the end of the last answer (vllm bench's duration)
    client_cpu_s: float = 0.0
    slos: dict[str, float] = field(default_factory=dict)
    other_requests_at_start: int | None = None
    load_average: float | None = None

    @property
    def ok(self) -> list[StreamResult]:
        return [r for r in self.results if r.ok]

    def send_lag_ms(self) -> list[float]:
        """How late each request reached the transport against its schedule: the client keeping up, or not."""
        return [max(0.0, (r.sent_at - self.started_at - s) * 1e3)
                for r, s in zip(self.results, self.scheduled_s) if r.sent_at is not None]

    def achieved_rate(self) -> float | None:
        """Completions per second from the first completion to the last: follows the offered rate until saturation."""
        ends = sorted(r.sent_at + r.e2e_s for r in self.ok if r.sent_at is not None and r.e2e_s is not None)
        return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and ends[-1] > ends[0] else None

    def max_in_flight(self) -> int:
        events = sorted([(r.sent_at, 1) for r in self.ok if r.sent_at is not None]
                        + [(r.sent_at + r.e2e_s, -1) for r in self.ok if r.sent_at is not None and r.e2e_s is not None])
        peak = now = 0
        for _, step in events:
            now += step
            peak = max(peak, now)
        return peak

    def metrics(self) -> dict[str, Any]:
        """vllm bench serve's figures for this run (same names where it has them), then achieved rate and overhead."""
        ok = self.ok
        output = sum(r.output_tokens for r in ok)
        prompt = sum(r.prompt_tokens or 0 for r in ok)
        cached = sum(r.cached_tokens or 0 for r in ok)
        duration = self.duration_s
        good = sum(meets_objectives(r, self.slos) for r in ok) if self.slos else None
        lags = self.send_lag_ms()
        values: dict[str, Any] = {
            "offered_rate": self.rate, "burstiness": None if math.isinf(self.burstiness) else self.burstiness,
            "requests": len(self.results), "completed": len(ok), "failed": len(self.results) - len(ok),
            "duration_s": _round(duration, 3),
            "request_throughput": _round(len(ok) / duration, 4) if duration > 0 else None,
            "achieved_rate": _round(self.achieved_rate(), 4),
            "output_tokens_per_s": _round(output / duration, 2) if duration > 0 else None,
            "total_tokens_per_s": _round((prompt + output) / duration, 2) if duration > 0 else None,
            "good_requests": good,
            "request_goodput": _round(good / duration, 4) if good is not None and duration > 0 else None,
            "generated_tokens": output, "prompt_tokens": prompt,
            "cached_prompt_fraction": _round(cached / prompt, 4) if prompt else None,
            "max_in_flight": self.max_in_flight(),
        }
        latency = {
            "ttft_ms": [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None],
            "tpot_ms": [t * 1e3 for r in ok if (t := r.tpot_s) is not None],
            "itl_ms": [x * 1e3 for r in ok for x in r.itl_s],
            "e2e_s": [r.e2e_s for r in ok if r.e2e_s is not None],
        }
        for name, samples in latency.items():
            summary = summarize(samples)
            for stat in ("mean", "p50", "p90", "p99"):
                values[f"{name}_{stat}"] = _round(getattr(summary, stat), 3)
        values["send_lag_ms_p50"] = _round(percentile(lags, 50), 3) if lags else None
        values["send_lag_ms_p99"] = _round(percentile(lags, 99), 3) if lags else None
        values["send_lag_ms_max"] = _round(max(lags), 3) if lags else None
        values["client_cpu_s"] = round(self.client_cpu_s, 4)
        values["client_core_share"] = _round(self.client_cpu_s / duration, 4) if duration > 0 else None
        values["client_cpu_us_per_token"] = _round(1e6 * self.client_cpu_s / output, 1) if output else None
        values["other_requests_at_start"] = self.other_requests_at_start
        values["client_load_average"] = self.load_average
        return values

    def samples(self) -> dict[str, list[Any]]:
        """Each completed request's own times (request order), with its send offset: the results file keeps them."""
        ok = self.ok
        return {
            "sent_s": [_round(r.sent_at - self.started_at, 4) if r.sent_at is not None else None for r in ok],
            "ttft_ms": [_round(r.ttft_s * 1e3, 3) if r.ttft_s is not None else None for r in ok],
            "e2e_s": [_round(r.e2e_s, 4) for r in ok],
            "output_tokens": [r.output_tokens for r in ok],
        }

    def errors(self) -> list[str]:
        return [r.error for r in self.results if not r.ok]


async def _open_loop(endpoint: Endpoint, requests: list[StreamRequest], offsets: list[float],
                     temperature: float) -> tuple[list[StreamResult], float, float, float]:
    client = _client(endpoint, len(requests))
    gc.collect()
    gc.freeze()  # as vllm bench does: no collector pauses over the long-lived objects while timing
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        tasks = []
        for request, offset in zip(requests, offsets):
            wait = started + offset - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(_stream_one(client, endpoint.model, request, temperature)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        gc.unfreeze()
        await client.close()
    return list(results), started, duration, cpu


def run_open_loop(endpoint: Endpoint, requests: list[StreamRequest], rate: float, burstiness: float = 1.0,
                  seed: int | None = 0, slos: dict[str, float] | None = None, temperature: float = 0.0,
                  offsets: list[float] | None = None) -> OpenLoopResult:
    """Send `requests` at `rate` req/s (gamma arrivals of `burstiness`, seeded; or at the given `offsets`), each
    as soon as its time comes whatever the answers before it do, and time them."""
    if not requests:
        raise CookbookError("run_open_loop: no requests")
    offsets = offsets if offsets is not None else arrival_offsets(len(requests), rate, burstiness, seed)
    before = _others_in_flight(endpoint)
    results, started, duration, cpu = _run(_open_loop(endpoint, requests, offsets, temperature))
    if not any(r.ok for r in results) and not endpoint.healthy():
        raise ServerDown(f"{endpoint.base_url}: the server stopped answering during the open loop")
    return OpenLoopResult(rate, burstiness, results, offsets, started, duration, cpu, dict(slos or {}), before,
                          round(os.getloadavg()[0], 2))


def saturated(row: dict[str, Any]) -> bool:
    """The achieved rate fell more than FOLLOW_TOLERANCE below the offered one (or half the requests failed)."""
    achieved, offered = row.get("achieved_rate"), row["offered_rate"]
    if row.get("failed", 0) * 2 > row.get("requests", 0):
        return True
    return achieved is None or achieved < (1 - FOLLOW_TOLERANCE) * offered


def run_rate_sweep(endpoint: Endpoint, config: OpenLoopConfig, temperature: float = 0.0, timeout_s: float = 300.0,
                   progress: Progress | None = None, rows: list[dict[str, Any]] | None = None,
                   samples: dict[str, Any] | None = None, max_model_len: int | None = None,
                   count_tokens: Callable[[str], int] | None = None) -> list[dict[str, Any]]:
    """The open loop at each rate (given, or AUTO_START x AUTO_FACTOR^k until saturated), one row per rate appended
    to `rows` as it ends (a later failure keeps them), each rate's per-request samples into `samples`."""
    rows = [] if rows is None else rows
    automatic = not config.rates
    planned = list(config.rates or [AUTO_START * AUTO_FACTOR ** k for k in range(AUTO_LEVELS)])
    if config.max_rate is not None:
        planned = [r for r in planned if r <= config.max_rate] or planned[:1]
    requests = dataset_requests(config.requests, config.dataset, config.seed, timeout_s, count_tokens, max_model_len)
    task = Task(progress, "rate", total=len(planned))
    for rate in planned:
        task.step(f"{rate:g} req/s offered, {config.requests} requests")
        run = run_open_loop(endpoint, requests, rate, config.burstiness, config.seed, config.goodput, temperature)
        row = {**run.metrics(), "errors": "; ".join(sorted(set(run.errors())))[:500]}
        row["saturated"] = saturated(row)
        rows.append(row)
        if samples is not None:
            samples[f"{rate:g}"] = run.samples()
        if automatic and row["saturated"]:
            break
    task.finish()
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def objectives_text(slos: dict[str, float]) -> str:
    names = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "end to end"}
    return ", ".join(f"{names[k]} <= {v:g} ms" for k, v in slos.items())


def arrivals_text(burstiness: float) -> str:
    if math.isinf(burstiness):
        return "constant-rate arrivals"
    return "Poisson arrivals" if burstiness == 1 else f"gamma arrivals (burstiness {burstiness:g})"


def open_loop_figure(rows: list[dict[str, Any]], config: OpenLoopConfig, hardware: Hardware, measured_as: str,
                     samples: dict[str, Any] | None = None) -> Figure:
    """The rate sweep as one figure: goodput (or throughput) at each offered rate in the result, the rate where the
    server saturated, every row in details['rows'], the client's overhead stated beside it."""
    rates = [r["offered_rate"] for r in rows]
    best = max(rows, key=lambda r: r.get("request_throughput") or 0)
    first_saturated = next((r["offered_rate"] for r in rows if r.get("saturated")), None)
    metrics: dict[str, float | int | None] = {
        "peak_request_throughput": best.get("request_throughput"),
        "peak_output_tokens_per_s": max((r.get("output_tokens_per_s") or 0 for r in rows), default=None),
        "saturation_rate": first_saturated,
        "client_core_share_max": max((r.get("client_core_share") or 0 for r in rows), default=None),
        "send_lag_ms_p99_max": max((r.get("send_lag_ms_p99") or 0 for r in rows), default=None),
    }
    saturation = (f"saturated at {first_saturated:g} req/s offered" if first_saturated is not None
                  else f"not saturated up to {rates[-1]:g} req/s")
    if config.goodput:
        good = max(rows, key=lambda r: r.get("request_goodput") or 0)
        metrics["goodput_requests_per_s"] = good.get("request_goodput")
        metrics["goodput_at_rate"] = good["offered_rate"]
        result = (f"goodput {_fmt(good.get('request_goodput'))} req/s at {good['offered_rate']:g} req/s offered "
                  f"({objectives_text(config.goodput)}); {saturation}")
    else:
        result = (f"{_fmt(best.get('request_throughput'))} req/s, {_fmt(best.get('output_tokens_per_s'), 1)} "
                  f"output tokens/s at {best['offered_rate']:g} req/s offered; {saturation}")
    share, lag = metrics["client_core_share_max"], metrics["send_lag_ms_p99_max"]
    overhead = (f"client overhead, the most over the rates: {_fmt(100 * share if share is not None else None, 1)} % of a "
                f"core, requests sent {_fmt(lag, 1)} ms late at p99")
    failed = sum(int(r.get("failed") or 0) for r in rows)
    details: dict[str, Any] = {
        "hardware": hardware.model_dump(), "rows": rows, "objectives_ms": config.goodput,
        "dataset": config.dataset.model_dump(mode="json"), "seed": config.seed, "requests_per_rate": config.requests,
        "client_overhead": overhead,
        "definitions": ("as vllm bench serve: duration from just before the first send to the end of the last "
                        "answer; throughputs and goodput over it; achieved rate = completions per second from the "
                        "first completion to the last; saturated = achieved more than "
                        f"{FOLLOW_TOLERANCE:.0%} below offered"),
    }
    if samples:
        details["samples"] = samples
    errors = [e for r in rows for e in (r.get("errors") or "").split("; ") if e]
    if errors:
        details["errors"] = errors
    return Figure(
        name="open-loop",
        label=(f"Open loop on {hardware.description}, {arrivals_text(config.burstiness)} at {', '.join(f'{r:g}' for r in rates)} req/s, "
               f"{config.requests} requests each, {describe(config.dataset)}"),
        result=result,
        measured_as=f"{measured_as}; {overhead}; on {hardware.description}",
        metrics=metrics,
        failed_requests=failed,
        details=details,
    )
