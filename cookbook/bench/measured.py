"""Cold prompts this run already sent: the needle notebook's cells stand for the cold-prompt figures.

The seeds time their cold prompts on the needle test's own requests ("Cold prompt of 65K tokens (needle)": the time
to the answer). A batch that runs the needle notebook before the throughput one would otherwise build the same
haystacks and prefill them again (about 20 s of a CPU demo). The cells are reused only when they are provably this
server's: the needle part in the run folder names the same server process (its URL, model and
`process_start_time_seconds`), every reused cell ran cold, and each length is taken whole or not at all.
A reused request has no time to first token: the needle check does not stream, so its figure says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks.needles import NeedleCell, NeedleGrid
from ..checks.registry import snapshot_server
from ..endpoint import Endpoint
from ..errors import ResultsError
from ..results import read_results
from ..secrets import strip_url_credentials
from .client import StreamResult

MEASURED_BY = "the needle check of this run"
ColdRun = tuple[float, StreamResult, dict[str, Any]]


@dataclass
class MeasuredCold:
    """Cold runs by prompt length (target tokens), and in words where they came from or why none were taken."""

    runs: dict[int, list[ColdRun]] = field(default_factory=dict)
    note: str = ""

    def for_length(self, length: int, depths: list[float] | None = None) -> list[ColdRun] | None:
        """The cells of one length (at `depths` when given, else every depth the needle grid ran); None when this
        length, or one of those depths, was not measured."""
        runs = self.runs.get(length)
        if not runs:
            return None
        if depths is None:
            return runs
        chosen = [run for run in runs if run[0] in depths]
        return chosen if len(chosen) == len(depths) else None


def _cell_run(cell: NeedleCell) -> ColdRun:
    """A needle cell as the benchmark's cold run: end to end only (non-streamed), its prompt and answer tokens."""
    result = StreamResult(ok=True, prompt_tokens=cell.prompt_tokens, output_tokens=len(cell.answer_token_ids),
                          cached_tokens=cell.cached_tokens, e2e_s=cell.seconds, text=cell.answer,
                          finish_reason=cell.finish_reason)
    info = {"needle_found": cell.found, "asked_prompt_tokens": cell.target_tokens, "measured_by": MEASURED_BY}
    return cell.depth, result, info


def needle_cold_runs(part: str | Path, endpoint: Endpoint) -> MeasuredCold:
    """The cold runs the needle notebook's part file (`Session.part_file("needles")`) holds for the server behind
    `endpoint`, with a note; empty (and the note says why) when there is no such file, it is another server's, or
    no length of it ran cold throughout."""
    path = Path(part)
    if not path.is_file():
        return MeasuredCold(note="no needle results in this run folder: the cold prompts are sent")
    try:
        check = read_results(path).check("needles")
    except ResultsError as exc:
        return MeasuredCold(note=f"the needle results are unreadable ({exc}): the cold prompts are sent")
    if check is None or not check.details.get("cells"):
        return MeasuredCold(note="the needle results hold no cells: the cold prompts are sent")
    server = check.details.get("server") or {}
    started = snapshot_server(endpoint).process_start_time  # as the needle check recorded it (`server_identity`)
    same = (started is not None and server.get("process_start_time") == started and server.get("model") == endpoint.model
            and server.get("base_url") == strip_url_credentials(endpoint.base_url))
    if not same:
        return MeasuredCold(note="the needle results in this run folder come from another server process (or do not "
                                 "say which): the cold prompts are sent")
    by_length: dict[int, list[NeedleCell]] = {}
    for cell in NeedleGrid.model_validate(check.details).cells:
        by_length.setdefault(cell.target_tokens, []).append(cell)
    runs = {length: [_cell_run(c) for c in cells] for length, cells in by_length.items()
            if not any(c.cached_tokens for c in cells)}
    skipped = sorted(set(by_length) - set(runs))
    note = (f"cold prompts: the {sum(len(r) for r in runs.values())} cells of {MEASURED_BY} on this same server "
            "(not sent twice)")
    if skipped:
        note += f"; lengths {', '.join(f'{n:,}' for n in skipped)} had a cell that was not cold and are sent again"
    return MeasuredCold(runs=runs, note=note)
