"""`cookbook doctor [RECIPE]`: what a recipe needs against what this box has, one line each.

Each probe returns a `Line` (ok, warn, FAIL, skip, or info for a fact about the box; what is needed; what is here).
A FAIL means the recipe cannot run here as it stands, and the command exits non-zero. The image is read, never
changed: its distributions, their commits, where its packages are, and the sha256 of every file the recipe's fix
profile pins, compared with the profile's pristine hashes and its fixes' post-fix hashes (read through
`cookbook.fixpack`); a fix of the profile without a payload in the pack is a FAIL (the fix step refuses). The Gaudi
probes parse `hl-smi`; tests feed them recorded outputs. Secrets are never printed: an HF token is "present" or
"absent"; whether one is needed comes from the cached model card (gated or not), else it is unknown.
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
from .fixpack import FixPack, load_pack
from .image import BF16_NATIVE, ImageEnv, cache_dir, cpu_flags, cpu_image, cpu_image_dir, cpu_image_ready, system_image
from .launch import _port_in_use, fallback_words
from .recipes import Recipe

State = Literal["ok", "warn", "FAIL", "skip", "info"]
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
        if self.state == "info":  # a fact about the box: what is here, then (if any) how to look elsewhere
            return f"info  {self.what}: {self.have}" + (f"; {self.need}" if self.need else "")
        return f"{self.state:<4}  {self.what}: need {self.need}; here {self.have}"


# ---------------------------------------------------------------------------------------------------------------
# The image: read by its own interpreter (standard library only), never changed

_IMAGE_PROBE = r"""
import hashlib, json, site, sys, importlib.metadata as md, importlib.util as iu
from pathlib import Path
request = json.loads(sys.argv[1])
places = [*getattr(site, "getsitepackages", lambda: [])(), getattr(site, "getusersitepackages", lambda: "")()]
places = [p for p in dict.fromkeys(places + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))])
          if p and Path(p).is_dir()]
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
print(json.dumps({"dists": dists, "files": files, "executable": sys.executable, "site": places}))
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


ELSEWHERE = "point --image-python at the image's interpreter, or run `cookbook doctor` inside the container"


def where_line(image: ImageEnv, found: dict) -> Line:
    """Which interpreter and site-packages the image's packages were read from, and how to read another."""
    places = found.get("site") or []
    return Line("info", "image read from", f"elsewhere: {ELSEWHERE}",
                f"{found.get('executable') or image.python}, packages in {', '.join(places) or 'no site-packages'}")


def payload_line(recipe: Recipe, pack: FixPack | None = None) -> Line:
    """Every fix the recipe's profile applies has its payload in the pack, or the fix step refuses (nothing written)."""
    pack = pack or load_pack()
    selected = pack.selection(recipe.fixes.profile, recipe.fixes.opt_in)
    missing = [fix.id for fix in selected if not fix.has_payload]
    need = f"a payload for each of the {len(selected)} fixes profile {recipe.fixes.profile} applies"
    if not missing:
        return Line("ok", "fix payloads", need, f"all {len(selected)} in {pack.root}")
    return Line("FAIL", "fix payloads", need, f"no payload file for {len(missing)}: {', '.join(missing)} (fix.json "
                                              "without payload.diff; the fix step refuses and writes nothing)")


def image_lines(recipe: Recipe, image: ImageEnv, reader: Callable[..., dict] = read_image,
                pack: FixPack | None = None) -> list[Line]:
    """Where the image's packages were read from, its pins (versions, commits) and the pinned files against the
    recipe's fix profile."""
    pack = pack or load_pack()
    profile = pack.profile(recipe.fixes.profile)
    selected = pack.selection(recipe.fixes.profile, recipe.fixes.opt_in)
    fixed: dict[str, set[str]] = {}
    for fix in selected:
        for target in fix.targets or []:
            if target.post:
                fixed.setdefault(target.path, set()).add(target.post)
    found = reader(image, [p.dist for p in profile.pins], list(profile.files))
    lines = [where_line(image, found)]
    for pin in profile.pins:
        have = found["dists"].get(pin.dist)
        need = " ".join(x for x in (pin.version and f"=={pin.version}", pin.version_prefix and f"{pin.version_prefix}*",
                                    pin.commit and f"commit {pin.commit[:9]}") if x)
        if have is None:
            lines.append(Line("FAIL" if pin.required else "warn", f"image {pin.dist}", need,
                              f"not installed in {image.python} ({ELSEWHERE})"))
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
                          f"package {', '.join(missing)} not installed in {image.python} ({ELSEWHERE})"))
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


# Model-card keys of a repository that asks for access before download (the hub's gating form).
GATE_KEYS = ("gated", "extra_gated_prompt", "extra_gated_fields", "extra_gated_heading", "extra_gated_description",
             "extra_gated_button_content")


def gated_in_cache(model_id: str, env: dict[str, str]) -> tuple[bool | None, str]:
    """Whether the model asks for access, from its model card in the HF cache (README.md's YAML header), and
    where that was read; None when no cached card says."""
    import yaml

    snapshots = hf_hub_dir(env) / f"models--{model_id.replace('/', '--')}" / "snapshots"
    cards = sorted(snapshots.glob("*/README.md")) if snapshots.is_dir() else []
    for card in cards:
        text = card.read_text(encoding="utf-8", errors="replace")
        if not text.startswith("---"):
            continue
        header = text.split("---", 2)[1] if text.count("---") >= 2 else ""
        try:
            meta = yaml.safe_load(header)
        except yaml.YAMLError:
            continue
        if isinstance(meta, dict):
            gate = [k for k in GATE_KEYS if meta.get(k)]
            return bool(gate), f"{card} ({gate[0]})" if gate else str(card)
    return None, f"no model card of {model_id} under {hf_hub_dir(env)}"


def token_line(env: dict[str, str], recipe: Recipe | None = None) -> Line:
    """A token present or absent (never its value), against whether this recipe's model needs one."""
    token_file = default_hf_cache(env) / "token"
    names = [n for n in TOKEN_VARIABLES if env.get(n)]
    present = bool(names) or token_file.is_file()
    where = ", ".join(names) if names else (str(token_file) if token_file.is_file() else "")
    have = f"present ({where})" if present else "absent"
    if recipe is None:
        return Line("ok" if present else "warn", "Hugging Face token", "one for gated weights (public ones need none)", have)
    if recipe.serve.weights is not None:
        return Line("ok", "Hugging Face token", "none: the weights are built here (`cookbook setup`), not downloaded "
                    "from the hub", have)
    gated, source = gated_in_cache(recipe.model.id, env)
    if gated is None:
        return Line("ok" if present else "warn", "Hugging Face token",
                    f"unknown whether {recipe.model.id} is gated ({source})", have)
    if not gated:
        return Line("ok", "Hugging Face token", f"none: {recipe.model.id} is not gated (model card {source})", have)
    return Line("ok" if present else "FAIL", "Hugging Face token",
                f"one: {recipe.model.id} is gated (model card {source}); pass it by name (HF_TOKEN)", have)


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
    if recipe is None:
        return [*box_lines(env, hl_smi, reader), token_line(env), proxy_line(env), cache_line(None)]
    lines: list[Line] = []
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
            lines.append(Line("FAIL", "image", f"{recipe.image.label.replace('`', '')} at {chosen.python}",
                              f"{exc} ({ELSEWHERE})"))
    lines.append(payload_line(recipe))
    dtype_line = cpu_dtype_line(recipe)
    if dtype_line is not None:
        lines.append(dtype_line)
    if recipe.hardware.kind != "cpu":
        lines += gaudi_lines(recipe, hl_smi)
    lines.append(port_line(port))
    lines += weights_lines(recipe, env)
    lines += [token_line(env, recipe), proxy_line(env), cache_line(recipe)]
    return lines


# ---------------------------------------------------------------------------------------------------------------
# The box alone: what it is, not a verdict


def _cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "unknown CPU"


def cpu_dtype_line(recipe: Recipe, cpuinfo: str | None = None) -> Line | None:
    """For a bf16 CPU recipe: whether this host computes bf16 natively (AVX-512 BF16 or AMX). Without it vllm-cpu still
    serves, correctly, but several times slower, and every deadline-bound run (the suite, the demo) takes longer."""
    dtype = str(recipe.serve.flags.get("dtype", ""))
    if recipe.image.kind != "vllm-cpu" or dtype not in ("bfloat16", "bf16"):
        return None
    flags = cpu_flags(cpuinfo)
    if not flags:
        return Line("skip", "CPU bf16", "AVX-512 BF16 or AMX for a bf16 recipe", "unknown (no flags in /proc/cpuinfo)")
    native = [f for f in BF16_NATIVE if f in flags]
    if native:
        return Line("ok", "CPU bf16", "AVX-512 BF16 or AMX for a bf16 recipe", ", ".join(native))
    isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "no AVX2"
    fallback = recipe.serve.without_native_bf16
    if fallback is not None:
        return Line("ok", "CPU bf16", "AVX-512 BF16 or AMX for a bf16 recipe",
                    f"{isa} only: bf16 would be emulated, so the launcher serves {fallback_words(fallback)} here "
                    f"(serve.without_native_bf16)")
    return Line("warn", "CPU bf16", "AVX-512 BF16 or AMX for a bf16 recipe",
                f"{isa} only: bf16 is emulated, prefill several times slower (measured on an AVX2-only host: 41 tokens/s "
                f"for SmolLM2, 171 in fp32; docs/measurements.md); results stay valid, deadlines stretch")


def _memory_gib() -> tuple[float, float] | None:
    """Total and available memory from /proc/meminfo, in GiB."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    kib = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE)}
    if "MemTotal" not in kib:
        return None
    return kib["MemTotal"] / 2**20, kib.get("MemAvailable", 0) / 2**20


def images_found(reader: Callable[..., dict] = read_image) -> list[str]:
    """The serving environments on this box: the images the cookbook built in its cache, and this machine's python3
    when it has vLLM (inside a vllm-gaudi container)."""
    found = []
    images = cache_dir() / "images"
    for folder in sorted(images.iterdir()) if images.is_dir() else []:
        if folder.is_dir() and (folder / "bin" / "python").exists():
            state = "built" if (folder / ".complete").exists() else "incomplete"
            found.append(f"{folder.name} ({state}, {folder / 'bin' / 'python'})")
    system = system_image()
    try:
        dists = reader(system, ["vllm", "vllm-gaudi", "habana-torch-plugin"], [])["dists"]
    except CookbookError:
        dists = {}
    have = [f"{name} {d['version']}" for name, d in dists.items() if d]
    if any(name.startswith("vllm") for name, d in dists.items() if d):
        found.append(f"{system.python}: {', '.join(have)}")
    return found


def box_lines(env: dict[str, str], hl_smi: Callable[[list[str]], str] | None = None,
              reader: Callable[..., dict] = read_image) -> list[Line]:
    """CPU, memory, Gaudi cards (hl-smi) and the serving images found: a description of the box."""
    memory = _memory_gib()
    lines = [Line("info", "CPU", "", f"{_cpu_name()}, {os.cpu_count() or '?'} logical cores"),
             Line("info", "memory", "", f"{memory[0]:.1f} GiB total, {memory[1]:.1f} GiB available" if memory
                  else "unknown (no /proc/meminfo)")]
    cards = gaudi_lines(None, hl_smi)
    lines += [Line("info", x.what, "", x.have) if x.state == "skip" else x for x in cards]
    images = images_found(reader)
    lines.append(Line("info", "images", "" if images else "`cookbook setup` builds the CPU one",
                      "; ".join(images) if images else "none found"))
    return lines


def describe_box(lines: list[Line]) -> str:
    """The box in one sentence, from its lines: CPU, memory, cards, images."""
    by = {x.what: x.have for x in lines}
    parts = [by.get("CPU", ""), by.get("memory", "").split(",")[0] + " memory",
             "Gaudi: " + by.get("Gaudi cards", "unknown"), "images: " + by.get("images", "none found")]
    return "; ".join(p for p in parts if p)


def failed(lines: list[Line]) -> bool:
    return any(line.state == "FAIL" for line in lines)
