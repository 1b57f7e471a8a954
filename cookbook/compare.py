"""Two runs side by side: checks that changed status, performance deltas, regressions beyond a threshold.

A run is a run folder (its results.json) or a results file, measured or published. Which way is better is read from
the metric's name: throughput (`..._per_s`) up, times (`seconds...`, `ttft...`, `..._s`, `..._ms`) down; other
metrics are shown without a verdict. Runs from different hardware are compared, but the comparison says so.
The comparison's figure is drawn by `cookbook.plots.comparison_figure`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

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
    if name.endswith("_per_s") or "tokens_per" in name or "throughput" in name or name.endswith("mbu"):
        return "higher"
    if name.startswith(("seconds", "ttft", "tpot", "itl", "latency", "e2e")) or name.endswith(("_s", "_ms", "_seconds")):
        return "lower"
    return None


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
            worse = change is not None and better is not None and (
                change < -threshold if better == "higher" else change > threshold
            )
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
