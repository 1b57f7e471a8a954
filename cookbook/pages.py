"""Recipe pages: a recipe plus a run's results rendered as Markdown in the structure of the published seed pages.

Title and summary, an at-a-glance table, Launch (the recipe's own launch block), Prefix caching, Buckets,
Required fixes (fix | why this model needs it), Verified (with the note that says which hardware produced it and
the KV pool), Performance ("measured as" wording), Known issues, What not to do. A seed recipe's default results
are the published ones stored beside it (`results.json`, `source: published`); a measured run passes its own.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ResultsError
from .fixpack import load_pack
from .recipes import REPO_ROOT, Recipe, render_launch_block
from .results import RunResults, read_results
from .secrets import scrub_file_text

RESULTS_FILE = "results.json"
Row = tuple[str, str]


def default_results(recipe: Recipe) -> RunResults | None:
    """The results stored beside the recipe (the published figures for the seed recipes), if any."""
    path = recipe.folder / RESULTS_FILE
    if not path.exists():
        return None
    results = read_results(path)
    if results.recipe != recipe.id:
        raise ResultsError(f"{path}: recipe: says {results.recipe!r}, but the file sits beside {recipe.id!r}")
    return results


# ---------------------------------------------------------------------------------------------------------------
# Table rows (also what tests compare with the seeds, and what the notebooks show as DataFrames)


def glance_rows(recipe: Recipe) -> list[Row]:
    """The at-a-glance table: model, hardware, image, precision, context, concurrency, parsers, recipe path."""
    parsers = []
    if recipe.tool_parser:
        parsers.append(f"tools `{recipe.tool_parser}`")
    if recipe.reasoning_parser:
        parsers.append(f"reasoning `{recipe.reasoning_parser}`")
    context = f"{recipe.max_model_len:,}" + (f" ({recipe.context_note})" if recipe.context_note else "")
    try:
        where = recipe.path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        where = str(recipe.path)
    return [
        ("Model", recipe.model.id),
        ("Hardware", recipe.hardware.description),
        ("Image", recipe.image.label),
        ("Precision", recipe.precision.description),
        ("Context", context),
        ("Concurrency", f"`--max-num-seqs {recipe.max_num_seqs}`"),
        ("Parsers", ", ".join(parsers) or "none"),
        ("Recipe", f"`{where}`"),
    ]


def fix_rows(recipe: Recipe) -> list[Row]:
    """Required fixes: the recipe's per-model why in its order, "(opt-in)" from the fix pack's metadata; a recipe
    that names no per-model reason lists every fix its profile applies, with the fix's own symptom."""
    rows = load_pack().required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, dict(recipe.fixes.why))
    return [(f"`{row.id}`" + (" (opt-in)" if row.opt_in else ""), row.why) for row in rows]


def verified_rows(results: RunResults) -> list[Row]:
    """Check | Result. A measured check that did not pass says so in its result cell."""
    rows = []
    for check in results.checks:
        text = check.result
        if check.status in ("fail", "error") and check.status not in text.lower():
            text = f"{text} ({check.status})"
        rows.append((check.label, text))
    return rows


# Figures that stand behind the table rather than in it (the run's report shows them).
DETAIL_FIGURES = frozenset({"sweep"})


def performance_rows(results: RunResults) -> list[Row]:
    """The seeds' Performance rows; the concurrency sweep stays in the report, not on the page."""
    rows = []
    for figure in results.performance:
        if figure.name in DETAIL_FIGURES:
            continue
        text = figure.result
        if figure.failed_requests:
            text = f"{text} ({figure.failed_requests} failed requests)"
        rows.append((figure.label, text))
    return rows


def verified_note(results: RunResults) -> str:
    """The sentence under Verified: always names the hardware and image that produced the results."""
    if results.verified_note:
        return results.verified_note
    image = results.image or "an image the results do not name"
    when = f", {results.started_at[:10]}" if results.started_at else ""
    return f"Measured on {results.hardware.description}, {image}{when}. Requests went to the OpenAI-compatible API."


def performance_note(results: RunResults) -> str:
    if results.performance_note:
        return results.performance_note
    ways = list(dict.fromkeys(f.measured_as for f in results.performance if f.measured_as))
    measured = f" (measured as: {'; '.join(ways)})" if ways else ""
    return f"Single runs on the server above{measured}."


def markdown_table(header: Row, rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = [f"| {cell(header[0])} | {cell(header[1])} |", "| --- | --- |"]
    lines += [f"| {cell(a)} | {cell(b)} |" for a, b in rows]
    return "\n".join(lines)


def _bullets(items: list[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def _launch_intro(recipe: Recipe) -> str:
    if recipe.image.kind == "vllm-cpu":
        return (
            "`$COOKBOOK` is this checkout and `$COOKBOOK_MODELS` the folder `cookbook setup` prepares the weights in; "
            f"`cookbook serve {recipe.id}` runs exactly these steps in the CPU image's environment."
        )
    return "`$COOKBOOK` is a checkout of this repository inside the container."


# ---------------------------------------------------------------------------------------------------------------
# The page


def render_page(recipe: Recipe, results: RunResults | None = None) -> str:
    """The recipe page in Markdown. `results` defaults to nothing: pass `default_results(recipe)` for the stored ones."""
    if results is not None and results.recipe != recipe.id:
        raise ResultsError(f"--results: results of {results.recipe!r}, not of recipe {recipe.id!r}")
    parts: list[str] = [f"# {recipe.title}", recipe.model.summary.strip()]
    description = recipe.model.description.strip()
    if description and description not in recipe.model.summary:
        parts.append(description)
    parts.append(markdown_table(("", ""), glance_rows(recipe)))

    launch = ["## Launch", _launch_intro(recipe), f"```sh\n{render_launch_block(recipe)}```"]
    if recipe.serve.notes:
        launch.append(_bullets(recipe.serve.notes))
    parts += launch

    caching = recipe.prefix_caching
    parts += ["## Prefix caching", caching.notes.strip() or ("Prefix caching is on." if caching.enabled else "Prefix caching is off.")]
    if recipe.buckets:
        parts += ["## Buckets", recipe.buckets]

    parts.append("## Required fixes")
    if recipe.fixes.note:
        parts.append(recipe.fixes.note.strip())
    rows = fix_rows(recipe)
    parts.append(markdown_table(("Fix", "Why this model needs it"), rows) if rows else "No fix beyond the profile.")

    parts.append("## Verified")
    if results is None:
        parts.append(f"No results for this recipe yet: `cookbook run {recipe.id}` measures them.")
    else:
        parts.append(verified_note(results))
        if results.checks:
            parts.append(markdown_table(("Check", "Result"), verified_rows(results)))
        else:
            parts.append("No checks in these results.")
        if results.kv_pool_tokens is not None:
            parts.append(f"KV pool at start-up: {results.kv_pool_tokens:,} tokens.")

    if results is not None and results.performance:
        parts += ["## Performance", performance_note(results)]
        parts.append(markdown_table(("Test", "Result"), performance_rows(results)))

    if recipe.known_issues:
        parts += ["## Known issues", _bullets(recipe.known_issues)]
    if recipe.do_not:
        parts += ["## What not to do", _bullets(recipe.do_not)]
    return "\n\n".join(parts) + "\n"


def write_atomic(path: Path, text: str) -> Path:
    """Write a text file via a temp file and a rename: a reader never sees it half-written. Secrets are masked
    on the way (cookbook.secrets: the one masking path every writer shares)."""
    path = Path(path)
    text = scrub_file_text(path, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
