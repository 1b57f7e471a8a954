"""Batch runs: the notebook set executed headless with papermill against one server, into one run folder.

Per run the folder holds the executed notebooks (a failing one keeps its error, and the others still run), an
HTML report per notebook without code, `results.json` (every notebook writes its part under `parts/`, the batch
merges them into one `RunResults`), the figures, `page.md` (the recipe page with this run's tables), `index.html`
and `summary.json`. Secrets of the environment are masked in everything written.

The notebooks talk to the library through `cookbook.session`, the batch included: it opens a session on the
server to check its health over the whole run. The folder's records live in `cookbook.run_folder`.
"""
from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any, Literal

from ._prestart import StartedKernel
from .checks import CHECKS, RunStart, selected_checks
from .checks.registry import snapshot_server
from .errors import CookbookError
from .launch import Server, attach, new_run_dir
from .pages import render_page, write_atomic
from .progress import Progress, Task
from .recipes import REPO_ROOT, Recipe, list_recipes, load_recipe, render_launch_block
from .report import mask_secrets, notebook_html, write_index
from .results import CheckResult, Evidence, RunResults, check_output_path, now, parse_hardware, write_results
from .run_folder import BatchSummary, NotebookOutcome, SkippedRecipe, merge_parts
from .secrets import current_secrets, scrub, scrubbed_logs, strip_url_credentials
from .session import Say, Session, open_session, unreachable_reason

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
# The batch set, in order. 00_index only explains the set; it is executed by the tests, not by a batch.
BATCH_NOTEBOOKS = (
    "01_apply_fixes", "02_launch", "03_verify", "04_prefix_cache", "05_needles", "06_throughput", "07_engine_states",
)
# Checks a notebook of the set runs on its own (with its figure); the verify notebook leaves them to it in a batch.
NOTEBOOK_CHECKS: dict[str, tuple[str, ...]] = {
    "04_prefix_cache": ("prefix-cache",),
    "05_needles": ("needles",),
    "07_engine_states": ("same-step-prefix", "preemption", "chunked-prompt-logprobs", "batch-composition"),
}
VERIFY_NOTEBOOK = "03_verify"
# Checks `cookbook verify` runs that a batch's verify notebook leaves out, and why (the run's Verified table then says
# "not run" for them; `cookbook verify --checks NAME` runs them).
BATCH_LEAVES_OUT: dict[str, str] = {
    "task-accuracy": "lm-eval over 200 multiple-choice items takes minutes on a CPU server",
}
CELL_TIMEOUT_S = 1800
# papermill's own nbclient engine, each code cell's start reported to a `progress` engine argument.
ENGINE = "cookbook-progress"
# The Jupyter kernel of the cookbook's environment, installed by scripts/install-kernel.sh and named by every notebook.
KERNEL = "gaudi-cookbook"


def resolve_notebooks(selection: list[str | Path] | None, folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Notebook files from names ('03_verify' or 'verify') or paths; default: the batch set, in order."""
    if not selection:
        return [folder / f"{name}.ipynb" for name in BATCH_NOTEBOOKS]
    available = sorted(folder.glob("*.ipynb"))
    chosen = []
    for item in selection:
        path = Path(item)
        if path.suffix == ".ipynb":
            if not path.is_file():
                raise CookbookError(f"--notebooks: no such notebook {path}")
            chosen.append(path)
            continue
        match = [p for p in available if p.stem == str(item) or p.stem.split("_", 1)[-1] == str(item)]
        if not match:
            known = ", ".join(p.stem for p in available)
            raise CookbookError(f"--notebooks: unknown notebook {item!r} (known: {known})")
        chosen.append(match[0])
    return chosen


def plan(notebooks: list[str | Path] | None, parameters: dict[str, Any] | None) -> dict[Path, set[str]]:
    """The notebooks to run, each with the parameter names its `parameters` cell declares (papermill reads the
    cell, no kernel starts). An unknown notebook or a parameter no notebook takes fails here, before anything runs."""
    import papermill as pm

    declared = {source: set(pm.inspect_notebook(str(source))) for source in resolve_notebooks(notebooks)}
    known = set().union(*declared.values())
    unknown = sorted(set(parameters or {}) - known)
    if unknown:
        raise CookbookError(f"--param: {unknown[0]} is not a parameter of the notebooks run (they take: {', '.join(sorted(known))})")
    return declared


def describe_cell(cells: list[Any], index: int, heading: str = "") -> str:
    """What a person recognises a code cell by: the markdown heading above it and its first source line."""
    first = next((line.strip() for line in str(cells[index].source).splitlines() if line.strip()), "(empty)")
    return f"{heading} | {first}"[:160] if heading else first[:160]


@functools.cache
def _reporting_engine() -> str:
    """Register (once) a papermill engine (papermill's documented extension point: an `Engine` registered by name,
    chosen with `engine_name`) that is papermill's nbclient engine with every code cell's start sent to the
    `progress` argument as `cell n of N`: its notebook manager's `cell_start` hook, which papermill calls for
    each cell, markdown included."""
    from papermill.engines import NBClientEngine, papermill_engines

    class ReportingEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, progress: Task | None = None,
                                     **kwargs: Any) -> Any:
            if progress is not None:
                cells = nb_man.nb.cells
                progress.total = sum(1 for cell in cells if cell.cell_type == "code")
                original = nb_man.cell_start
                heading = [""]

                def cell_start(cell: Any, cell_index: int | None = None, **more: Any) -> Any:
                    if cell.cell_type == "markdown":
                        titles = [line.lstrip("#").strip() for line in str(cell.source).splitlines() if line.startswith("#")]
                        heading[0] = titles[0] if titles else heading[0]
                    elif cell.cell_type == "code" and cell_index is not None:
                        progress.step(describe_cell(cells, cell_index, heading[0]))
                    return original(cell, cell_index, **more)

                nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register(ENGINE, ReportingEngine)
    return ENGINE


# Arguments of every batch kernel: the kernel's loopback-TCP warning is noise.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


def execute_notebook(source: Path, run_dir: Path, parameters: dict[str, Any], progress: Task | None = None,
                     kernel: Any = None) -> NotebookOutcome:
    """Run one notebook with papermill into the run folder; an error is recorded, never raised. Each code cell's
    start goes to `progress` (`cell n of N`: its heading and first line). `kernel`: a kernel manager already
    started for it in the run folder (`cookbook._prestart`), else papermill starts one."""
    import papermill as pm

    executed = run_dir / source.name
    started = time.monotonic()
    status: Literal["ok", "failed"] = "ok"
    error = ""
    try:
        with scrubbed_logs("papermill", "nbclient", "traitlets"):  # at DEBUG papermill logs every kernel message
            pm.execute_notebook(
                str(source), str(executed), parameters=parameters, kernel_name=KERNEL, language="python",
                progress_bar=False, cwd=str(run_dir), execution_timeout=CELL_TIMEOUT_S,
                extra_arguments=KERNEL_ARGUMENTS, engine_name=_reporting_engine(), progress=progress, km=kernel,
            )
    except pm.PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {exc.evalue}".strip().splitlines()[0][:300]
    except Exception as exc:  # the kernel died, a timeout, a malformed notebook: still one failed notebook
        status, error = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    error = scrub(error)  # the summary is printed and shared: never a secret in it
    outcome = NotebookOutcome(name=source.stem, status=status, seconds=round(time.monotonic() - started, 1), error=error)
    if executed.exists():
        outcome.notebook = executed.name
        try:
            outcome.html = notebook_html(executed, run_dir / f"{source.stem}.html").name
        except Exception as exc:  # a report that cannot render must not hide the run
            outcome.error = outcome.error or f"HTML report failed: {type(exc).__name__}: {exc}"[:300]
    return outcome


def whole_run_health(session: Session, start: RunStart) -> CheckResult:
    """`server-health` over the whole batch: healthy now, and no restart since `start`, the server as the batch
    found it before the first notebook (the verify notebook's own health check only covers that notebook)."""
    spec = CHECKS["server-health"]
    ctx = session.check_context()
    ctx.run_start = start
    began = time.monotonic()
    try:
        outcome = spec.fn(ctx)
        status: Literal["pass", "fail"] = "pass" if outcome.passed else "fail"
        result, evidence, details = outcome.result, outcome.evidence, outcome.details
    except CookbookError as exc:
        status, result, evidence, details = "fail", f"not healthy after the run: {exc}", [Evidence(note=str(exc))], {}
    return CheckResult(name=spec.name, label=spec.label, status=status, result=result, evidence=evidence,
                       duration_s=round(time.monotonic() - began, 3), details={**details, "scope": "the whole batch"})


def _verified_note(results: RunResults, launched: bool) -> str:
    """The run's note. A launched run records its Launch block beside it (`RunResults.launch_block`), and pages and
    reports keep the 'exactly the launch command above' wording only where they show that block."""
    how = ("with exactly the launch command above (on the host and port the run chose), started by the cookbook "
           "(the fixes applied at start-up)"
           if launched else "against a server this run attached to (started outside the run, with a command it did not record)")
    return (f"On {results.image or 'an unnamed image'}, {results.hardware.description}, {how}. "
            "Requests went to the OpenAI-compatible API.")


def verify_checks(recipe: Recipe, sources: list[Path]) -> list[str] | None:
    """The checks the verify notebook runs in a batch: every check that applies to the recipe (the CLI's default),
    less those another notebook of the same batch runs with its own figure, so no check runs twice, and those a batch
    leaves out (`BATCH_LEAVES_OUT`). None when the batch runs no such notebook (the notebook's own default then holds)."""
    stems = {p.stem for p in sources}
    covered = {name for nb, names in NOTEBOOK_CHECKS.items() if nb in stems for name in names}
    if VERIFY_NOTEBOOK not in stems or not covered:
        return None
    return [s.name for s in selected_checks(None, recipe) if s.name not in covered and s.name not in BATCH_LEAVES_OUT]


def run_batch(
    recipe: Recipe,
    base_url: str,
    run_dir: Path,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    hardware: str | None = None,
    launched: bool = False,
    say: Say = print,
    progress: Progress | None = None,
    first_kernel: StartedKernel | None = None,
) -> BatchSummary:
    """Execute the notebooks against `base_url` into `run_dir`, then write results, page, reports and summary;
    `say` gets a line per notebook, `progress` each notebook's cells as they start. `first_kernel`: the first
    notebook's kernel, already starting (a launched run starts it while the server starts); the caller shuts it
    down if the batch never takes it."""
    declared = plan(notebooks, parameters)
    sources = list(declared)
    parse_hardware(hardware)  # a bad --hardware fails before anything runs
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = BatchSummary(recipe=recipe.id, run_dir=str(run_dir.resolve()), base_url=strip_url_credentials(base_url), launched=launched,
                           started_at=now())
    started = time.monotonic()
    session = open_session(recipe, base_url, run_dir, hardware)
    start = snapshot_server(session.endpoint)
    common: dict[str, Any] = {"RECIPE": recipe.id, "BASE_URL": base_url, "OUT_DIR": str(run_dir), "HARDWARE": hardware, "INTERACTIVE": False}
    checks = verify_checks(recipe, sources)
    if checks is not None:
        common["CHECKS"] = checks  # only the verify notebook declares CHECKS; --param CHECKS=... still wins
    upcoming: StartedKernel | None = first_kernel or StartedKernel(KERNEL, run_dir, KERNEL_ARGUMENTS)
    exiting: list[threading.Thread] = []  # kernels of finished notebooks, shutting down while the next one runs
    for number, source in enumerate(sources, 1):
        say(f"[{number}/{len(sources)}] {source.stem} ...")
        given = {**common, **(parameters or {})}
        task = Task(progress, f"[{number}/{len(sources)}] {source.stem}")
        current, upcoming = upcoming, None
        try:
            kernel = current.take() if current is not None else None
            if number < len(sources):  # the next notebook's kernel starts while this one runs
                upcoming = StartedKernel(KERNEL, run_dir, KERNEL_ARGUMENTS)
            outcome = execute_notebook(source, run_dir, {k: v for k, v in given.items() if k in declared[source]}, task,
                                       kernel)
        except BaseException:  # Ctrl-C: no kernel left running
            for pending in (current, upcoming):
                if pending is not None:
                    pending.shutdown()
            for thread in exiting:
                thread.join()
            raise
        if current is not None:
            exiting.append(current.shutdown_in_background())
        task.finish(outcome.status)
        summary.notebooks.append(outcome)
        say(f"[{number}/{len(sources)}] {source.stem}: {outcome.status} in {outcome.seconds:.0f} s"
            + (f" ({outcome.error})" if outcome.error else ""))

    for thread in exiting:
        thread.join()
    results = merge_parts(run_dir, recipe)
    if results is not None and results.check("server-health") is not None:
        health = whole_run_health(session, start)
        results = results.model_copy(update={"checks": [health if c.name == health.name else c for c in results.checks]})
    session.close()
    if results is not None:
        update: dict[str, Any] = {"finished_at": now(), "verified_note": results.verified_note or _verified_note(results, launched)}
        if launched:
            update["launch_block"] = render_launch_block(recipe)
        results = results.model_copy(update=update)
        summary.count_checks(results)
        summary.results = write_results(results, run_dir / "results.json").name
        summary.page = write_atomic(run_dir / "page.md", render_page(recipe, results)).name
    summary.finished_at = now()
    summary.wall_s = round(time.monotonic() - started, 1)
    summary.timings["notebooks_s"] = summary.wall_s
    summary.index = "index.html"
    write_index(run_dir, summary, results)
    masked = mask_secrets(run_dir, current_secrets())
    summary.secrets_masked = [p.relative_to(run_dir).as_posix() for p in masked]
    write_atomic(run_dir / "summary.json", summary.model_dump_json(indent=2) + "\n")
    mask_secrets(run_dir, current_secrets())
    return summary


def prepare_run_dir(recipe: Recipe, out: Path | None) -> Path:
    """A fresh run folder: `out` itself (absent or empty), else runs/<time>-<recipe>."""
    if out is None:
        return new_run_dir(recipe.id)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CookbookError(f"--out: {out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_recipe(
    recipe: Recipe,
    base_url: str | None = None,
    out: Path | None = None,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    hardware: str | None = None,
    say: Say = print,
    progress: Progress | None = None,
) -> BatchSummary:
    """One recipe's batch: attach to `base_url`, or launch the recipe's server for the run and stop it after."""
    check_output_path(out, "--out", folder=True)  # an unusable --out fails before anything runs
    parse_hardware(hardware)  # a bad --hardware fails before a server is touched
    plan(notebooks, parameters)  # so do a bad --notebooks and --param
    if base_url:
        attach(base_url, recipe.served_model_name).close()  # fail fast, before a folder is made
    run_dir = prepare_run_dir(recipe, out)
    if base_url:
        return run_batch(recipe, base_url, run_dir, notebooks, parameters, hardware, False, say, progress)
    kernel = StartedKernel(KERNEL, run_dir, KERNEL_ARGUMENTS)  # the first notebook's, while the server starts
    try:
        with Server(recipe, run_dir=run_dir, say=say, progress=progress) as server:
            assert server.ready is not None
            say(server.ready.line())
            summary = run_batch(recipe, server.ready.base_url, run_dir, notebooks, parameters, hardware, True, say,
                                progress, kernel)
            summary.timings = {"server_start_s": round(server.ready.startup_s, 1), **summary.timings}
    finally:
        kernel.shutdown()  # a no-op once the batch has run it
    write_atomic(run_dir / "summary.json", summary.model_dump_json(indent=2) + "\n")
    return summary


DEMO_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def run_demo(
    out: Path | None = None,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    say: Say = print,
    progress: Progress | None = None,
) -> BatchSummary:
    """The main job: CPU image and model (built once), the CPU recipe launched with its fixes, every notebook
    headless against it, the report folder, the server stopped. Timings of each phase go into the summary."""
    from .image import ensure_cpu_image
    from .models import ensure_model

    started = time.monotonic()
    recipe = load_recipe(DEMO_RECIPE)
    check_output_path(out, "--out", folder=True)
    plan(notebooks, parameters)  # bad arguments fail before anything is built
    run_dir = prepare_run_dir(recipe, out)
    image = ensure_cpu_image(progress=progress)
    if recipe.serve.weights is not None:
        ensure_model(recipe.serve.weights.prepare, image, progress=progress)
    setup_s = time.monotonic() - started
    summary = run_recipe(recipe, None, run_dir, notebooks, parameters, None, say, progress)
    summary.timings = {"setup_s": round(setup_s, 1), **summary.timings, "total_s": round(time.monotonic() - started, 1)}
    write_atomic(Path(summary.run_dir) / "summary.json", summary.model_dump_json(indent=2) + "\n")
    return summary


def run_all(
    out: Path | None = None,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    say: Say = print,
    progress: Progress | None = None,
) -> list[BatchSummary | SkippedRecipe]:
    """Every recipe this machine can serve, one after the other, each launched for its run; the rest skipped."""
    outcomes: list[BatchSummary | SkippedRecipe] = []
    for recipe in list_recipes():
        reason = unreachable_reason(recipe)
        if reason:
            say(f"skipped {recipe.id}: {reason}")
            outcomes.append(SkippedRecipe(recipe=recipe.id, reason=reason))
            continue
        say(f"== {recipe.id}")
        folder = None if out is None else out / recipe.id.replace("/", "--")
        outcomes.append(run_recipe(recipe, None, folder, notebooks, parameters, None, say, progress))
    return outcomes
