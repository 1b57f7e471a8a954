#!/usr/bin/env python3
"""Does a clean CPU recipe pass its whole default suite every time? Run `cookbook verify RECIPE --launch` N times
per recipe, each run on a server of its own started for it, and count the runs in which every check met the
recipe's expectation, with the checks that did not and why.

A check that passes 9 runs in 10 is a flaky check or a flaky server, and either way the demo and CI would fail
one run in ten: this is how we know the default suite is steady, and which row is not. Each run is the user's
command (a fresh process and server, the recipe's default checks), not a loop inside one process.

    scripts/in-env.sh python benchmarks/repeat_verify.py --runs 10 --json runs/repeat-verify.json
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cookbook.recipes import list_recipes
from cookbook.results import ACCEPTED_STATUSES


def cpu_recipes() -> list[str]:
    """Every recipe the CPU image serves (the ones this machine can run)."""
    return [r.id for r in list_recipes() if r.image.kind == "vllm-cpu"]


def one_run(recipe: str, out: Path, checks: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "cookbook", "verify", recipe, "--launch", "--out", str(out)]
    if checks:
        argv += ["--checks", checks]
    started = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    (out / "verify.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "verify.log").write_text(proc.stdout)
    results_file = out / "results.json"
    checks_seen: list[dict[str, Any]] = []
    if results_file.exists():
        for c in json.loads(results_file.read_text()).get("checks", []):
            note = c["evidence"][0]["note"] if c.get("evidence") else c.get("result", "")
            checks_seen.append({"name": c["name"], "status": c["status"], "note": note})
    not_met = [c for c in checks_seen if c["status"] not in ACCEPTED_STATUSES]
    return {
        "recipe": recipe,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "checks": len(checks_seen),
        "met": proc.returncode == 0 and bool(checks_seen) and not not_met,
        "not_met": not_met,
        "inconclusive": [c["name"] for c in checks_seen if c["status"] == "inconclusive"],
        "tail": proc.stdout.strip().splitlines()[-3:] if proc.returncode not in (0, 1) else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", help="comma-separated recipe ids (default: every vllm-cpu recipe)")
    parser.add_argument("--runs", type=int, default=10, help="runs per recipe (default 10)")
    parser.add_argument("--checks", help="--checks for verify (default: the recipe's whole default suite)")
    parser.add_argument("--out", type=Path, default=Path("runs/repeat-verify"), help="folder for each run's results")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    args = parser.parse_args()
    recipes = args.recipes.split(",") if args.recipes else cpu_recipes()
    runs: list[dict[str, Any]] = []
    for recipe in recipes:
        for k in range(1, args.runs + 1):
            run = one_run(recipe, args.out / recipe.replace("/", "--") / f"run-{k:02d}", args.checks)
            runs.append(run)
            failed = "; ".join(f"{c['name']} {c['status']}: {c['note'][:120]}" for c in run["not_met"])
            print(f"{recipe} run {k}/{args.runs}: exit {run['exit']}, {run['checks']} checks, {run['wall_s']:.0f} s"
                  + (f", not met: {failed}" if failed else "")
                  + (f", inconclusive: {', '.join(run['inconclusive'])}" if run["inconclusive"] else "")
                  + (f" | {' / '.join(run['tail'])}" if run["tail"] else ""), flush=True)
    summary = {}
    for recipe in recipes:
        mine = [r for r in runs if r["recipe"] == recipe]
        failures = collections.Counter(c["name"] for r in mine for c in r["not_met"])
        walls = sorted(r["wall_s"] for r in mine)
        summary[recipe] = {"met": sum(r["met"] for r in mine), "runs": len(mine), "failures": dict(failures),
                           "wall_s_median": walls[len(walls) // 2] if walls else None}
        print(f"{recipe}: every check met in {summary[recipe]['met']} of {len(mine)} runs"
              + (f"; not met: {dict(failures)}" if failures else "")
              + (f"; median wall {summary[recipe]['wall_s_median']:.0f} s" if walls else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0 if all(s["met"] == s["runs"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
