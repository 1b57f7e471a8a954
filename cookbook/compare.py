"""Runs side by side: checks that changed status, performance deltas, regressions beyond a threshold; and more
than two runs as a trend of the headline figures, each run against its baseline (the previous run, or the first).

A run is a run folder (its results.json) or a results file, measured or published. Which way is better is read from
the metric's name: throughput (`..._per_s`) up, times (`seconds...`, `ttft...`, `..._s`, `..._ms`) down; other
metrics are shown without a verdict. Runs from different hardware are compared, but the comparison says so.
The comparison's figure is drawn by `cookbook.plots.comparison_figure`, the trend's by `cookbook.plots.trend_figure`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Sequence

from pydantic import BaseModel, Field

from .results import ACCEPTED_STATUSES, RunResults, read_results

DEFAULT_THRESHOLD = 0.05
Direction = Literal["higher", "lower"]


def load_run(path: Path) -> RunResults:
    """A run folder (its results.json) or a results file."""
    path = Path(path)
    return read_results(path / "results.json" if path.is_dir() else path)


def better_direction(metric: str) -> Direction | None:
    """Which way is better for a metric, from its name (None: no verdict, e.g. a count)."""
    name = metric.lower()
    if name.endswith("_per_s") or "tokens_per" in name or "throughput" in name or "goodput" in name or name.endswith("mbu"):
        return "higher"
    if name.startswith(("seconds", "ttft", "tpot", "itl", "latency", "e2e")) or name.endswith(("_s", "_ms", "_seconds")):
        return "lower"
    return None


def is_regression(change: float | None, better: Direction | None, threshold: float) -> bool:
    """Worse by more than `threshold` (a fraction) in the metric's better direction."""
    return change is not None and better is not None and (change < -threshold if better == "higher" else change > threshold)


class StatusChange(BaseModel):
    name: str
    label: str
    before: str = Field(description="Status in run A ('absent' if A has no such check)")
    after: str = Field(description="Status in run B ('absent' if B has no such check)")
    result_before: str = ""
    result_after: str = ""

    @property
    def worse(self) -> bool:
        return self.before in ACCEPTED_STATUSES and self.after not in ACCEPTED_STATUSES and self.after != "absent"


class Delta(BaseModel):
    figure: str
    label: str
    metric: str
    before: float
    after: float
    change: float | None = Field(description="(after - before) / before; None when before is 0")
    better: Direction | None
    regression: bool = Field(description="Worse than the threshold in the metric's better direction")


class Comparison(BaseModel):
    run_a: str
    run_b: str
    hardware_a: str
    hardware_b: str
    threshold: float
    status_changes: list[StatusChange]
    deltas: list[Delta]

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.regression]

    @property
    def newly_failing(self) -> list[StatusChange]:
        return [c for c in self.status_changes if c.worse]

    @property
    def same_hardware(self) -> bool:
        return self.hardware_a == self.hardware_b

    @property
    def ok(self) -> bool:
        return not self.regressions and not self.newly_failing


def compare_runs(a: RunResults, b: RunResults, threshold: float = DEFAULT_THRESHOLD, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Status changes by check name, relative deltas by figure and metric, regressions beyond `threshold`."""
    checks_a = {c.name: c for c in a.checks}
    checks_b = {c.name: c for c in b.checks}
    changes = []
    for name in list(dict.fromkeys([*checks_a, *checks_b])):
        ca, cb = checks_a.get(name), checks_b.get(name)
        before, after = (ca.status if ca else "absent"), (cb.status if cb else "absent")
        if before != after:
            changes.append(StatusChange(name=name, label=(cb or ca).label, before=before, after=after,  # type: ignore[union-attr]
                                        result_before=ca.result if ca else "", result_after=cb.result if cb else ""))
    deltas = []
    figures_b = {f.name: f for f in b.performance}
    for fa in a.performance:
        fb = figures_b.get(fa.name)
        if fb is None:
            continue
        for metric, va in fa.metrics.items():
            vb = fb.metrics.get(metric)
            if va is None or vb is None:
                continue
            better = better_direction(metric)
            if not (math.isfinite(va) and math.isfinite(vb)):
                # NaN or infinity is a broken measurement, never "no change": counted as a regression
                deltas.append(Delta(figure=fa.name, label=fb.label, metric=metric, before=va, after=vb, change=None,
                                    better=better, regression=True))
                continue
            change = (vb - va) / va if va else None
            if better is None and va == vb:
                continue  # an unchanged count (streams, tokens asked for) says nothing
            worse = is_regression(change, better, threshold)
            deltas.append(Delta(figure=fa.name, label=fb.label, metric=metric, before=va, after=vb, change=change,
                                better=better, regression=worse))
    return Comparison(
        run_a=names[0], run_b=names[1], hardware_a=f"{a.hardware.description} ({a.source})",
        hardware_b=f"{b.hardware.description} ({b.source})", threshold=threshold, status_changes=changes, deltas=deltas,
    )


def format_comparison(comparison: Comparison) -> str:
    """The comparison as plain text for a terminal (and the CI log)."""
    lines = [f"A: {comparison.run_a} on {comparison.hardware_a}", f"B: {comparison.run_b} on {comparison.hardware_b}"]
    if not comparison.same_hardware:
        lines.append("note: the runs come from different hardware; deltas compare machines, not builds")
    lines.append("")
    if comparison.status_changes:
        lines.append("Checks that changed status:")
        for c in comparison.status_changes:
            mark = "  WORSE" if c.worse else ""
            lines.append(f"  {c.name}: {c.before} -> {c.after}{mark}  ({c.result_before or '-'} -> {c.result_after or '-'})")
    else:
        lines.append("No check changed status.")
    lines.append("")
    if comparison.deltas:
        lines.append(f"Performance (regression: worse by more than {comparison.threshold:.0%}):")
        for d in comparison.deltas:
            change = "n/a" if d.change is None else f"{d.change:+.1%}"
            flag = "  REGRESSION" if d.regression else ""
            lines.append(f"  {d.figure} {d.metric}: {d.before:g} -> {d.after:g} ({change}){flag}")
    else:
        lines.append("No performance figure in common.")
    lines.append("")
    lines.append("ok: no regression, no newly failing check" if comparison.ok else
                 f"{len(comparison.regressions)} regressions, {len(comparison.newly_failing)} newly failing checks")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# More than two runs: a trend


# The headline metrics of each figure a trend follows: what the Performance table states (tokens/s, time to the
# answer) and the tail latencies where a stall shows first.
HEADLINE_METRICS: dict[str, tuple[str, ...]] = {
    "single-stream": ("tokens_per_s", "ttft_ms_p99", "itl_ms_p99"),
    "n-streams": ("aggregate_tokens_per_s", "per_stream_tokens_per_s", "ttft_ms_p99", "itl_ms_p99"),
    "cold-prompt-": ("seconds_to_answer_max",),
    "sweep": ("peak_aggregate_tokens_per_s",),
    "open-loop": ("goodput_requests_per_s", "peak_request_throughput", "peak_output_tokens_per_s"),
}
Baseline = Literal["previous", "first"]
Order = Literal["given", "date"]


def headline_metrics(figure: str) -> tuple[str, ...]:
    """The metrics a trend follows for a figure (cold prompts by their prefix); () for any other figure."""
    if figure in HEADLINE_METRICS:
        return HEADLINE_METRICS[figure]
    return HEADLINE_METRICS["cold-prompt-"] if figure.startswith("cold-prompt-") else ()


class TrendPoint(BaseModel):
    run: str = Field(description="The run's name as given (its folder or file)")
    value: float | None = Field(description="The metric in this run (None: the run has no such figure or metric)")
    change: float | None = Field(None, description="(value - baseline) / baseline; None for the first value or a baseline of 0")
    against: str | None = Field(None, description="The run this one is compared with (the previous run with a value, or the first)")
    regression: bool = Field(False, description="Worse than its baseline by more than the threshold, or not a finite number")


class TrendSeries(BaseModel):
    figure: str
    label: str
    metric: str
    better: Direction | None
    points: list[TrendPoint]


class TrendChecks(BaseModel):
    run: str
    newly_failing: list[StatusChange] = Field(description="Checks accepted in the previous run that are not in this one")


class Trend(BaseModel):
    runs: list[str] = Field(description="Run names in the trend's order")
    started_at: list[str]
    hardware: list[str]
    client_load: list[float | None] = Field(
        default_factory=list, description="Each run's highest client 1-minute load average (a busy shared machine explains a dip)")
    threshold: float
    baseline: Baseline
    series: list[TrendSeries]
    checks: list[TrendChecks]

    @property
    def regressions(self) -> list[tuple[TrendSeries, TrendPoint]]:
        return [(s, p) for s in self.series for p in s.points if p.regression]

    @property
    def latest_regressions(self) -> list[tuple[TrendSeries, TrendPoint]]:
        """Regressions of the last run: what a CI job over a history of runs fails on."""
        return [(s, p) for s, p in self.regressions if p.run == self.runs[-1]]

    @property
    def ok(self) -> bool:
        latest = next((c for c in self.checks if c.run == self.runs[-1]), None)
        return not self.latest_regressions and not (latest and latest.newly_failing)


def client_load(run: RunResults) -> float | None:
    """The highest 1-minute load average the client machine recorded over a run's figures (None: not recorded)."""
    loads = [f.details.get("client_load_average") for f in run.performance]
    loads += [row.get("client_load_average") for f in run.performance for row in f.details.get("rows", [])]
    found = [float(v) for v in loads if isinstance(v, (int, float)) and math.isfinite(v)]
    return max(found) if found else None


def _date_key(item: tuple[str, RunResults]) -> tuple[int, str]:
    return (0, item[1].started_at) if item[1].started_at else (1, "")


def trend_runs(runs: Sequence[RunResults], names: Sequence[str], threshold: float = DEFAULT_THRESHOLD,
               baseline: Baseline = "previous", order: Order = "given") -> Trend:
    """Each headline metric across the runs, each value against its baseline (the previous run that has the
    metric, or the first that has it), marked a regression when worse by more than `threshold`; checks newly
    failing against the previous run. `order`: as given, or by the runs' start time (runs without one last)."""
    items = list(zip(names, runs))
    if order == "date":
        items = sorted(items, key=_date_key)  # stable: runs of one date keep the given order
    labels: dict[tuple[str, str], str] = {}  # (figure, metric) -> label, in order of first appearance
    for _, run in items:
        for figure in run.performance:
            for metric in headline_metrics(figure.name):
                if metric in figure.metrics:
                    labels.setdefault((figure.name, metric), figure.label)
    series = []
    for (figure_name, metric), label in labels.items():
        better = better_direction(metric)
        points: list[TrendPoint] = []
        reference: TrendPoint | None = None
        for name, run in items:
            found = run.figure(figure_name)
            value = found.metrics.get(metric) if found is not None else None
            point = TrendPoint(run=name, value=value)
            if value is not None:
                if not math.isfinite(value):
                    point.regression = True  # a broken measurement, never "no change"
                elif reference is not None and reference.value is not None and math.isfinite(reference.value):
                    point.against = reference.run
                    point.change = (value - reference.value) / reference.value if reference.value else None
                    point.regression = is_regression(point.change, better, threshold)
                if reference is None or baseline == "previous":
                    reference = point
            points.append(point)
        series.append(TrendSeries(figure=figure_name, label=label, metric=metric, better=better, points=points))
    checks = [TrendChecks(run=items[i][0], newly_failing=compare_runs(items[i - 1][1], items[i][1], threshold).newly_failing)
              for i in range(1, len(items))]
    return Trend(runs=[n for n, _ in items], started_at=[r.started_at for _, r in items],
                 hardware=[f"{r.hardware.description} ({r.source})" for _, r in items],
                 client_load=[client_load(r) for _, r in items], threshold=threshold,
                 baseline=baseline, series=series, checks=checks)


def format_trend(trend: Trend) -> str:
    """The trend as plain text: the runs, then each headline metric run by run with its change and REGRESSION."""
    loads = trend.client_load or [None] * len(trend.runs)
    lines = [f"{i + 1}. {name} on {hardware}" + (f", {started}" if started else "")
             + (f", client load up to {load:g}" if load is not None else "")
             for i, (name, hardware, started, load) in enumerate(zip(trend.runs, trend.hardware, trend.started_at, loads))]
    if len(set(trend.hardware)) > 1:
        lines.append("note: the runs come from different hardware; changes compare machines, not builds")
    against = "the previous run" if trend.baseline == "previous" else "the first run"
    lines += ["", f"Headline figures (regression: worse than {against} by more than {trend.threshold:.0%}):"]
    for s in trend.series:
        cells = []
        for p in s.points:
            if p.value is None:
                cells.append("-")
                continue
            cell = f"{p.value:g}"
            if p.change is not None:
                cell += f" ({p.change:+.1%})"
            cells.append(cell + (" REGRESSION" if p.regression else ""))
        lines.append(f"  {s.figure} {s.metric}: " + " -> ".join(cells))
    if not trend.series:
        lines.append("  no headline figure in these runs")
    failing = [(c.run, f) for c in trend.checks for f in c.newly_failing]
    lines.append("")
    lines += [f"{run}: check {f.name}: {f.before} -> {f.after}  WORSE" for run, f in failing] or ["No check newly failing."]
    lines.append("")
    latest = len(trend.latest_regressions)
    lines.append(f"ok: the last run has no regression and no newly failing check ({len(trend.regressions)} regressions earlier)"
                 if trend.ok else f"the last run: {latest} regressions against {against}, or a newly failing check")
    return "\n".join(lines)
