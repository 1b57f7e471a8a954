"""Kubernetes manifests for a recipe: its server as a Deployment and a Service, and a Job that validates it.

Gaudi clusters run on Kubernetes with the Habana device plugin exposing `habana.ai/gaudi`; this renders what the
`docker run` of `cookbook.container` does, for such a cluster:

- the server: a Deployment of one pod (strategy Recreate) requesting the recipe's cards (a CPU recipe requests CPU
  and memory instead), the image the recipe pins, and as its command the container's script, i.e. the Launch block's
  fix step then `vllm serve` exactly as the recipe renders them, run by `bash -c`. The recipe's environment is set
  by value, except secret-named variables (and the variables that stand in for secret flags), which come from a
  Secret by name (`secretKeyRef`), so no secret value is ever written into a manifest. A startupProbe on `/health`
  gives the engine a start-up budget (a parameter), then a readinessProbe keeps the Service to a serving pod. The
  Hugging Face cache lives on a PersistentVolumeClaim, `/dev/shm` is a memory-backed emptyDir, and `$COOKBOOK` is a
  copy of the checkout that an init container takes from the cookbook image (the stock server image stays stock);
- a Service in front of it;
- a Job that waits for the Service's `/health`, then runs `cookbook run RECIPE --base-url http://<service>:<port>`
  (papermill, the same notebooks) in the cookbook image, its run folder on a PersistentVolumeClaim;
- a Pod that mounts that claim, applied afterwards, to copy the report out with `kubectl cp`.

Why a Deployment and not a StatefulSet: one replica whose identity does not matter, and a cache claim of its own that
outlives the workload (weights are downloaded once). Strategy Recreate, because a rolling update would start the new
pod while the old one holds every card (it would wait forever), and two pods must never share the cache claim.

Kubernetes expands `$(NAME)` in commands and environment values; every `$` that would start such a reference is
doubled, so the container receives the rendered text byte for byte (a recipe value `$(HF_TOKEN)` stays text).

Rendering is pure: `render_recipes` takes a list of recipes, so a fleet renders into one set.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import __version__
from .container import (CONTAINER_COOKBOOK, CONTAINER_HF_HOME, CONTAINER_PORT, GAUDI_RUNTIME_ENV, container_script,
                        default_image, secret_names)
from .errors import CookbookError
from .models import MODEL_FORMAT
from .recipes import RECIPES_DIR, Recipe

GAUDI_RESOURCE = "habana.ai/gaudi"
# The cookbook image (the cluster provides it): this checkout at /cookbook with its environment installed and
# `cookbook` on PATH; for the CPU recipes, their models prepared under /cookbook-cache (`COOKBOOK_CACHE=/cookbook-cache
# cookbook setup` at build time).
COOKBOOK_IMAGE_CHECKOUT = "/cookbook"
COOKBOOK_IMAGE_CACHE = "/cookbook-cache"
DEFAULT_COOKBOOK_IMAGE = f"gaudi-cookbook:{__version__}"
DEFAULT_SECRET = "gaudi-cookbook-secrets"
# In the server pod: the checkout copy at $COOKBOOK (as in the docker run) and prepared weights at $COOKBOOK_MODELS.
SERVER_MODELS = "/cookbook-models"
RUNS_MOUNT = "/runs"
# Start-up budget: the first start downloads the weights into the cache claim (69 to 159 GB for the seeds), then loads
# them; with warm-up on, vllm-gaudi also compiles every bucket before /health answers. One hour, by default.
DEFAULT_STARTUP_BUDGET_S = 3600
PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 5
READY_FAILURES = 3
# The Job waits for /health this much longer than the server's budget: scheduling and pulling two images first.
WAIT_MARGIN_S = 900
WAIT_EVERY_S = 10
# Passed from the Secret when it holds it (optional): a token for gated weights.
OPTIONAL_SECRETS = ("HF_TOKEN",)
# CPU recipes: vLLM's CPU build reserves one core for the API server and binds the model to another.
CPU_REQUEST = "2"
CPU_KV_DEFAULT_GIB = 4.0  # vLLM's CPU default when VLLM_CPU_KVCACHE_SPACE is unset
CPU_OVERHEAD_GIB = 3.0  # beyond KV pool and weights: the SmolLM2 server's whole process tree is about 5 GiB with a 2 GiB pool
SHM_PER_CARD_GIB = 4
CPU_SHM = "1Gi"
RUNS_SIZE = "5Gi"
READER_SECONDS = 86400  # the report reader lives a day at most
MAX_NAME = 40  # leaves room for the longest suffix ("-report-reader") within a 63-character name
FILES = ("10-storage.yaml", "20-server.yaml", "30-run-job.yaml", "copy-out/report-reader.yaml")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BYTES = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_EXPANSION = re.compile(r"\$(?=[$(])")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

WAIT_SCRIPT = """\
import sys, time, urllib.request
url, budget, every = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
deadline, why = time.monotonic() + budget, "no answer yet"
while True:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            if answer.status == 200:
                print("server ready:", url, flush=True)
                sys.exit(0)
            why = "HTTP %d" % answer.status
    except Exception as exc:
        why = str(exc)
    if time.monotonic() >= deadline:
        sys.exit("server not ready after %.0f s: %s (%s)" % (budget, url, why))
    time.sleep(every)
"""


class K8sOptions(BaseModel):
    """What the manifests need besides the recipe; every field is a flag of `cookbook k8s render`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = Field(None, description="The server image (default `<kind>:<tag>` from the recipe's pins, "
                              "e.g. vllm-gaudi:v0.26.0, the tag `cookbook recipe container` uses)")
    cookbook_image: str = Field(DEFAULT_COOKBOOK_IMAGE, description="The image with this checkout at /cookbook, its "
                                "environment and `cookbook` on PATH: the checkout for the server, the run Job")
    name: str | None = Field(None, description="Base name of the objects (default from the recipe id)")
    namespace: str | None = Field(None, description="Namespace of every object (default: kubectl's current one)")
    secret: str = Field(DEFAULT_SECRET, description="The Secret holding secret-named variables, one key per name")
    storage_class: str | None = Field(None, description="Storage class of both claims (default: the cluster's default)")
    cache_size: str | None = Field(None, description="Hugging Face cache claim (default 1.2 x the weights + 10 Gi)")
    runs_size: str = Field(RUNS_SIZE, description="Run-folder claim")
    shm_size: str | None = Field(None, description="Size limit of /dev/shm (default 4 Gi per Gaudi card, 1 Gi on CPU)")
    startup_budget_s: int = Field(DEFAULT_STARTUP_BUDGET_S, description="Seconds the server may take to answer /health "
                                  "before Kubernetes restarts it (startupProbe)")
    hardware: str | None = Field(None, description="What serves the recipe, KIND:DESCRIPTION, for the run's results "
                                 "(default: not stated, as a run never assumes the recipe's hardware)")
    port: int = Field(CONTAINER_PORT, description="The Service's port")

    @field_validator("image", "cookbook_image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE.match(value):
            raise ValueError(f"not an image reference: {value!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > MAX_NAME or not _DNS_1035.match(value)):
            raise ValueError(f"{value!r}: lower-case letters, digits and '-', starting with a letter, at most {MAX_NAME}")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not _DNS_LABEL.match(value)):
            raise ValueError(f"{value!r} is not a namespace name (lower-case letters, digits and '-')")
        return value

    @field_validator("secret", "storage_class")
    @classmethod
    def _subdomain(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            raise ValueError(f"{value!r} is not an object name (lower-case letters, digits, '-' and '.')")
        return value

    @field_validator("cache_size", "runs_size", "shm_size")
    @classmethod
    def _bytes(cls, value: str | None) -> str | None:
        if value is not None and not _BYTES.match(value):
            raise ValueError(f"{value!r} is not a size such as 200Gi or 512Mi")
        return value

    @field_validator("startup_budget_s")
    @classmethod
    def _budget(cls, value: int) -> int:
        if not 60 <= value <= 86400:
            raise ValueError(f"{value} s: give 60 to 86400 seconds")
        return value

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, value: str | None) -> str | None:
        from .results import parse_hardware  # the same rule `cookbook run --hardware` applies

        try:
            parse_hardware(value)
        except CookbookError as exc:
            raise ValueError(str(exc).removeprefix("--hardware: ")) from None
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError(f"{value} is not a TCP port")
        return value


_FLAGS = {"startup_budget_s": "--startup-budget"}


def make_options(**values: Any) -> K8sOptions:
    """K8sOptions from flag values (None: the default); a bad one is one line naming its flag."""
    given = {k: v for k, v in values.items() if v is not None}
    try:
        return K8sOptions(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = str(err["loc"][0]) if err["loc"] else "options"
        flag = _FLAGS.get(where, "--" + where.replace("_", "-"))
        raise CookbookError(f"{flag}: {err['msg'].removeprefix('Value error, ')}") from None


@dataclass
class RecipeManifests:
    """One recipe's objects, grouped by the file they are written to (in apply order)."""

    recipe: str
    name: str
    service_url: str
    source: str  # the recipe file, relative to the checkout where it is in it
    files: dict[str, list[dict[str, Any]]]
    secret_keys: dict[str, bool] = field(default_factory=dict)  # key -> required

    def objects(self) -> list[dict[str, Any]]:
        return [obj for objects in self.files.values() for obj in objects]


# ---------------------------------------------------------------------------------------------------------------
# Names, sizes and the values Kubernetes would otherwise expand


def escape_expansion(text: str) -> str:
    """Double every `$` that starts `$(` or `$$`, so Kubernetes' variable expansion gives back `text` unchanged."""
    return _EXPANSION.sub("$$", text)


def object_name(recipe: Recipe, options: K8sOptions | None = None) -> str:
    """The base name of a recipe's objects: `--name`, else its id in lower case (a hash keeps long ids apart)."""
    if options is not None and options.name:
        return options.name
    slug = re.sub(r"[^a-z0-9]+", "-", recipe.id.lower()).strip("-") or "recipe"
    if not slug[0].isalpha():
        slug = "r-" + slug
    if len(slug) > MAX_NAME:
        digest = hashlib.sha256(recipe.id.encode()).hexdigest()[:6]
        slug = slug[:MAX_NAME - 7].rstrip("-") + "-" + digest
    return slug


def _gib(value: float) -> str:
    return f"{math.ceil(value)}Gi"


def cache_size(recipe: Recipe, options: K8sOptions) -> str:
    return options.cache_size or _gib(recipe.precision.weights_gb * 1.2 + 10)


def shm_size(recipe: Recipe, options: K8sOptions) -> str:
    if options.shm_size:
        return options.shm_size
    return CPU_SHM if recipe.hardware.kind == "cpu" else f"{SHM_PER_CARD_GIB * recipe.hardware.cards}Gi"


def server_port(recipe: Recipe) -> int:
    """The port `vllm serve` listens on in the pod; a loopback-only server could not be probed or served."""
    host = recipe.serve.flags.get("host")
    if isinstance(host, str) and host in _LOOPBACK:
        raise CookbookError(f"{recipe.path}: serve.flags.host: {host} is loopback only; a pod's probes and its Service "
                            "reach the pod's address")
    port = recipe.serve.flags.get("port", CONTAINER_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise CookbookError(f"{recipe.path}: serve.flags.port: {port!r} is not a TCP port")
    return port


def server_resources(recipe: Recipe) -> dict[str, Any]:
    """Gaudi: the recipe's cards (requests = limits, as extended resources must); no CPU limit, since the seeds see
    loading throttled under a CPU quota. CPU: cores and the memory of KV pool + weights + the engine's own."""
    if recipe.hardware.kind != "cpu":
        cards = str(recipe.hardware.cards)
        return {"requests": {GAUDI_RESOURCE: cards}, "limits": {GAUDI_RESOURCE: cards}}
    raw = recipe.environment.get("VLLM_CPU_KVCACHE_SPACE")
    try:
        kv = float(raw) if raw is not None else CPU_KV_DEFAULT_GIB
    except ValueError:
        raise CookbookError(f"{recipe.path}: environment.VLLM_CPU_KVCACHE_SPACE: {raw!r} is not a number of GiB") from None
    return {"requests": {"cpu": CPU_REQUEST, "memory": _gib(kv + recipe.precision.weights_gb + CPU_OVERHEAD_GIB)}}


# ---------------------------------------------------------------------------------------------------------------
# The objects


def _metadata(name: str, instance: str, component: str, options: K8sOptions,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if options.namespace:
        meta["namespace"] = options.namespace
    meta["labels"] = _labels(instance, component)
    if annotations:
        meta["annotations"] = annotations
    return meta


def _labels(instance: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "gaudi-cookbook", "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": component}


def _annotations(recipe: Recipe) -> dict[str, str]:
    return {"gaudi-cookbook/recipe": recipe.id, "gaudi-cookbook/image-pins": recipe.image.label.replace("`", "")}


def _claim(name: str, instance: str, size: str, options: K8sOptions) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if options.storage_class:
        spec["storageClassName"] = options.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _metadata(name, instance, "storage", options), "spec": spec}


def _secret_ref(variable: str, secret: str, key: str, optional: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": variable, "valueFrom": {"secretKeyRef": ref}}


def _server_env(recipe: Recipe, options: K8sOptions, keys: dict[str, bool]) -> list[dict[str, Any]]:
    plain: dict[str, str] = {"HF_HOME": CONTAINER_HF_HOME, "COOKBOOK": CONTAINER_COOKBOOK}
    if recipe.serve.weights is not None:
        plain["COOKBOOK_MODELS"] = SERVER_MODELS
    if recipe.image.kind == "vllm-gaudi":
        plain.update(GAUDI_RUNTIME_ENV)
    hidden = secret_names(recipe)
    entries: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in plain.items()}
    for variable, value in recipe.environment.items():
        if variable in hidden:
            entries[variable] = _secret_ref(variable, options.secret, variable, optional=False)
        else:
            entries[variable] = {"name": variable, "value": escape_expansion(value)}
    for variable in hidden:  # the variables vLLM reads instead of a secret flag
        entries.setdefault(variable, _secret_ref(variable, options.secret, variable, optional=False))
    for variable in OPTIONAL_SECRETS:
        entries.setdefault(variable, _secret_ref(variable, options.secret, variable, optional=True))
    for entry in entries.values():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            keys[ref["key"]] = keys.get(ref["key"], False) or not ref.get("optional", False)
    return list(entries.values())


def _probe(budget_s: int | None) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_S,
                             "timeoutSeconds": PROBE_TIMEOUT_S}
    probe["failureThreshold"] = math.ceil(budget_s / PROBE_PERIOD_S) if budget_s else READY_FAILURES
    return probe


def _copy_checkout(recipe: Recipe) -> str:
    steps = ["set -e", "mkdir -p /shared/checkout", f"cp -a {COOKBOOK_IMAGE_CHECKOUT}/. /shared/checkout/"]
    if recipe.serve.weights is not None:
        prepared = f"{COOKBOOK_IMAGE_CACHE}/models-v{MODEL_FORMAT}/{recipe.serve.weights.prepare}"
        steps += ["mkdir -p /shared/models", f"cp -a {prepared} /shared/models/"]
    return "\n".join(steps) + "\n"


def _deployment(recipe: Recipe, name: str, options: K8sOptions, keys: dict[str, bool]) -> dict[str, Any]:
    port = server_port(recipe)
    mounts: list[dict[str, Any]] = [
        {"name": "hf-cache", "mountPath": CONTAINER_HF_HOME},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "cookbook", "mountPath": CONTAINER_COOKBOOK, "subPath": "checkout", "readOnly": True},
    ]
    if recipe.serve.weights is not None:
        mounts.append({"name": "cookbook", "mountPath": SERVER_MODELS, "subPath": "models", "readOnly": True})
    server = {
        "name": "server",
        "image": options.image or default_image(recipe),
        "command": ["bash", "-c", escape_expansion(container_script(recipe))],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": _server_env(recipe, options, keys),
        "resources": server_resources(recipe),
        "startupProbe": _probe(options.startup_budget_s),
        "readinessProbe": _probe(None),
        "volumeMounts": mounts,
    }
    checkout = {
        "name": "cookbook-checkout",
        "image": options.cookbook_image,
        "command": ["sh", "-c", _copy_checkout(recipe)],
        "volumeMounts": [{"name": "cookbook", "mountPath": "/shared"}],
    }
    pod_labels = _labels(name, "server")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(name, name, "server", options, _annotations(recipe)),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": _annotations(recipe)},
                "spec": {
                    "enableServiceLinks": False,  # no <SERVICE>_PORT variables: vLLM reads VLLM_PORT itself
                    "initContainers": [checkout],
                    "containers": [server],
                    "volumes": [
                        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{name}-hf-cache"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(recipe, options)}},
                        {"name": "cookbook", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _service(recipe: Recipe, name: str, options: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(name, name, "server", options, _annotations(recipe)),
        "spec": {"type": "ClusterIP", "selector": _labels(name, "server"),
                 "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}]},
    }


def _job(recipe: Recipe, name: str, url: str, options: K8sOptions, keys: dict[str, bool]) -> dict[str, Any]:
    hardware = options.hardware or f"unknown:not stated (the server behind Kubernetes Service {name})"
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    if "api-key" in recipe.serve.flags:  # the client sends the server's key, read from the same Secret key
        env.append(_secret_ref("OPENAI_API_KEY", options.secret, "VLLM_API_KEY", optional=False))
        keys["VLLM_API_KEY"] = True
    wait_s = options.startup_budget_s + WAIT_MARGIN_S
    wait = {
        "name": "wait-for-server",
        "image": options.cookbook_image,
        "command": ["python3", "-c", escape_expansion(WAIT_SCRIPT), f"{url}/health", str(wait_s), str(WAIT_EVERY_S)],
    }
    run = {
        "name": "run",
        "image": options.cookbook_image,
        # $(POD_NAME) is Kubernetes' expansion: each attempt writes a fresh run folder on the claim.
        "command": ["cookbook", "run", escape_expansion(recipe.id), "--base-url", url,
                    "--hardware", escape_expansion(hardware), "--out", f"{RUNS_MOUNT}/$(POD_NAME)"],
        "env": env,
        "volumeMounts": [{"name": "runs", "mountPath": RUNS_MOUNT}],
    }
    labels = _labels(name, "run")
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(f"{name}-run", name, "run", options, _annotations(recipe)),
        "spec": {
            "backoffLimit": 0,  # a run that failed a check is an answer, not a reason to run again
            "template": {
                "metadata": {"labels": labels, "annotations": _annotations(recipe)},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "initContainers": [wait],
                    "containers": [run],
                    "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": f"{name}-runs"}}],
                },
            },
        },
    }


def _reader(name: str, options: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _metadata(f"{name}-report-reader", name, "report-reader", options),
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "reader", "image": options.cookbook_image, "command": ["sleep", str(READER_SECONDS)],
                            "volumeMounts": [{"name": "runs", "mountPath": RUNS_MOUNT, "readOnly": True}]}],
            "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": f"{name}-runs", "readOnly": True}}],
        },
    }


def render_recipe(recipe: Recipe, options: K8sOptions | None = None) -> RecipeManifests:
    """Every object for one recipe, in the files they are written to."""
    options = options or K8sOptions()
    name = object_name(recipe, options)
    url = f"http://{name}:{options.port}"
    keys: dict[str, bool] = {}
    files = {
        FILES[0]: [_claim(f"{name}-hf-cache", name, cache_size(recipe, options), options),
                   _claim(f"{name}-runs", name, options.runs_size, options)],
        FILES[1]: [_deployment(recipe, name, options, keys), _service(recipe, name, options)],
        FILES[2]: [_job(recipe, name, url, options, keys)],
        FILES[3]: [_reader(name, options)],
    }
    return RecipeManifests(recipe=recipe.id, name=name, service_url=url, source=recipe_source(recipe), files=files,
                           secret_keys=keys)


def render_recipes(recipes: list[Recipe], options: K8sOptions | None = None) -> list[RecipeManifests]:
    """One set for several recipes (a fleet later): each under its own name, none colliding."""
    options = options or K8sOptions()
    if options.name and len(recipes) > 1:
        raise CookbookError(f"--name: names one recipe; these {len(recipes)} are named from their ids")
    rendered = [render_recipe(r, options) for r in recipes]
    seen: dict[str, str] = {}
    for item in rendered:
        if item.name in seen:
            raise CookbookError(f"{item.recipe}: its objects would be named {item.name!r}, as {seen[item.name]}'s")
        seen[item.name] = item.recipe
    return rendered


# ---------------------------------------------------------------------------------------------------------------
# YAML


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the scripts) as literal blocks, so a reviewer reads them as shell; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]], header: str = "") -> str:
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120, explicit_start=True)
    return header + body


def file_header(item: RecipeManifests, file: str) -> str:
    return (f"# {file} for {item.recipe} ({item.source}), rendered by `cookbook k8s render`.\n"
            "# The cookbook's tests check these against the official Kubernetes schemas; the project has not run them "
            "on a cluster.\n")


def recipe_source(recipe: Recipe) -> str:
    """Where the recipe file is, as the Job's `cookbook run` finds it in the cookbook image's checkout."""
    try:
        return "recipes/" + recipe.path.resolve().relative_to(RECIPES_DIR.resolve()).as_posix()
    except ValueError:
        return "a file outside the checkout's recipes/: the cookbook image must hold it as " + recipe.id


def rendered_files(items: list[RecipeManifests]) -> dict[Path, str]:
    """Relative path -> text for every file of every recipe: `<name>/<file>`."""
    return {Path(item.name) / file: to_yaml(objects, file_header(item, file))
            for item in items for file, objects in item.files.items()}


def write_manifests(items: list[RecipeManifests], out: Path) -> list[Path]:
    """Write every file (each atomically) under `out`; everything is rendered before the first write."""
    from .pages import write_atomic

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CookbookError(f"--out: {out} is not a folder")
    texts = rendered_files(items)
    return [write_atomic(out / rel, text) for rel, text in texts.items()]
