"""Every figure the cookbook draws: throughput, latency and the decode roofline of a bench run; the needle grid, the
prefix-cache hit, time per check and the engine states of a verify run; the comparison of two runs, and the trend
of more than two.

The one module that imports matplotlib. Checks and benchmarks return data (results and their details); the figures
are drawn here from that data, so a figure always shows what the results file says. Each builder returns a Figure
on matplotlib's object API with the Agg canvas (no pyplot: it renders headless in CI and papermill and never touches
a notebook's or the CLI's backend); the caller saves it (`save`), the CLI into its output folder and a notebook
beside the executed notebook.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .recipes import Recipe
from .roofline import HardwareFacts, RooflineRow, all_weight_bytes, bytes_per_step

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from .checks.needles import NeedleGrid
    from .compare import Comparison, Delta, Trend
    from .results import CheckResult, RunResults

_PERCENTILES = (("p50", "-"), ("p90", "--"), ("p99", ":"))
FIGURE_FORMATS = (".png", ".svg", ".pdf")
# Check status -> bar colour: green pass, amber known limitation, grey skipped, blue inconclusive, red otherwise.
STATUS_COLOURS = {"pass": "#2e7d32", "known limitation": "#f9a825", "skipped": "#9e9e9e", "inconclusive": "#6a8caf"}
# Engine-state request verdict -> bar colour: green identical, amber a near-tie flip, red otherwise.
VERDICT_COLOURS = {"identical": "#2e7d32", "tie": "#f9a825", "baseline-off": "#f9a825"}
FAILED_COLOUR = "#c62828"


def _new_figure(width: float = 7.0, height: float = 4.2, dpi: float | None = None) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(figure)
    return figure


# ---------------------------------------------------------------------------------------------------------------
# Saving


def figure_path(path: Path) -> Path:
    """PATH itself when it has a known image suffix (png, svg, pdf), else PATH.png: the file `save` writes."""
    path = Path(path)
    return path if path.suffix.lower() in FIGURE_FORMATS else path.with_name(path.name + ".png")


def save(figure: "Figure", path: Path) -> Path:
    """Write the figure (its format from the suffix), creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Bench runs


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


# Per-request distributions: which figures carry samples, and how each group is labelled on the axis.
OUTLIER_COLOUR = FAILED_COLOUR


def _sample_groups(results: "RunResults") -> list[tuple[str, dict[str, Any]]]:
    """(label, samples) for every figure that kept per-request samples: single stream, N streams, each sweep level."""
    groups: list[tuple[str, dict[str, Any]]] = []
    for figure in results.performance:
        samples = figure.details.get("samples")
        if not samples:
            continue
        if figure.name == "sweep":
            for level in sorted(samples, key=int):
                groups.append((f"sweep\n{level} stream{'s' if int(level) > 1 else ''}", samples[level]))
        elif figure.name == "single-stream":
            groups.append(("single\nstream", samples))
        else:
            streams = figure.metrics.get("streams")
            groups.append((f"{streams} streams" if streams else figure.name, samples))
    return groups


def _distribution_panel(axes: Any, groups: list[tuple[str, list[float]]], unit: str) -> int:
    """Box (quartiles, p50), p99 tick, every sample as a jittered dot, outliers (stats.outliers) red and counted
    above each group; returns the outliers drawn."""
    import random

    from .bench.stats import outliers, percentile

    rng = random.Random(0)  # the same jitter every time: figures of one run compare pixel for pixel
    total = 0
    for position, (label, values) in enumerate(groups, start=1):
        if not values:
            axes.text(position, 0.5, "no samples", ha="center", fontsize=7, transform=axes.get_xaxis_transform())
            continue
        found = outliers(values)
        marked = set(found.indices)
        axes.boxplot([values], positions=[position], widths=0.5, showfliers=False, whis=(5, 95),
                     medianprops={"color": "#1565c0"}, boxprops={"color": "#546e7a"})
        normal = [v for i, v in enumerate(values) if i not in marked]
        far = [v for i, v in enumerate(values) if i in marked]
        size = 4 if len(values) > 300 else 10
        axes.scatter([position + rng.uniform(-0.18, 0.18) for _ in normal], normal, s=size, alpha=0.35, color="#455a64",
                     linewidths=0, zorder=3)
        if far:
            axes.scatter([position + rng.uniform(-0.18, 0.18) for _ in far], far, s=28, color=OUTLIER_COLOUR,
                         marker="D", zorder=4)
        p99 = percentile(values, 99)
        axes.hlines(p99, position - 0.3, position + 0.3, color="#6a1b9a", linestyle=":", linewidth=1.2, zorder=5)
        if found.fence is not None:
            axes.hlines(found.fence, position - 0.3, position + 0.3, color=OUTLIER_COLOUR, linestyle="--", linewidth=0.8)
        note = f"{found.count} outlier{'s' if found.count != 1 else ''}" if found.fence is not None else "too few"
        axes.annotate(f"n={len(values)}\n{note}", (position, 1.0), xycoords=("data", "axes fraction"),
                      textcoords="offset points", xytext=(0, 3), ha="center", va="bottom", fontsize=7,
                      color=OUTLIER_COLOUR if found.count else "#444444")
        total += found.count
    axes.set_xticks(range(1, len(groups) + 1), [label for label, _ in groups], fontsize=7)
    axes.set_xlim(0.4, len(groups) + 0.6)
    axes.set_ylabel(unit)
    axes.grid(True, axis="y", which="both", alpha=0.3)
    return total


def latency_distribution_figure(results: "RunResults", title: str = "") -> "Figure":
    """Per-request TTFT (left) and every inter-token gap (right) of each figure and sweep level: box from Q1 to Q3
    with the median, whiskers p5 to p95, the p99 dotted, each sample a dot; outliers (stats.OUTLIER_RULE: a
    recompile or a stall) red diamonds above the dashed fence, counted over each group. Warm-up is not included:
    its cost is the cold warm-up's own figure."""
    from matplotlib.lines import Line2D

    from .bench.stats import OUTLIER_RULE

    groups = _sample_groups(results)
    figure = _new_figure(max(9.0, 1.2 * len(groups) + 4), 4.6)
    left, right = figure.subplots(1, 2)
    ttft = [(label, [v for v in s.get("ttft_ms", []) if v is not None]) for label, s in groups]
    itl = [(label, [v for gaps in s.get("itl_ms", []) for v in gaps]) for label, s in groups]
    counts = (_distribution_panel(left, ttft, "time to first token, ms (per request)"),
              _distribution_panel(right, itl, "inter-token latency, ms (per token)"))
    if any(v > 0 for _, values in itl for v in values):
        right.set_yscale("log")  # a stall of 100x the median and the median itself on one axis
    left.set_title(f"TTFT: {counts[0]} outlier{'s' if counts[0] != 1 else ''}", fontsize=9, pad=24)
    zeros = sum(1 for _, values in itl for v in values if v <= 0)
    right.set_title(f"ITL: {counts[1]} outlier{'s' if counts[1] != 1 else ''}"
                    + (f"; {zeros} gap{'s' if zeros != 1 else ''} of 0 ms (tokens read together) below the log axis"
                       if zeros else ""),
                    fontsize=9, pad=24)
    if not groups:
        left.text(0.5, 0.5, "no per-request samples in these results", ha="center", va="center", transform=left.transAxes)
    handles = [Line2D([], [], color="#1565c0", label="median (box: Q1 to Q3, whiskers p5 to p95)"),
               Line2D([], [], color="#6a1b9a", linestyle=":", label="p99"),
               Line2D([], [], color=OUTLIER_COLOUR, linestyle="--", label="outlier fence"),
               Line2D([], [], color=OUTLIER_COLOUR, marker="D", linestyle="", label=f"outlier: {OUTLIER_RULE}")]
    figure.legend(handles=handles, loc="lower center", ncol=2, fontsize=7, frameon=False)
    from .compare import client_load

    load = client_load(results)
    figure.suptitle((title or f"Per-request latency: {results.model} on {results.hardware.description}")
                    + (f"\nthe client machine's 1-minute load average reached {load:g}: on a shared machine, "
                       "other processes' stalls show here too" if load is not None else ""), fontsize=9)
    figure.tight_layout(rect=(0, 0.09, 1, 1))
    return figure


def throughput_latency_figure(frame: "pd.DataFrame", title: str = "") -> "Figure":
    """The sweep as a throughput-latency curve: aggregate tokens/s against TTFT (left) and inter-token latency
    (right), p50 solid and p99 dashed, each point labelled with its stream count. Up and to the left is better; the
    knee is where more streams buy latency and no throughput."""
    figure = _new_figure(10.0, 4.4)
    panels = figure.subplots(1, 2)
    levels = [int(s) for s in frame["streams"]]
    rates = list(frame["aggregate_tokens_per_s"])
    for axes, metric, label, colour in ((panels[0], "ttft_ms", "time to first token, ms", "#6a1b9a"),
                                        (panels[1], "itl_ms", "inter-token latency, ms", "#2e7d32")):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            column = f"{metric}_{stat}"
            if column not in frame:
                continue
            xs = list(frame[column])
            axes.plot(xs, rates, style, color=colour, alpha=1.0 if stat == "p50" else 0.6, label=stat)
            for x, y, level in zip(xs, rates, levels):
                if x is not None and y is not None and x == x and y == y:  # NaN-safe: a failed level has no point
                    axes.annotate(f"{level}", (x, y), textcoords="offset points", xytext=(5, -10 if stat == "p99" else 4),
                                  fontsize=7, color=colour)
        axes.set_xlabel(f"{label} (labels: concurrent streams)")
        axes.set_ylabel("aggregate output tokens/s")
        finite = [x for stat in ("p50", "p99") for x in frame.get(f"{metric}_{stat}", []) if x is not None and x == x]
        axes.set_ylim(bottom=0, top=max([r for r in rates if r is not None and r == r and r > 0] or [1.0]) * 1.12)
        axes.set_xlim(left=0, right=max([x for x in finite if x > 0] or [1.0]) * 1.15)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="upper left")
    figure.suptitle(title or "Throughput against latency across the sweep", fontsize=9)
    figure.tight_layout()
    return figure


def open_loop_curve_figure(frame: "pd.DataFrame", title: str = "") -> "Figure":
    """The open loop against offered load: TTFT and TPOT (p50 solid, p99 dashed) on the left; achieved rate,
    request throughput and goodput on the right against the offered rate, with the line where achieved = offered.
    Where the achieved rate leaves that line the server has saturated; where goodput leaves it, the objectives fail."""
    figure = _new_figure(10.0, 4.4)
    latency, rate = figure.subplots(1, 2)
    offered = [float(x) for x in frame["offered_rate"]]
    twin = latency.twinx()
    for axes, metric, label, colour in ((latency, "ttft_ms", "TTFT", "#6a1b9a"), (twin, "tpot_ms", "TPOT", "#2e7d32")):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            column = f"{metric}_{stat}"
            if column in frame:
                axes.plot(offered, list(frame[column]), style, color=colour, alpha=1.0 if stat == "p50" else 0.6,
                          label=f"{label} {stat}")
    latency.set_xlabel("offered requests/s")
    latency.set_ylabel("time to first token, ms", color="#6a1b9a")
    twin.set_ylabel("time per output token, ms", color="#2e7d32")
    latency.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    handles = latency.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    latency.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    latency.grid(True, alpha=0.3)
    top = max(offered) * 1.1
    rate.plot([0, top], [0, top], ":", color="#9e9e9e", label="achieved = offered")
    for column, label, style, colour in (("achieved_rate", "achieved (completions/s)", "o-", "#1565c0"),
                                         ("request_throughput", "throughput (vllm bench's)", "^-", "#6a8caf"),
                                         ("request_goodput", "goodput", "s-", "#c62828")):
        values = list(frame[column]) if column in frame else []
        if any(v is not None and v == v for v in values):
            rate.plot(offered, values, style, color=colour, label=label)
    rate.set_xlabel("offered requests/s")
    rate.set_ylabel("requests/s")
    rate.set_xlim(0, top)
    rate.set_ylim(bottom=0)
    rate.grid(True, alpha=0.3)
    rate.legend(fontsize=7, loc="upper left")
    figure.suptitle(title or "Latency and goodput against offered load", fontsize=9)
    figure.tight_layout()
    return figure


def ttft_prompt_length_figure(results: "RunResults", title: str = "") -> "Figure":
    """TTFT of each cold prompt against its length (every needle depth a point), the cold warm-up (the first
    prefill, which may compile) marked apart, and a line through the origin at the measured prefill rate. A cold
    figure read from the needle check's requests (not streamed) has no TTFT: its points are the time to the whole
    answer, drawn apart and left out of the rate."""
    figure = _new_figure(7.0, 4.4)
    axes = figure.subplots()
    lengths: list[float] = []
    ttfts: list[float] = []
    answered: list[tuple[float, float]] = []  # (length, seconds to the whole answer) of requests not streamed
    failed: list[float] = []
    warmups: list[float] = []
    for fig in results.performance:
        if not fig.name.startswith("cold-prompt-"):
            continue
        for request in fig.details.get("requests", []):
            length = request.get("prompt_tokens") or fig.metrics.get("prompt_tokens")
            if length is None:
                continue
            if request.get("ttft_s") is not None:
                lengths.append(length)
                ttfts.append(request["ttft_s"])
            elif request.get("measured_by") and not request.get("error") and request.get("seconds_to_answer") is not None:
                answered.append((length, request["seconds_to_answer"]))
            elif length:
                failed.append(length)
        warm = fig.details.get("warmup_cold_prefill_s")
        warm_length = fig.metrics.get("prompt_tokens")
        if warm is not None and warm_length is not None:
            warmups.append(warm)
            axes.plot([warm_length], [warm], "^", color="#f9a825", markersize=9,
                      label="warm-up: first cold prefill (not counted)")
    if lengths:
        axes.plot(lengths, ttfts, "o", color="#1565c0", label="cold prompt (fresh cache_salt)")
        rate = sum(lengths) / sum(ttfts) if sum(ttfts) else None
        if rate:
            top = max(lengths)
            axes.plot([0, top], [0, top / rate], "-", color="#90a4ae", linewidth=1,
                      label=f"{rate:,.0f} prompt tokens/s (mean prefill rate)")
    if answered:
        axes.plot([a for a, _ in answered], [b for _, b in answered], "s", color="#6a1b9a", fillstyle="none",
                  label="cold prompt, time to the whole answer (the needle check's request, not streamed)")
    for length in failed:
        axes.axvline(length, color=FAILED_COLOUR, linestyle=":", linewidth=1)
    if failed:
        axes.plot([], [], ":", color=FAILED_COLOUR, label=f"{len(failed)} failed request(s)")
    if not lengths and not failed and not answered:
        axes.text(0.5, 0.5, "no cold prompts in these results", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlabel("prompt tokens")
    if not answered:
        axes.set_ylabel("time to first token, s")
    else:
        axes.set_ylabel("to the first token or the whole answer, s" if lengths else "time to the whole answer, s")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0, top=max([*ttfts, *warmups, *(b for _, b in answered), 0.001]) * 1.15)
    axes.grid(True, alpha=0.3)
    if lengths or failed or answered:
        axes.legend(fontsize=8, loc="lower right")
    what = "Time to the answer" if answered and not lengths else "TTFT"
    axes.set_title(title or f"{what} against prompt length (cold): {results.model} on {results.hardware.description}", fontsize=9)
    figure.tight_layout()
    return figure


_SPAN_COLOURS = ("#e3f2fd", "#fff3e0", "#e8f5e9", "#f3e5f5", "#fffde7", "#fce4ec")


def kv_cache_figure(results: "RunResults", title: str = "") -> "Figure":
    """KV-cache usage (% of the pool) over the run, sampled from /metrics, each workload's span shaded and named
    (warm-ups hatched); says which gauge was read, or that the server exposes none."""
    figure = _new_figure(10.0, 4.0)
    axes = figure.subplots()
    blocks = [f.details["kv_cache"] for f in results.performance if f.details.get("kv_cache")]
    metric = next((b.get("metric") for b in blocks if b.get("metric")), None)
    times: list[float] = []
    values: list[float] = []
    peak = 0.0
    for number, span in enumerate(s for b in blocks for s in b.get("spans", [])):
        warm = "warm-up" in span["name"]
        axes.axvspan(span["start_s"], span["end_s"], facecolor=_SPAN_COLOURS[number % len(_SPAN_COLOURS)], zorder=0,
                     hatch="//" if warm else None, edgecolor="#b0bec5" if warm else "none", linewidth=0)
        axes.annotate(span["name"], ((span["start_s"] + span["end_s"]) / 2, 1.0), xycoords=("data", "axes fraction"),
                      rotation=90, ha="center", va="top", fontsize=7, color="#555555", xytext=(0, -3),
                      textcoords="offset points")
    for block in blocks:
        for at, value in block.get("samples", []):
            times.append(at)
            values.append(100 * value)
    if times:
        axes.plot(times, values, ".-", color="#1565c0", markersize=3, linewidth=1)
        peak = max(values)
        axes.axhline(peak, color="#c62828", linestyle=":", linewidth=0.8)
        axes.annotate(f"peak {peak:.1f} %", (max(times), peak), textcoords="offset points", xytext=(-4, 3),
                      ha="right", fontsize=7, color="#c62828")
        axes.set_ylim(0, max(5.0, peak * 1.25))
    else:
        note = next((b.get("note") for b in blocks if b.get("note")), None)
        text = note or ("KV-cache usage not sampled in this run" if not blocks else "no samples")
        axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=8, wrap=True)
    pool = f", pool {results.kv_pool_tokens:,} tokens" if results.kv_pool_tokens else ""
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel(f"KV-cache usage, % ({metric or 'not exposed'})", fontsize=8)
    axes.grid(True, axis="y", alpha=0.3)
    axes.set_title(title or f"KV-cache usage over the run: {results.model} on {results.hardware.description}{pool}", fontsize=9)
    figure.tight_layout()
    return figure


def plot_sweep(frame: "pd.DataFrame", out_dir: Path, title: str = "") -> dict[str, Path]:
    """throughput.png and latency.png of a sweep into `out_dir`; returns {name: path}."""
    out_dir = Path(out_dir)
    return {
        "throughput": save(throughput_figure(frame, title), out_dir / "throughput.png"),
        "latency": save(latency_figure(frame, title), out_dir / "latency.png"),
    }


def bench_figures(results: "RunResults") -> dict[str, "Callable[[], Figure]"]:
    """The per-request and over-the-run figures a bench run has data for, by the names the reports know (each a
    builder, so that a caller draws only what it saves): latency_distribution (per-request samples),
    throughput_latency (a sweep), open_loop (the rate workload), ttft_prompt_length (cold prompts), kv_cache (a KV
    trace, or why there is none)."""
    from .bench import open_loop_frame, sweep_frame

    builders: dict[str, Callable[[], Figure]] = {}
    title = f"{results.model} on {results.hardware.description}"
    if _sample_groups(results):
        builders["latency_distribution"] = lambda: latency_distribution_figure(results)
    frame = sweep_frame(results)
    if not frame.empty:
        builders["throughput_latency"] = lambda: throughput_latency_figure(frame, f"Throughput against latency: {title}")
    open_loop = open_loop_frame(results)
    if not open_loop.empty:
        builders["open_loop"] = lambda: open_loop_curve_figure(open_loop, f"Latency and goodput against offered load: {title}")
    if any(f.name.startswith("cold-prompt-") for f in results.performance):
        builders["ttft_prompt_length"] = lambda: ttft_prompt_length_figure(results)
    if any(f.details.get("kv_cache") for f in results.performance):
        builders["kv_cache"] = lambda: kv_cache_figure(results)
    return builders


def save_run_plots(results: "RunResults", recipe: Recipe | None, out_dir: Path) -> dict[str, Path]:
    """The figures a bench run has data for: throughput.png and latency.png (a sweep), the `bench_figures`
    (latency_distribution, throughput_latency, ttft_prompt_length, kv_cache), roofline.png (a recipe and known
    hardware). Returns {name: path}, the names the reports put first."""
    from .bench import sweep_frame
    from .roofline import hardware_facts, roofline_rows

    paths: dict[str, Path] = {}
    title = f"{results.model} on {results.hardware.description}"
    frame = sweep_frame(results)
    if not frame.empty:
        paths.update(plot_sweep(frame, out_dir, title))
    paths.update({name: save(build(), Path(out_dir) / f"{name}.png") for name, build in bench_figures(results).items()})
    if recipe is not None:
        rows = roofline_rows(recipe, results.performance, results.hardware)
        if rows:
            facts = hardware_facts(results.hardware, recipe)
            paths["roofline"] = save(roofline_figure(rows, recipe, facts), Path(out_dir) / "roofline.png")
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Verify runs: drawn from the checks' results (their details), never by the checks themselves


def checks_figure(results: "RunResults") -> "Figure":
    """Time per check, coloured by status (green pass, amber known limitation, grey skipped, blue inconclusive, red otherwise)."""
    checks = list(reversed(results.checks))
    figure = _new_figure(7, 0.35 * len(checks) + 1.2)
    axes = figure.subplots()
    axes.barh([c.name for c in checks], [c.duration_s for c in checks],
              color=[STATUS_COLOURS.get(c.status, FAILED_COLOUR) for c in checks])
    axes.set_xlabel("seconds")
    axes.set_title(f"{results.recipe}: checks on {results.hardware.description}", fontsize=9)
    figure.tight_layout()
    return figure


def _cached_on_hit(cached_tokens: list[Any]) -> int:
    """The cached-token count of the last request (the hit); 0 when the server did not report one."""
    last = cached_tokens[-1] if cached_tokens else None
    return last if isinstance(last, int) and not isinstance(last, bool) and last >= 0 else 0


def prefix_cache_figure(check: "CheckResult | None") -> "Figure":
    """Left: prompt and cached tokens on the hit; right: max |logprob diff| of the hit against the allowed one."""
    prompts = (check.details.get("prompts") if check else None) or []
    figure = _new_figure(10, 3.6)
    left, right = figure.subplots(1, 2)
    labels = [str(p.get("prompt_tokens") or p["target_tokens"]) for p in prompts]
    left.bar(labels, [p.get("prompt_tokens") or p["target_tokens"] for p in prompts], color="#cfd8dc", label="prompt tokens")
    left.bar(labels, [_cached_on_hit(p["cached_tokens"]) for p in prompts], color="#1565c0", label="cached on the hit")
    left.set_xlabel("prompt (tokens)")
    left.set_ylabel("tokens")
    left.legend(fontsize=8)
    diffs = [p["comparison"]["max_logprob_diff"] for p in prompts]
    colours = ["#2e7d32" if p["comparison"]["text_identical"] else FAILED_COLOUR for p in prompts]
    right.bar(labels, [d if d is not None else 0.0 for d in diffs], color=colours)
    allowed = (check.details.get("max_logprob_diff_allowed") if check else None) or 0.0
    if allowed:
        right.axhline(allowed, color=FAILED_COLOUR, linestyle="--", linewidth=1, label=f"allowed {allowed:g}")
        right.legend(fontsize=8)
    right.set_xlabel("prompt (tokens)")
    right.set_ylabel("max |hit - cold| logprob (red: text differs)")
    status = f"{check.status}: {check.result}" if check else "not run"
    figure.suptitle(f"Prefix-cache hit vs cold: {status}", fontsize=9, wrap=True)
    if not prompts:
        left.text(0.5, 0.5, "no prompts in these results", ha="center", va="center", transform=left.transAxes)
    figure.tight_layout()
    return figure


NEEDLE_MISSED, NEEDLE_FOUND, NEEDLE_NOT_RUN, NEEDLE_MODEL_LIMIT = 0, 1, 2, 3  # the heatmap's cell values
_NEEDLE_COLOURS = ("#d9534f", "#5cb85c", "#dddddd", "#f0ad4e")
NEEDLE_TITLE = "Needle in a haystack (cold, exact match)"


def _needle_heatmap(grid: "NeedleGrid", title: str) -> "Figure":
    """Depth down, length across; each cell says found, missed, or a model limit (missed where the model's reference
    misses too: amber, not a fail) and its time to the answer."""
    from matplotlib.colors import ListedColormap

    from .haystack import format_tokens

    values = [[NEEDLE_NOT_RUN for _ in grid.lengths] for _ in grid.depths]
    labels = [["not run" for _ in grid.lengths] for _ in grid.depths]
    for row, depth in enumerate(grid.depths):
        for col, length in enumerate(grid.lengths):
            cell = grid.cell(length, depth)
            if cell is None:
                continue
            state = "found" if cell.found and cell.passed else ("model limit" if cell.passed else "missed")
            values[row][col] = {"found": NEEDLE_FOUND, "model limit": NEEDLE_MODEL_LIMIT}.get(state, NEEDLE_MISSED)
            labels[row][col] = f"{state}\n{cell.seconds:.1f} s"
    figure = _new_figure(1.6 + 1.5 * len(grid.lengths), 1.2 + 0.9 * len(grid.depths), dpi=120)
    axes = figure.add_subplot()
    axes.imshow(values, cmap=ListedColormap(list(_NEEDLE_COLOURS)), vmin=0, vmax=3, aspect="auto")
    columns = []
    for length in grid.lengths:
        prompts = [c.prompt_tokens for c in grid.cells if c.target_tokens == length]
        columns.append(format_tokens(prompts[0] if prompts else length))
    axes.set_xticks(range(len(grid.lengths)), columns)
    axes.set_yticks(range(len(grid.depths)), [f"{d:.0%}" for d in grid.depths])
    axes.set_xticks([c - 0.5 for c in range(1, len(grid.lengths))], minor=True)
    axes.set_yticks([r - 0.5 for r in range(1, len(grid.depths))], minor=True)
    axes.grid(which="minor", color="white", linewidth=2)
    axes.tick_params(which="minor", length=0)
    axes.set_xlabel("prompt length (tokens)")
    axes.set_ylabel("needle depth")
    for row in range(len(grid.depths)):
        for col in range(len(grid.lengths)):
            axes.text(col, row, labels[row][col], ha="center", va="center", fontsize=8, color="black")
    found = sum(c.found and c.passed for c in grid.cells)
    limits = sum(c.passed and not c.found for c in grid.cells)
    extra = f" ({limits} a model limit)" if limits else ""
    axes.set_title(f"{title}: {found}/{len(grid.cells)} found{extra}", fontsize=9)
    figure.tight_layout()
    return figure


def needles_figure(check: "CheckResult | None", title: str = NEEDLE_TITLE) -> "Figure":
    """The needle check's depth x length heatmap, drawn from its details; a placeholder that says why when the grid
    did not run."""
    from .checks.needles import NeedleGrid

    if check is not None and check.details.get("cells"):
        return _needle_heatmap(NeedleGrid.model_validate(check.details), title)
    figure = _new_figure(5, 1.6)
    axes = figure.subplots()
    axes.axis("off")
    axes.text(0.5, 0.5, f"needles: {check.result if check else 'not run'}", ha="center", va="center", wrap=True)
    return figure


def engine_states_figure(results: "RunResults") -> "Figure":
    """Each request of the engine-state probes against its solo run: the largest logprob difference over the tokens
    both share, green when the tokens were identical, amber for a departure the probe kit's rule passed (a near-tie,
    or the solo run the one off), red for one that failed;
    one panel per probe, titled with its status, so a probe that did not run still shows why."""
    from .checks.engine_states import comparison_rows

    rows = comparison_rows(results)
    names = [c.name for c in results.checks]
    figure = _new_figure(max(6.0, 2.6 * len(names)), 3.4)
    panels = figure.subplots(1, max(1, len(names)), squeeze=False)[0]
    for axes, check in zip(panels, results.checks):
        mine = [r for r in rows if r["check"] == check.name]
        allowed = ((check.details.get("tolerances") or {}).get("runs_drift") or {}).get("value")
        if mine:
            labels = [str(r["request"])[:18] for r in mine]
            diffs = [r["max logprob diff"] or 0.0 for r in mine]
            colours = [VERDICT_COLOURS.get(r["verdict"], FAILED_COLOUR) for r in mine]
            axes.bar(range(len(mine)), diffs, color=colours)
            axes.set_xticks(range(len(mine)), labels, rotation=60, ha="right", fontsize=6)
            if allowed:
                axes.axhline(allowed, color=FAILED_COLOUR, linestyle="--", linewidth=1)
        else:
            axes.set_xticks([])
            axes.text(0.5, 0.5, "no comparisons", ha="center", va="center", transform=axes.transAxes, fontsize=8)
        axes.set_title(f"{check.name}: {check.status}", fontsize=8,
                       color=STATUS_COLOURS.get(check.status, FAILED_COLOUR))
    panels[0].set_ylabel("max |run - solo| logprob", fontsize=8)
    figure.suptitle(f"{results.recipe}: engine states against solo runs on {results.hardware.description}", fontsize=9)
    figure.tight_layout()
    return figure


def check_figures(results: "RunResults") -> dict[str, "Figure"]:
    """The figures a verify run has data for, by the names the reports know: verify (time per check), needles,
    prefix_cache, engine_states (the engine-state probes only)."""
    from .checks import CHECKS
    from .checks.engine_states import GROUP as ENGINE_STATES

    if not results.checks:
        return {}
    figures = {"verify": checks_figure(results)}
    needles, prefix = results.check("needles"), results.check("prefix-cache")
    if needles is not None:
        figures["needles"] = needles_figure(needles)
    if prefix is not None:
        figures["prefix_cache"] = prefix_cache_figure(prefix)
    states = [c for c in results.checks if c.name in CHECKS and CHECKS[c.name].group == ENGINE_STATES]
    if states:
        figures["engine_states"] = engine_states_figure(results.model_copy(update={"checks": states}))
    return figures


def save_check_figures(results: "RunResults", out_dir: Path) -> dict[str, Path]:
    """`check_figures` as NAME.png into `out_dir`; returns {name: path}."""
    return {name: save(figure, Path(out_dir) / f"{name}.png") for name, figure in check_figures(results).items()}


# ---------------------------------------------------------------------------------------------------------------
# Two runs compared


def _delta_colour(delta: "Delta") -> str:
    """Red: a regression; amber: worse within the threshold; green: better or equal; grey: no verdict."""
    if delta.regression:
        return FAILED_COLOUR
    if delta.better is None or delta.change is None:
        return "#9e9e9e"
    worse = delta.change < 0 if delta.better == "higher" else delta.change > 0
    return "#f9a825" if worse else "#2e7d32"


def comparison_figure(comparison: "Comparison") -> "Figure":
    """Relative change per figure and metric (B against A), the threshold band shaded."""
    deltas = [d for d in comparison.deltas if d.change is not None]
    figure = _new_figure(8, 0.35 * len(deltas) + 1.6)
    axes = figure.subplots()
    labels = [f"{d.figure} {d.metric}" for d in deltas]
    values = [100 * (d.change or 0.0) for d in deltas]
    axes.barh(labels, values, color=[_delta_colour(d) for d in deltas])
    axes.axvspan(-100 * comparison.threshold, 100 * comparison.threshold, color="#eeeeee", zorder=0)
    axes.axvline(0, color="#444444", linewidth=0.8)
    axes.invert_yaxis()
    axes.set_xlabel(f"change from A to B (%), red: a regression beyond {comparison.threshold:.0%}")
    axes.set_title(f"A: {comparison.hardware_a}\nB: {comparison.hardware_b}", fontsize=8)
    if not deltas:
        axes.text(0.5, 0.5, "no performance figure in common", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    return figure


def _short_run_name(name: str, width: int = 18) -> str:
    """A run folder's last part, cut to `width` characters from the left (dates end folder names)."""
    tail = Path(name).name if Path(name).name not in ("results.json", "") else Path(name).parent.name
    return tail if len(tail) <= width else "..." + tail[-(width - 3):]


def trend_figure(trend: "Trend") -> "Figure":
    """One small panel per headline metric, runs along x in the trend's order: the values joined by a line,
    a regression (worse than its baseline by more than the threshold) a red cross with its change, improvements and
    changes inside the threshold plain dots; the arrow in each title says which way is better."""
    series = trend.series
    columns = min(3, max(1, len(series)))
    rows = max(1, -(-len(series) // columns))
    figure = _new_figure(4.0 * columns, 2.6 * rows + 1.0)
    panels = figure.subplots(rows, columns, squeeze=False)
    positions = list(range(len(trend.runs)))
    loads = trend.client_load or [None] * len(trend.runs)
    ticks = [f"{i + 1}. {_short_run_name(n)}" + (f"\nload {load:.3g}" if load is not None else "")
             for i, (n, load) in enumerate(zip(trend.runs, loads))]
    for index, axes in enumerate(panels.flat):
        if index >= len(series):
            axes.axis("off")
            continue
        s = series[index]
        xs = [i for i, p in zip(positions, s.points) if p.value is not None and p.value == p.value]
        ys = [p.value for p in s.points if p.value is not None and p.value == p.value]
        axes.plot(xs, ys, "o-", color="#1565c0", markersize=4, linewidth=1)
        for i, point in zip(positions, s.points):
            if not point.regression:
                continue
            y = point.value if point.value is not None and point.value == point.value and abs(point.value) != float("inf") else (max(ys) if ys else 0)
            axes.plot([i], [y], "X", color=FAILED_COLOUR, markersize=10, zorder=5)
            change = f"{point.change:+.0%}" if point.change is not None else "not finite"
            axes.annotate(change, (i, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7,
                          color=FAILED_COLOUR)
        arrow = {"higher": " (higher is better)", "lower": " (lower is better)"}.get(s.better or "", "")
        axes.set_title(f"{s.figure}\n{s.metric}{arrow}", fontsize=8)
        axes.set_xticks(positions, ticks, rotation=30, ha="right", fontsize=6)
        axes.set_xlim(-0.5, len(positions) - 0.5)
        axes.tick_params(axis="y", labelsize=7)
        axes.grid(True, alpha=0.3)
        if ys:
            top = max(ys)
            axes.set_ylim(bottom=min(0.0, min(ys)), top=top * 1.2 if top > 0 else 1.0)
    if not series:
        panels[0][0].text(0.5, 0.5, "no headline figure in these runs", ha="center", va="center",
                          transform=panels[0][0].transAxes)
    against = "the previous run" if trend.baseline == "previous" else "the first run"
    hardware = trend.hardware[0] if len(set(trend.hardware)) == 1 else "different hardware: changes compare machines"
    figure.suptitle(f"Trend over {len(trend.runs)} runs on {hardware}\nred cross: a regression, worse than {against} "
                    f"by more than {trend.threshold:.0%}; load: the client machine's highest 1-minute load average",
                    fontsize=9)
    figure.tight_layout()
    return figure
