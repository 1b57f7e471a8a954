"""Widgets for the notebooks in JupyterLab: a recipe picker, a server field and run buttons with live progress.

Imported only by the notebooks, and only when `INTERACTIVE` is true: the rest of the library never imports
ipywidgets. A panel runs the very library calls the headless cells run, for the recipe and server picked, and
shows its table and figure below the buttons; the headless cells never wait for a click, and with a panel shown
they do not run at all (`stop_run_all`: Run All ends at the panel's cell).
"""
from __future__ import annotations

from typing import Any, Callable

try:
    import ipywidgets as widgets
    from IPython.display import display
except ImportError as exc:  # pragma: no cover - only without the notebook extras
    raise ImportError("cookbook.ui needs ipywidgets (pip install 'gaudi-cookbook[notebook]')") from exc

from . import plots, report
from .progress import Event, Progress, Task
from .recipes import list_recipes, load_recipe
from .results import RunResults
from .session import FixState, Session, facts_frame, fix_state, open_session, required_fixes_frame, server_facts

STOP_MESSAGE = ("Run All stops here: INTERACTIVE = True, so the panel above runs the notebook (pick a recipe and "
                "server, press its button); set INTERACTIVE = False to run the cells below headless.")


class RunAllStopsHere(Exception):
    """Raised by the panel cell in JupyterLab: Run All stops at a cell that raises, so the headless cells below it
    (the whole suite, again) do not run behind the panel. IPython shows `_render_traceback_` instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [STOP_MESSAGE]


def stop_run_all() -> None:
    """End Run All at the panel's cell (the panel keeps working: its button runs on the kernel's comm messages)."""
    raise RunAllStopsHere(STOP_MESSAGE)


def recipe_picker(value: str) -> widgets.Dropdown:
    """Every recipe in the checkout, the current one selected."""
    options = [r.id for r in list_recipes()]
    return widgets.Dropdown(options=options, value=value if value in options else options[0], description="Recipe",
                            layout=widgets.Layout(width="32em"))


class WidgetProgress:
    """`cookbook.progress` events as an ipywidgets progress bar and a label (task, current step, elapsed): the same
    events the CLI draws with tqdm. A task with no known total moves the bar one step at a time."""

    def __init__(self, title: str, total: int | None = None) -> None:
        self.bar = widgets.IntProgress(value=0, min=0, max=max(total or 1, 1), description=title, bar_style="info")
        self.label = widgets.Label(value="starting")
        self.widget = widgets.HBox([self.bar, self.label])

    def __call__(self, event: Event) -> None:
        done = event.done or 0
        self.bar.max = max(event.total or done + (0 if event.finished else 1), 1)
        self.bar.value = self.bar.max if event.finished and event.total is None else min(done, self.bar.max)
        self.bar.bar_style = "success" if event.finished and self.bar.value >= self.bar.max else "info"
        detail = f": {event.detail}" if event.detail else ""
        self.label.value = f"{event.task}{detail} ({event.elapsed_s:.0f} s{', done' if event.finished else ''})"[:200]

    def failed(self) -> None:
        self.bar.bar_style = "danger"


def step_panel(
    title: str,
    step: Callable[[str, str | None, Progress], Any],
    total: Callable[[str], int | None],
    show: Callable[[Any], None],
    recipe: str,
    base_url: str | None = None,
    extra: list[widgets.Widget] | None = None,
    server_field: bool = True,
) -> widgets.VBox:
    """Recipe picker, server field, a Run button; a click runs `step(recipe, base_url, progress)` under a live
    progress bar (`WidgetProgress`, in the output below the buttons) and shows what it returns below it. Errors
    show as one line, like the CLI's."""
    picker = recipe_picker(recipe)
    server = widgets.Text(value=base_url or "", description="Server", placeholder="empty: launch the recipe's server",
                          layout=widgets.Layout(width="32em"))
    button = widgets.Button(description=title, button_style="primary", icon="play")
    output = widgets.Output()

    def on_click(_button: widgets.Button) -> None:
        button.disabled = True
        output.clear_output()
        with output:
            progress = WidgetProgress(title)
            try:
                display(progress.widget)
                progress.bar.max = max(total(picker.value) or 1, 1)
                result = step(picker.value, server.value.strip() or None, progress)
                show(result)
            except Exception as exc:
                progress.failed()
                print(f"error: {type(exc).__name__}: {exc}")
            finally:
                button.disabled = False

    button.on_click(on_click)
    fields = [picker, *([server] if server_field else []), *(extra or [])]
    return widgets.VBox([*fields, button, output])


def with_session(
    run: Callable[[Session, Progress], Any], out_dir: str | None, hardware: str | None
) -> Callable[[str, str | None, Progress], Any]:
    """A step that needs a server: attach (or launch, its start-up on the bar, stopped again afterwards) around `run`."""

    def step(recipe: str, base_url: str | None, progress: Progress) -> Any:
        session = open_session(recipe, base_url, out_dir, hardware, progress=progress)
        try:
            return run(session, progress)
        finally:
            session.close()

    return step


def checks_panel(
    names: list[str] | None,
    recipe: str,
    base_url: str | None,
    out_dir: str | None,
    hardware: str | None = None,
    part: str = "verify",
) -> widgets.VBox:
    """Pick checks (preselected: `names`) and run them; the table and the time-per-check figure appear below, saved as
    part `part` and `part`.png."""
    from .checks import CHECKS, run_checks, selected_checks

    chooser = widgets.SelectMultiple(options=list(CHECKS), value=tuple(names or ()), description="Checks",
                                     rows=min(12, max(3, len(CHECKS))))

    def chosen() -> list[str] | None:
        return list(chooser.value) or None

    def run(session: Session, progress: Progress) -> tuple[RunResults, Any]:
        results = run_checks(session.check_context(), names=chosen(), progress=progress)
        session.write_part(part, results)
        return results, session.show_figure(plots.checks_figure(results), part)  # saved as PART.png, as 03 does

    def total(recipe_id: str) -> int:
        return len(selected_checks(chosen(), load_recipe(recipe_id)))

    def show(shown: tuple[RunResults, Any]) -> None:
        results, figure = shown
        display(report.checks_frame(results))
        display(figure)

    return step_panel("Run checks", with_session(run, out_dir, hardware), total, show, recipe, base_url, [chooser])


def verify_panel(recipe: str, base_url: str | None, out_dir: str | None, hardware: str | None = None) -> widgets.VBox:
    """The Verified checks (none preselected: every check that applies to the recipe)."""
    return checks_panel(None, recipe, base_url, out_dir, hardware)


def launch_panel(recipe: str, base_url: str | None, out_dir: str | None, hardware: str | None = None) -> widgets.VBox:
    """Attach to a server (or launch the recipe's) and show what it says about itself against the recipe."""

    def run(session: Session, progress: Progress) -> Any:
        task = Task(progress, "server facts", total=1)
        task.step("/health, /v1/models, /metrics")
        facts = facts_frame(server_facts(session))
        task.finish()
        return facts

    return step_panel("Check server", with_session(run, out_dir, hardware), lambda _r: 1, display, recipe, base_url)


def fixes_panel(recipe: str, apply: bool = False) -> widgets.VBox:
    """The picked recipe's Required fixes and their state in its image (read-only unless `apply`)."""

    def step(recipe_id: str, _base_url: str | None, progress: Progress) -> Any:
        chosen = load_recipe(recipe_id)
        task = Task(progress, "fixes", total=2)
        task.step("required fixes")
        display(required_fixes_frame(chosen))
        task.step("state in the image")
        state = fix_state(chosen, apply=apply)
        task.finish()
        return state

    def show(state: FixState) -> None:
        print(f"apply_all.py exit code {state.exit_code}" + (f": {state.error}" if state.error else ""))
        for row in state.fixes:
            print(f"  {row.get('id', '?'):<28} {row.get('state', '?')}")

    return step_panel("Show fix state", step, lambda _r: 2, show, recipe, server_field=False)


def bench_panel(
    recipe: str, base_url: str | None, out_dir: str | None, hardware: str | None = None, output_tokens: int = 256
) -> widgets.VBox:
    """Pick workloads and run them; the Performance table appears below, each workload a step of the bar."""
    from . import bench

    chooser = widgets.SelectMultiple(options=list(bench.WORKLOADS), value=tuple(bench.TABLE), description="Workloads")
    tokens = widgets.BoundedIntText(value=output_tokens, min=1, max=8192, description="Tokens")

    def run(session: Session, progress: Progress) -> RunResults:
        config = bench.BenchConfig(output_tokens=tokens.value)
        results = bench.run_performance_table(session.endpoint, session.recipe, config, session.hardware,
                                              list(chooser.value), progress=progress)
        session.write_part("throughput", results)
        return results

    def total(_recipe_id: str) -> None:
        return None  # cold prompts and sweep levels depend on the server's context: count steps as they come

    def show(results: RunResults) -> None:
        display(report.figures_frame(results))

    return step_panel("Run benchmarks", with_session(run, out_dir, hardware), total, show, recipe, base_url, [chooser, tokens])
