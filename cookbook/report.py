"""Shareable reports of a run folder: an HTML page per executed notebook without its code, an index that links
them with the Verified and Performance tables and the figures inlined, and a secrets scan over everything written.
The figures are drawn by `cookbook.plots` and saved by whoever ran the step; the index inlines the PNGs, and draws the
bench figures a run's results have samples for but no saved PNG (`redraw_bench_figures`).

The HTML loads nothing from the network (nbconvert's CDN script tags are dropped: the reports hold only text,
tables and PNG figures), so a report folder opens offline and reveals nothing to a third party when shared.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .pages import performance_note, performance_rows, published_label, verified_note, verified_rows, write_atomic
from .results import CheckResult, RunResults
from .run_folder import BatchSummary
from .secrets import mask_folder, scan_folder

if TYPE_CHECKING:  # pandas is imported only where a table is built
    import pandas as pd

_CODE_SPAN = re.compile(r"`([^`]+)`")
_REMOTE_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>\s*')
# Figures the index shows first, in this order; any other figure follows.
LEAD_FIGURES = ("throughput", "latency", "throughput_latency", "open_loop", "latency_distribution", "ttft_prompt_length",
                "kv_cache", "roofline", "needles", "prefix_cache")


# ---------------------------------------------------------------------------------------------------------------
# Tables for notebooks and reports


def setup_display() -> None:
    """Notebook tables shown whole: the seeds' labels and results are sentences, not to be cut at 50 characters."""
    import pandas as pd

    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.width", 200)


def checks_frame(results: RunResults) -> "pd.DataFrame":
    """The Verified table as a DataFrame, with the status and the time each check took."""
    import pandas as pd

    rows = [(label, text, check.status, check.duration_s) for check, (label, text) in zip(results.checks, verified_rows(results))]
    return pd.DataFrame(rows, columns=["Check", "Result", "Status", "Seconds"])


def figures_frame(results: RunResults) -> "pd.DataFrame":
    """The Performance table as a DataFrame, with how each figure was measured."""
    import pandas as pd

    rows = [(label, text, f.measured_as) for f, (label, text) in zip(results.performance, performance_rows(results))]
    return pd.DataFrame(rows, columns=["Test", "Result", "Measured as"])


def prefix_cache_frame(check: CheckResult | None) -> "pd.DataFrame":
    """Per prompt of the prefix-cache probe: cached tokens per request, text and logprob comparison, times."""
    import pandas as pd

    prompts = (check.details.get("prompts") if check else None) or []
    rows = []
    for p in prompts:
        comparison = p["comparison"]
        rows.append((
            p.get("prompt_tokens") or p["target_tokens"], ", ".join(str(c) for c in p["cached_tokens"]),
            comparison["text_identical"], comparison["bit_identical"], comparison["max_logprob_diff"],
            round(p["seconds"][0], 2), round(p["seconds"][-1], 2), "; ".join(p.get("problems", [])),
        ))
    columns = ["Prompt tokens", "Cached tokens per request", "Same text", "Bit-identical", "Max |logprob diff|",
               "Cold s", "Hit s", "Problems"]
    return pd.DataFrame(rows, columns=columns)


def needles_frame(check: CheckResult | None) -> "pd.DataFrame":
    """The needle grid as depth x length: 'found 1.2 s', 'model limit 1.2 s' (missed where the model's reference
    misses too) or 'MISSED 1.2 s' per cell."""
    import pandas as pd

    cells = (check.details.get("cells") if check else None) or []
    rows: dict[str, dict[int, str]] = {}
    for c in cells:
        passed = c.get("passed", c["found"])
        state = "found" if c["found"] and passed else ("model limit" if passed else "MISSED")
        rows.setdefault(f"{c['depth']:.0%}", {})[c["prompt_tokens"]] = f"{state} {c['seconds']:.1f} s"
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "depth \\ tokens"
    return frame


# ---------------------------------------------------------------------------------------------------------------
# HTML


def notebook_html(executed: Path, out: Path) -> Path:
    """An executed notebook as HTML without its code: markdown, tables, figures and any error stay."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(str(executed), as_version=4)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _resources = exporter.from_notebook_node(notebook)
    return write_atomic(out, _REMOTE_SCRIPT.sub("", body))


def _inline(text: str) -> str:
    """Escaped text with the seeds' `code` spans as <code>."""
    return _CODE_SPAN.sub(r"<code>\1</code>", html.escape(text))


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(run_dir: Path, name: str, relative: str) -> str:
    path = run_dir / relative
    if path.suffix.lower() != ".png" or not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    label = html.escape(name.replace("_", " "))
    return f'<figure><img alt="{label}" src="data:image/png;base64,{data}"><figcaption>{label}</figcaption></figure>'


def _ordered_figures(artifacts: dict[str, str]) -> list[tuple[str, str]]:
    lead = [(n, artifacts[n]) for n in LEAD_FIGURES if n in artifacts]
    rest = sorted((n, p) for n, p in artifacts.items() if n not in LEAD_FIGURES)
    return lead + rest


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.failed { color: #b00020; font-weight: bold; } .ok { color: #1b5e20; }
figure { display: inline-block; margin: 0 1em 1em 0; } img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f6f6f6; padding: 0 0.2em; }
"""


def redraw_bench_figures(run_dir: Path, results: RunResults) -> dict[str, str]:
    """The bench figures (`plots.bench_figures`) the results have data for but the run folder does not hold (a
    notebook that did not save them, a folder written before they existed): drawn from results.json's samples into
    the run folder, so the report shows them. Returns {name: path relative to the run folder}."""
    from .plots import bench_figures, save

    drawn = {}
    for name, build in bench_figures(results).items():
        saved = results.artifacts.get(name)
        if saved is not None and (run_dir / saved).is_file():
            continue
        drawn[name] = save(build(), run_dir / f"{name}.png").relative_to(run_dir).as_posix()
    return drawn


def write_index(run_dir: Path, summary: "BatchSummary", results: RunResults | None) -> Path:
    """index.html of a run folder: which notebooks ran, links to their reports, Verified, Performance, figures."""
    title = f"{summary.recipe}: cookbook run"
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    good = summary.ok and not summary.checks_not_met
    out.append(
        f"<p class='{'ok' if good else 'failed'}'>{html.escape(summary.headline)}</p>"
        f"<p>Server: <code>{html.escape(summary.base_url or '')}</code> ({'started by this run' if summary.launched else 'attached'}); "
        f"started {html.escape(summary.started_at)}, {summary.wall_s:.0f} s wall time.</p>"
    )
    rows = []
    for nb in summary.notebooks:
        status = nb.status if not nb.error else f"{nb.status}: {nb.error}"
        links = " ".join(f"<a href='{html.escape(p)}'>{kind}</a>" for kind, p in (("report", nb.html), ("notebook", nb.notebook)) if p)
        rows.append(f"<tr><td>{html.escape(nb.name)}</td><td class='{'ok' if nb.status == 'ok' else 'failed'}'>"
                    f"{html.escape(status)}</td><td>{nb.seconds:.0f} s</td><td>{links}</td></tr>")
    out.append("<h2>Notebooks</h2><table><thead><tr><th>Notebook</th><th>Status</th><th>Time</th><th>Open</th></tr>"
               f"</thead><tbody>{''.join(rows)}</tbody></table>")
    extra = [(label, p) for label, p in (("results.json", summary.results), ("recipe page (page.md)", summary.page)) if p]
    if extra:
        out.append("<p>" + " · ".join(f"<a href='{html.escape(p)}'>{html.escape(label)}</a>" for label, p in extra) + "</p>")
    if results is not None:
        if results.launch_block:  # shown, so that the note's "the launch command above" is true of this page too
            out.append("<h2>Launch</h2><p>The launch block this run started its server with (secrets masked):</p>"
                       f"<pre><code>{html.escape(results.launch_block)}</code></pre>")
        label = published_label(results)
        out.append("<h2>Verified</h2>" + (f"<p>{html.escape(label)}</p>" if label else "")
                   + f"<p>{html.escape(verified_note(results, results.launch_block or None))}</p>")
        out.append(_table(("Check", "Result", "Status"), [(a, b, c.status) for c, (a, b) in zip(results.checks, verified_rows(results))])
                   if results.checks else "<p>No checks in this run.</p>")
        if results.kv_pool_tokens is not None:
            out.append(f"<p>KV pool at start-up: {results.kv_pool_tokens:,} tokens.</p>")
        if results.performance:
            out.append("<h2>Performance</h2>" + (f"<p>{html.escape(label)}</p>" if label else "")
                       + f"<p>{html.escape(performance_note(results))}</p>")
            out.append(_table(("Test", "Result"), performance_rows(results)))
        artifacts = {**results.artifacts, **redraw_bench_figures(run_dir, results)}
        figures = [_figure(run_dir, n, p) for n, p in _ordered_figures(artifacts)]
        if any(figures):
            out.append("<h2>Figures</h2>" + "".join(figures))
    out.append("</body></html>\n")
    return write_atomic(run_dir / "index.html", "\n".join(out))


# ---------------------------------------------------------------------------------------------------------------
# Secrets


def scan_secrets(folder: Path, secrets: Iterable[str]) -> list[Path]:
    """Every file under `folder` that contains one of the secret values (bytes, so binary files count too)."""
    return scan_folder(folder, secrets)


def mask_secrets(folder: Path, secrets: Iterable[str]) -> list[Path]:
    """Mask secret values in every file under `folder` (cookbook.secrets.mask_folder: JSON value by value, a binary
    file overwritten in place, never deleted). Returns the files that were changed, so the run's summary can say so."""
    return mask_folder(folder, secrets).changed
