"""The benchmark as text and DataFrames: the seeds' Performance table, the detail behind it, the sweep, roofline."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..pages import performance_rows
from ..recipes import Recipe
from ..results import RunResults
from ..roofline import RooflineRow, verdict
from .figures import MEASURED_AS
from .stats import OUTLIER_RULE

if TYPE_CHECKING:
    import pandas as pd


def _frame(rows: list[dict[str, Any]]) -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame(rows)


def detail_frame(results: RunResults) -> "pd.DataFrame":
    """The detail behind the table: per figure, requests, failures, TTFT / ITL / TPOT / E2E p50, p90, p99, and
    the outlier counts (stats.OUTLIER_RULE)."""
    rows = []
    for figure in results.performance:
        if figure.name in ("sweep", "open-loop"):
            continue
        m = figure.metrics
        row: dict[str, Any] = {"figure": figure.name, "requests": m.get("requests"), "failed": figure.failed_requests}
        if figure.name.startswith("cold-prompt-"):
            row.update({"ttft_s_min": m.get("ttft_s_min"), "ttft_s_max": m.get("ttft_s_max"),
                        "e2e_s_min": m.get("seconds_to_answer_min"), "e2e_s_max": m.get("seconds_to_answer_max")})
        else:
            for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_s"):
                for stat in ("p50", "p90", "p99"):
                    row[f"{name}_{stat}"] = m.get(f"{name}_{stat}")
            row["ttft_outliers"], row["itl_outliers"] = m.get("ttft_ms_outliers"), m.get("itl_ms_outliers")
        row["mbu"] = m.get("mbu")
        rows.append(row)
    return _frame(rows)


def sweep_frame(results: RunResults) -> "pd.DataFrame":
    """The sweep's rows back as a DataFrame (from a results file too)."""
    figure = results.figure("sweep")
    return _frame(figure.details.get("rows", []) if figure else [])


def open_loop_frame(results: RunResults) -> "pd.DataFrame":
    """The open loop's rows (one per offered rate) back as a DataFrame (from a results file too)."""
    figure = results.figure("open-loop")
    return _frame(figure.details.get("rows", []) if figure else [])


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)]


def _stat(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_report(results: RunResults, rows: list[RooflineRow] | None = None, recipe: Recipe | None = None) -> str:
    """The Performance table as the seeds show it (Test | Result), the detail table, and the roofline lines."""
    out = [f"Performance on {results.hardware.description} ({results.model}, {results.started_at})",
           f"measured as: {MEASURED_AS}", ""]
    out += _text_table(("Test", "Result"), performance_rows(results))
    detail: list[tuple[str, ...]] = []
    for figure in results.performance:
        m = figure.metrics
        if figure.name in ("sweep", "open-loop"):
            continue
        if figure.name.startswith("cold-prompt-"):
            ttft = f"{_stat(m.get('ttft_s_min'), 2)} to {_stat(m.get('ttft_s_max'), 2)} s"
            detail.append((figure.name, str(m.get("requests")), str(figure.failed_requests), ttft, "-", "-",
                           f"{_stat(m.get('seconds_to_answer_min'), 2)} to {_stat(m.get('seconds_to_answer_max'), 2)} s", "-"))
            continue
        cells = ["/".join(_stat(m.get(f"{n}_{s}"), d) for s in ("p50", "p90", "p99"))
                 for n, d in (("ttft_ms", 0), ("itl_ms", 1), ("tpot_ms", 1), ("e2e_s", 2))]
        outliers = "/".join("-" if m.get(f"{n}_outliers") is None else str(m.get(f"{n}_outliers")) for n in ("ttft_ms", "itl_ms"))
        detail.append((figure.name, str(m.get("requests")), str(figure.failed_requests), *cells, outliers))
    if detail:
        out += ["", "Detail (p50/p90/p99; TTFT, ITL, TPOT in ms, E2E in s; cold prompts: min to max; "
                f"outliers: requests' TTFT / token gaps {OUTLIER_RULE})"]
        out += _text_table(("Figure", "Requests", "Failed", "TTFT", "ITL", "TPOT", "E2E", "Outliers"), detail)
    sweep = results.figure("sweep")
    if sweep is not None:
        out += ["", f"Sweep ({sweep.label})"]
        sweep_rows = [(str(r["streams"]), _stat(r.get("aggregate_tokens_per_s"), 1), _stat(r.get("per_stream_tokens_per_s"), 1),
                       _stat(r.get("ttft_ms_p50"), 0), _stat(r.get("tpot_ms_p50"), 1), _stat(r.get("tpot_ms_p99"), 1),
                       str(r.get("failed")), _stat(r.get("mbu") * 100 if r.get("mbu") is not None else None, 1))
                      for r in sweep.details.get("rows", [])]
        out += _text_table(("Streams", "Aggregate tok/s", "Per stream tok/s", "TTFT p50 ms", "TPOT p50 ms",
                            "TPOT p99 ms", "Failed", "MBU %"), sweep_rows)
    open_loop = results.figure("open-loop")
    if open_loop is not None:
        out += ["", f"Open loop ({open_loop.label})", f"{open_loop.details.get('client_overhead', '')}"]
        objectives = open_loop.details.get("objectives_ms") or {}
        if objectives:
            out.append("goodput objectives: " + ", ".join(f"{k} <= {v:g} ms" for k, v in objectives.items()))
        open_rows = [(f"{r['offered_rate']:g}", _stat(r.get("achieved_rate"), 2), _stat(r.get("request_throughput"), 2),
                      _stat(r.get("request_goodput"), 2), _stat(r.get("output_tokens_per_s"), 1),
                      _stat(r.get("ttft_ms_p50"), 0), _stat(r.get("ttft_ms_p99"), 0), _stat(r.get("tpot_ms_p50"), 1),
                      _stat(r.get("tpot_ms_p99"), 1), str(r.get("failed")), _stat(r.get("send_lag_ms_p99"), 1),
                      _stat(r["client_core_share"] * 100 if r.get("client_core_share") is not None else None, 1),
                      "yes" if r.get("saturated") else "no")
                     for r in open_loop.details.get("rows", [])]
        out += _text_table(("Offered req/s", "Achieved req/s", "Throughput req/s", "Goodput req/s", "Output tok/s",
                            "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "Failed", "Send lag p99 ms",
                            "Client % core", "Saturated"), open_rows)
    if rows is not None:
        out += ["", "Roofline (decode, weights only)"]
        if rows:
            out.append(f"hardware: {rows[0].hardware}")
            out += [row.line() for row in rows]
            if recipe is not None:
                out.append(f"verdict: {verdict(rows, recipe)}")
        else:
            out.append("not computed: the recipe or the hardware that produced the figures is not known")
    return "\n".join(out)
