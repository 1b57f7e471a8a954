"""Benchmark figures: throughput and latency against concurrency, and the decode roofline.

Built with matplotlib's object API on the Agg canvas, so they render headless (CI, papermill) and still display in a
notebook when returned. Each builder returns the figure; `save` writes it as PNG.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .recipes import Recipe
from .roofline import HardwareFacts, RooflineRow, all_weight_bytes, bytes_per_step

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from .results import RunResults

_PERCENTILES = (("p50", "-"), ("p90", "--"), ("p99", ":"))


def _new_figure(width: float = 7.0, height: float = 4.2) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _levels_axis(axes: object, levels: list[int]) -> None:
    axes.set_xscale("log", base=2)  # type: ignore[attr-defined]
    axes.set_xticks(levels)  # type: ignore[attr-defined]
    axes.set_xticklabels([str(level) for level in levels])  # type: ignore[attr-defined]
    axes.set_xlabel("concurrent streams")  # type: ignore[attr-defined]
    axes.grid(True, which="both", alpha=0.3)  # type: ignore[attr-defined]


def throughput_figure(frame: "pd.DataFrame", title: str = "") -> "Figure":
    """Aggregate tokens/s (left axis) and per-stream tokens/s (right axis) against concurrency."""
    figure = _new_figure()
    axes = figure.subplots()
    levels = [int(s) for s in frame["streams"]]
    axes.plot(levels, frame["aggregate_tokens_per_s"], "o-", color="#1565c0", label="aggregate")
    axes.set_ylabel("aggregate tokens/s", color="#1565c0")
    axes.set_ylim(bottom=0)
    right = axes.twinx()
    right.plot(levels, frame["per_stream_tokens_per_s"], "s--", color="#ef6c00", label="per stream")
    right.set_ylabel("tokens/s per stream (end to end)", color="#ef6c00")
    right.set_ylim(bottom=0)
    _levels_axis(axes, levels)
    for level, value, failed in zip(levels, frame["aggregate_tokens_per_s"], frame.get("failed", [0] * len(levels))):
        if failed:
            axes.annotate(f"{int(failed)} failed", (level, value or 0), color="#c62828", fontsize=8)
    figure.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88))
    axes.set_title(title or "Throughput against concurrency")
    figure.tight_layout()
    return figure


def latency_figure(frame: "pd.DataFrame", title: str = "") -> "Figure":
    """TTFT (left) and TPOT and inter-token latency (right), p50 / p90 / p99, against concurrency."""
    figure = _new_figure(10.0, 4.2)
    first, second = figure.subplots(1, 2)
    levels = [int(s) for s in frame["streams"]]
    for stat, style in _PERCENTILES:
        first.plot(levels, frame[f"ttft_ms_{stat}"], f"o{style}", color="#6a1b9a", label=f"TTFT {stat}")
        second.plot(levels, frame[f"tpot_ms_{stat}"], f"o{style}", color="#2e7d32", label=f"TPOT {stat}")
        second.plot(levels, frame[f"itl_ms_{stat}"], f"x{style}", color="#9e9d24", label=f"ITL {stat}")
    first.set_ylabel("time to first token, ms")
    second.set_ylabel("ms per output token")
    for axes in (first, second):
        _levels_axis(axes, levels)
        axes.set_ylim(bottom=0)
        axes.legend(fontsize=8)
    figure.suptitle(title or "Latency percentiles against concurrency")
    figure.tight_layout()
    return figure


def roofline_figure(rows: list[RooflineRow], recipe: Recipe, facts: HardwareFacts | None = None, title: str = "") -> "Figure":
    """Decode tokens/s against batch: the bandwidth bound for the routed experts (and, for MoE, for reading every
    expert), with the measured figures as points."""
    figure = _new_figure()
    axes = figure.subplots()
    if not rows:
        axes.text(0.5, 0.5, "no roofline: hardware or decode figures unknown", ha="center", va="center", transform=axes.transAxes)
        return figure
    bandwidth = facts.bandwidth if facts is not None else rows[0].bound_steps_per_s * rows[0].bytes_per_step
    top = max(max(r.batch for r in rows), recipe.max_num_seqs)
    batches = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, top} & set(range(1, top + 1)) | {top})
    bound = [b * bandwidth / bytes_per_step(recipe.model, b) for b in batches]
    axes.plot(batches, bound, "-", color="#1565c0", label="bandwidth bound (routed experts)" if recipe.model.experts_total else "bandwidth bound")
    if recipe.model.experts_total:
        every = [b * bandwidth / all_weight_bytes(recipe.model) for b in batches]
        axes.plot(batches, every, "--", color="#90a4ae", label="if every expert were read each step")
    axes.plot([r.batch for r in rows], [r.measured_tokens_per_s for r in rows], "o", color="#c62828", label="measured")
    by_batch: dict[int, list[RooflineRow]] = {}
    for row in rows:
        by_batch.setdefault(row.batch, []).append(row)
    for batch, group in by_batch.items():  # one MBU label per batch (single-stream and sweep@1 share batch 1)
        low, high = min(r.mbu for r in group), max(r.mbu for r in group)
        label = f"MBU {low:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"MBU {low:.0%} to {high:.0%}"
        top_rate = max(r.measured_tokens_per_s for r in group)
        axes.annotate(label, (batch, top_rate), textcoords="offset points", xytext=(6, 4), fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("decode tokens/s (aggregate)")
    _levels_axis(axes, batches)
    axes.set_xlabel("batch (sequences decoded together)")
    axes.legend(fontsize=8)
    axes.set_title(title or f"Decode roofline: {recipe.model.id} on {rows[0].hardware}", fontsize=9)
    figure.tight_layout()
    return figure


def save(figure: "Figure", path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot_sweep(frame: "pd.DataFrame", out_dir: Path, title: str = "") -> dict[str, Path]:
    """throughput.png and latency.png of a sweep into `out_dir`; returns {name: path}."""
    out_dir = Path(out_dir)
    return {
        "throughput": save(throughput_figure(frame, title), out_dir / "throughput.png"),
        "latency": save(latency_figure(frame, title), out_dir / "latency.png"),
    }


def save_run_plots(results: "RunResults", recipe: Recipe | None, out_dir: Path) -> dict[str, Path]:
    """The figures a bench run has data for: throughput.png and latency.png (a sweep), roofline.png (a recipe and
    known hardware). Returns {name: path}, the names the reports put first."""
    from .bench import sweep_frame
    from .roofline import hardware_facts, roofline_rows

    paths: dict[str, Path] = {}
    title = f"{results.model} on {results.hardware.description}"
    frame = sweep_frame(results)
    if not frame.empty:
        paths.update(plot_sweep(frame, out_dir, title))
    if recipe is not None:
        rows = roofline_rows(recipe, results.performance, results.hardware)
        if rows:
            facts = hardware_facts(results.hardware, recipe)
            paths["roofline"] = save(roofline_figure(rows, recipe, facts), Path(out_dir) / "roofline.png")
    return paths
