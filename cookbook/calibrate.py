"""Every tolerance from measurement: run a recipe's checks N times against a clean server, keep the largest noise
each tolerance saw, and write calibration.yaml beside the recipe with a stated margin above it.

The checks publish what a clean run measured in their result's `details["noise"]` (keyed by the tolerance names of
`cookbook.checks.kit.tolerances`; `needles.model_misses` lists the known-answer cells the model itself misses). A
tolerance no run measured is left out, so the checks fall back to the recipe's values and the dtype's defaults.
Where the allowed value reaches the smallest fault its check exists for (`FAULT_FLOOR`), the calibration says so:
a check judged by it then reports that it cannot tell the fault from the noise instead of passing.
"""
from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from .checks.kit.tolerances import FAULT_FLOOR, NAMES, REFERENCE_MEAN, REFERENCE_TOPK, dtype_name
from .errors import CookbookError, LaunchError, UsageError
from .pages import write_atomic
from .progress import Progress
from .recipes import CALIBRATION_FILE, CalibratedValue, Calibration, Recipe
from .results import RunResults

MARGIN_FACTOR = 1.5  # a clean run's worst case is one sample of the noise: half as much again before a check fails
MISSES = "needles.model_misses"
# The rounding step of a logit in the binade [16, 32), where the top logits of the served models sit: two clean runs
# that round one logit differently already differ by one such step, however few runs calibration saw.
LOGIT_SCALE = 16.0
MANTISSA_BITS = {"bf16": 7, "fp16": 10, "fp32": 23, "fp8": 7}  # fp8 recipes compute their logits in bf16
PROPORTIONAL_ONLY = frozenset({REFERENCE_MEAN, REFERENCE_TOPK})  # a mean, a probability distance: no logit step
SMALLEST_ALLOWED = 1e-4  # a tolerance is positive even where the runs measured exactly 0
EXCERPT = 160
FAILURES_NOTE = "checks failed on the clean server"

Say = Callable[[str], None]


def rounding_step(dtype: str) -> float:
    """One rounding step of the served dtype at the logits' scale (bf16: 0.125 nats)."""
    return LOGIT_SCALE * 2.0 ** -MANTISSA_BITS.get(dtype_name(dtype), MANTISSA_BITS["bf16"])


def allowed_for(name: str, measured: float, factor: float, dtype: str) -> float:
    """`measured` with the margin: x`factor`, and for a logprob difference at least one rounding step above it."""
    value = measured * factor
    if name not in PROPORTIONAL_ONLY:
        value = max(value, measured + rounding_step(dtype))
    return _round_up(max(value, SMALLEST_ALLOWED))


def margin_words(factor: float, dtype: str) -> str:
    step = rounding_step(dtype)
    return (f"allowed = max({factor:g} x measured, measured + {step:g}) for logprob differences and margins "
            f"({step:g} nats: one {dtype_name(dtype)} rounding step of a logit in [16, 32)); {factor:g} x measured for "
            f"{REFERENCE_MEAN} and {REFERENCE_TOPK}; measured = the largest value any clean run showed")


def _round_up(value: float) -> float:
    """Three significant digits, never below `value` (the written tolerance must still cover what was measured)."""
    quantum = 10.0 ** (math.floor(math.log10(value)) - 2)
    return round(math.ceil(value / quantum - 1e-9) * quantum, max(0, -int(math.floor(math.log10(quantum)))))


# -- from runs to a calibration ---------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def calibration_from(
    results: list[RunResults], recipe: Recipe, factor: float = MARGIN_FACTOR, when: str | None = None,
    on: str | None = None, notes: list[str] | None = None,
) -> Calibration:
    """The calibration N runs' results measure: per tolerance the largest value seen and the allowed value above it,
    the cells the model misses, and notes on what a reader must know (failed checks, noise as large as a fault)."""
    if not results:
        raise CookbookError("calibrate: no runs to calibrate from")
    dtype = dtype_name(recipe.precision.dtype)
    notes = list(notes or [])
    seen: dict[str, list[float]] = {}
    runs_seen: dict[str, set[int]] = {}
    misses: dict[str, set[int]] = {}
    needle_runs: set[int] = set()
    failed_runs: set[int] = set()
    for run, result in enumerate(results, start=1):
        if result.stopped:
            notes.append(f"run {run} stopped early: {result.stopped}")
        for check in result.checks:
            if not check.ok:
                failed_runs.add(run)
                notes.append(f"run {run}: {check.name} {check.status} on the clean server: {check.result[:EXCERPT]}")
            noise = check.details.get("noise")
            if not isinstance(noise, dict):
                continue
            for name, value in noise.items():
                if name == MISSES:
                    needle_runs.add(run)
                    for cell in value or []:
                        misses.setdefault(str(cell), set()).add(run)
                    continue
                if name not in NAMES:
                    notes.append(f"run {run}: {check.name} published noise {name!r}, not a tolerance name; ignored")
                    continue
                if value is None:
                    continue
                number = _number(value)
                if number is None:
                    notes.append(f"run {run}: {check.name} published {name} = {value!r}, not a number >= 0; ignored")
                    continue
                seen.setdefault(name, []).append(number)
                runs_seen.setdefault(name, set()).add(run)
    if failed_runs:
        notes.insert(0, f"{FAILURES_NOTE} in {len(failed_runs)} of {len(results)} runs "
                        f"(run {', '.join(map(str, sorted(failed_runs)))}): a clean server should pass; the values "
                        "below include those runs' noise, read the failures before trusting them")
    values: dict[str, CalibratedValue] = {}
    for name in NAMES:
        if name not in seen:
            continue
        measured = max(seen[name])
        allowed = allowed_for(name, measured, factor, dtype)
        values[name] = CalibratedValue(measured=round(measured, 6), allowed=allowed, runs_seen=len(runs_seen[name]))
        floor = FAULT_FLOOR.get(name)
        if floor is not None and allowed >= floor:
            notes.append(f"{name}: allowed {allowed:g} (measured {measured:g}) reaches the {floor:g} a fault of this "
                         "kind moves: the noise is as large as the fault, so the checks judged by it say so instead "
                         "of passing or failing")
    for cell, runs in sorted(misses.items()):
        if len(runs) < len(needle_runs):
            notes.append(f"{MISSES}: {cell} missed in {len(runs)} of {len(needle_runs)} runs (not every run)")
    return Calibration(
        when=when or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        on=on or machine_description(recipe),
        runs=len(results),
        margin=margin_words(factor, dtype),
        values=values,
        model_misses=sorted(misses),
        notes=notes,
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_description(recipe: Recipe) -> str:
    """The recipe's hardware, this machine (the server's own for a CPU recipe, else the client's) and the image."""
    hardware = recipe.hardware
    return (f"{hardware.description} ({hardware.kind}); this machine: {platform.platform()}, {_cpu_model()}, "
            f"{os.cpu_count() or '?'} CPUs; image: {recipe.image.label.replace('`', '')}")


def saw_failures(calibration: Calibration) -> bool:
    """Whether a check failed on the clean server in any of the runs (the calibration's first note says so)."""
    return any(note.startswith(FAILURES_NOTE) for note in calibration.notes)


# -- writing --------------------------------------------------------------------------------------------------------


HEADER = "# Written by `cookbook calibrate` from clean runs; run it again rather than editing by hand.\n"


def calibration_yaml(calibration: Calibration) -> str:
    return HEADER + yaml.safe_dump(calibration.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=120)


def calibration_path(recipe: Recipe) -> Path:
    return recipe.path.parent / CALIBRATION_FILE


def write_calibration(recipe: Recipe, calibration: Calibration) -> Path:
    """calibration.yaml beside the recipe, atomically: a temporary file in the same folder renamed over the old one,
    so an error or Ctrl-C leaves the old file (or none) and never half a file."""
    path = calibration_path(recipe)
    text = calibration_yaml(calibration)
    Calibration.model_validate(yaml.safe_load(text))  # what the loader will read back
    return write_atomic(path, text)


# -- running ----------------------------------------------------------------------------------------------------------


def _quiet(_line: str) -> None:
    return None


def calibrate(
    recipe: Recipe,
    base_url: str | None = None,
    runs: int = 3,
    checks: list[str] | None = None,
    margin: float = MARGIN_FACTOR,
    restart: bool | None = None,
    params: dict[str, Any] | None = None,
    launch_profile: str | None = None,
    request_timeout_s: float = 60.0,
    write: bool = True,
    say: Say = _quiet,
    progress: Progress | None = None,
) -> Calibration:
    """Run the recipe's suite (or `checks`) `runs` times against a clean server and calibrate from what it measured.

    `base_url`: attach to a running server (never restarted, which the notes say); None: start the recipe's own
    server, and by default (`restart`) a fresh one for every run, so the runs are independent. The checks run on the
    recipe without its previous calibration, so what they measure is not judged by the values being replaced.
    `write`: write calibration.yaml beside the recipe (atomically); else only return it."""
    from .checks import CheckContext, run_checks, selected_checks
    from .checks.registry import check_params

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError(f"--runs: must be a whole number of runs >= 1, got {runs!r}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 1):
        raise UsageError(f"--margin: must be a factor >= 1 (e.g. {MARGIN_FACTOR}), got {margin!r}")
    if base_url is not None and restart:
        raise UsageError("--base-url: calibrate cannot restart a server it did not start; attach without restarting")
    if base_url is not None and launch_profile is not None:
        raise UsageError("--launch-profile: only when calibrate starts the recipe's server (no --base-url)")
    params = check_params(dict(params or {}))
    selected_checks(checks, recipe)  # unknown names fail before any request
    clean = recipe.model_copy(update={"calibration": None})
    notes: list[str] = []
    if base_url is not None:
        notes.append("attached to a running server: one server process for every run, never restarted, so noise "
                      "that depends on a start (warm-up, kernel choice) was seen once")
    elif restart is False:
        notes.append("one launched server for every run (not restarted between runs)")
    results: list[RunResults] = []

    def run_once(url: str, launched: dict[str, Any]) -> None:
        from .launch import attach

        endpoint = attach(url, recipe.served_model_name)
        endpoint.timeout_s = min(endpoint.timeout_s, request_timeout_s)
        run_params = {**params, **({"launch_overrides": launched} if launched else {})}
        ctx = CheckContext(endpoint, clean, params=run_params, request_timeout_s=request_timeout_s)
        say(f"calibrate: run {len(results) + 1} of {runs}")
        result = run_checks(ctx, checks, progress=progress)
        results.append(result)
        failed = [f"{c.name} ({c.status})" for c in result.checks if not c.ok]
        say(f"calibrate: run {len(results)}: {len(result.checks)} checks"
            + (f", not passed on the clean server: {', '.join(failed)}" if failed else ", all passed"))

    if base_url is not None:
        for _ in range(runs):
            run_once(base_url, {})
    else:
        _run_launched(recipe, runs, restart is not False, launch_profile, run_once, say, progress)
    calibration = calibration_from(results, recipe, float(margin), notes=notes)
    if not calibration.values and not calibration.model_misses:
        names = ", ".join(sorted({c.name for r in results for c in r.checks})) or "none"
        raise CookbookError(f"calibrate: no check published a noise value in {runs} runs (checks run: {names}); "
                            "nothing written")
    if write:
        write_calibration(recipe, calibration)
    return calibration


def _run_launched(
    recipe: Recipe, runs: int, restart: bool, launch_profile: str | None,
    run_once: Callable[[str, dict[str, Any]], None], say: Say, progress: Progress | None,
) -> None:
    """The recipe's own server: a fresh one per run (`restart`), else one for all; always stopped after."""
    from .launch import Server, free_port, launch_flags, start_or_report

    flags = launch_flags(recipe, launch_profile)
    starts = runs if restart else 1
    for start in range(starts):
        server = Server(recipe, port=free_port(), extra_flags=flags, say=say, progress=progress)
        try:
            ready = start_or_report(server, say)
            if ready is None:
                raise LaunchError(f"calibrate: the recipe's server did not come up (start {start + 1} of {starts})")
            say(ready.line())
            for _ in range(1 if restart else runs):
                run_once(ready.base_url, flags)
        finally:
            server.stop()
