"""The needle grid as a heatmap: depth down, length across, found or missed, with the time to each answer.

Drawn on a bare matplotlib Figure (no pyplot), so it never touches the notebook's or the CLI's backend.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from .checks.needles import NeedleGrid
from .haystack import format_tokens

_MISSED, _FOUND, _NOT_RUN = 0, 1, 2
_COLOURS = ListedColormap(["#d9534f", "#5cb85c", "#dddddd"])


def heatmap_figure(grid: NeedleGrid, title: str = "Needle in a haystack (cold, exact match)") -> Figure:
    """A Figure of the grid; each cell says found or missed and its time to the answer."""
    values = [[_NOT_RUN for _ in grid.lengths] for _ in grid.depths]
    labels = [["not run" for _ in grid.lengths] for _ in grid.depths]
    for row, depth in enumerate(grid.depths):
        for col, length in enumerate(grid.lengths):
            cell = grid.cell(length, depth)
            if cell is None:
                continue
            values[row][col] = _FOUND if cell.found else _MISSED
            labels[row][col] = f"{'found' if cell.found else 'missed'}\n{cell.seconds:.1f} s"
    figure = Figure(figsize=(1.6 + 1.5 * len(grid.lengths), 1.2 + 0.9 * len(grid.depths)), dpi=120)
    axes = figure.add_subplot()
    axes.imshow(values, cmap=_COLOURS, vmin=0, vmax=2, aspect="auto")
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
    found = sum(c.found for c in grid.cells)
    axes.set_title(f"{title}: {found}/{len(grid.cells)}", fontsize=9)
    figure.tight_layout()
    return figure


def save_heatmap(grid: NeedleGrid, path: Path) -> Path:
    """Write the heatmap PNG (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    heatmap_figure(grid).savefig(path)
    return path
