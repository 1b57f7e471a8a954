"""The subcommands by name: the module that implements each and its one-line help.

Kept apart from the modules themselves and importing nothing, so `cookbook --help` lists every command without
importing one (a command module pulls in pydantic, the check registry, matplotlib...), and so `_common` and the
package can both read it without an import cycle.
"""
from __future__ import annotations

# name -> one-line help; the module is cookbook/cli/<name>.py. Order: the order `cookbook --help` lists them in.
COMMANDS: dict[str, str] = {
    "setup": "build the CPU image and prepare the CPU recipes' models (once)",
    "recipe": "list, show, validate recipes and print launch blocks",
    "serve": "start a recipe's server (fixes, then vllm serve); Ctrl-C stops it",
    "verify": "run the Verified checks against a server; exit 0 only if every check meets the recipe",
    "bench": "throughput and latency: the Performance table, a sweep, the roofline",
    "run": "execute the notebook set headless against a server, into a report folder",
    "page": "render a recipe page (Markdown) from the recipe and a run's results",
    "compare": "compare two runs (run folders or results.json files)",
    "demo": "set up the CPU image and model, launch the CPU recipe, run every notebook, write the report",
    "doctor": "what a recipe needs against what this box has, one line each",
    "reference": "the numerics oracle's reference: record a golden file",
    "calibrate": "measure a recipe's tolerances on a clean server N times; write its calibration.yaml",
    "k8s": "Kubernetes manifests: a recipe's server, its Service and a validation Job",
}
