"""The run folder's contents, as every writer and reader of it sees them: where the notebooks' parts go, the parts
merged into one `RunResults`, and the batch's own records (`BatchSummary` with a `NotebookOutcome` per notebook,
`SkippedRecipe`).

Below both writers (`cookbook.session` writes parts, `cookbook.batch` writes the summary) and the reader
(`cookbook.report`), so the report imports these types without reaching back into the batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from .errors import CookbookError
from .results import RunResults, read_results

if TYPE_CHECKING:
    from .recipes import Recipe

# A notebook's share of the run's results: <run folder>/parts/<name>.json, merged into results.json.
PARTS_DIR = "parts"


class NotebookOutcome(BaseModel):
    """How one notebook of a batch ended: a failure is recorded here, never raised, so the others still run."""

    name: str
    status: Literal["ok", "failed"]
    seconds: float = 0.0
    error: str = Field("", description="The failing cell's exception in one line")
    notebook: str = Field("", description="The executed notebook, relative to the run folder")
    html: str = Field("", description="Its HTML report without code, relative to the run folder")


class BatchSummary(BaseModel):
    """`summary.json` of a run folder: what ran, how each notebook ended, the checks not met, the time per phase."""

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
    """A recipe `cookbook run --all` left out, with why this machine cannot serve it."""

    recipe: str
    reason: str


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
