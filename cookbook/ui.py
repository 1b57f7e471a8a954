"""Widgets for the notebooks in JupyterLab: a recipe picker, a server field and run buttons with live progress.

Imported only by the notebooks, and only when `INTERACTIVE` is true: the rest of the library never imports
ipywidgets. A panel runs the very library calls the headless cells run, for the recipe and server picked, and
shows its table and figure below the buttons; the headless cells never wait for a click.
"""
from __future__ import annotations

from typing import Any, Callable

try:
    import ipywidgets as widgets
    from IPython.display import display
    from tqdm.auto import tqdm
except ImportError as exc:  # pragma: no cover - only without the notebook extras
    raise ImportError("cookbook.ui needs ipywidgets (pip install 'gaudi-cookbook[notebook]')") from exc

from . import batch, report
from .recipes import list_recipes
from .results import RunResults

Tick = Callable[[str], None]
Step = Callable[[batch.Session, Tick], Any]


def recipe_picker(value: str) -> widgets.Dropdown:
    """Every recipe in the checkout, the current one selected."""
    options = [r.id for r in list_recipes()]
    return widgets.Dropdown(options=options, value=value if value in options else options[0], description="Recipe",
                            layout=widgets.Layout(width="32em"))


def tqdm_ticks(total: int, desc: str) -> tuple[Tick, Any]:
    """A tick callback that advances a tqdm.auto bar by one, showing the item being worked on."""
    bar = tqdm(total=total, desc=desc)

    def tick(label: str) -> None:
        bar.set_postfix_str(label)
        if bar.n < total:
            bar.update(1)

    return tick, bar


def step_panel(
    title: str,
    step: Step,
    total: Callable[[batch.Session], int],
    show: Callable[[Any], None],
    recipe: str,
    base_url: str | None,
    out_dir: str | None,
    hardware: str | None = None,
    extra: list[widgets.Widget] | None = None,
) -> widgets.VBox:
    """Recipe picker, server field, a Run button; a click opens a session, runs `step` with a live bar, shows it.
    A session that had to launch its server stops it when the step is done."""
    picker = recipe_picker(recipe)
    server = widgets.Text(value=base_url or "", description="Server", placeholder="empty: launch the recipe's server",
                          layout=widgets.Layout(width="32em"))
    button = widgets.Button(description=title, button_style="primary", icon="play")
    output = widgets.Output()

    def on_click(_button: widgets.Button) -> None:
        button.disabled = True
        output.clear_output()
        with output:
            session = None
            try:
                session = batch.open_session(picker.value, server.value.strip() or None, out_dir, hardware)
                tick, bar = tqdm_ticks(total(session), title)
                result = step(session, tick)
                bar.close()
                show(result)
            except Exception as exc:  # shown in the panel, one line, like the CLI
                print(f"error: {type(exc).__name__}: {exc}")
            finally:
                if session is not None:
                    session.close()
                button.disabled = False

    button.on_click(on_click)
    return widgets.VBox([picker, server, *(extra or []), button, output])


def verify_panel(recipe: str, base_url: str | None, out_dir: str | None, hardware: str | None = None) -> widgets.VBox:
    """Pick checks and run them; the Verified table appears below with a bar per check."""
    from .checks import CHECKS, selected_checks

    chooser = widgets.SelectMultiple(options=list(CHECKS), description="Checks", rows=min(12, max(3, len(CHECKS))))

    def names() -> list[str] | None:
        return list(chooser.value) or None

    def step(session: batch.Session, tick: Tick) -> RunResults:
        from .checks import run_checks

        results = run_checks(session.check_context(), names=names(), progress=tick)
        session.write_part("verify", results)
        return results

    def total(session: batch.Session) -> int:
        return len(selected_checks(names(), session.recipe))

    def show(results: RunResults) -> None:
        display(report.checks_frame(results))

    return step_panel("Run checks", step, total, show, recipe, base_url, out_dir, hardware, [chooser])


def launch_panel(recipe: str, base_url: str | None, out_dir: str | None, hardware: str | None = None) -> widgets.VBox:
    """Attach to a server (or launch the recipe's) and show what it says about itself against the recipe."""

    def step(session: batch.Session, tick: Tick) -> Any:
        tick("facts")
        return batch.facts_frame(batch.server_facts(session))

    return step_panel("Check server", step, lambda _s: 1, display, recipe, base_url, out_dir, hardware)
