"""Kubernetes manifests (issue 14, item 2): every recipe's objects validated offline against the official schemas
(kubernetes-validate, pinned in pyproject's dev extras), the seeds' card counts, the server's command run by bash
exactly as the Launch block, secrets by name only, one-line errors, and a snapshot per recipe.

Snapshots live in tests/snapshots/k8s/<name>.yaml. After an intended change to the manifests, refresh them with
    COOKBOOK_UPDATE_SNAPSHOTS=1 scripts/in-env.sh python -m pytest -q tests/test_k8s.py -k snapshot
and review the diff before committing.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

from cookbook import k8s
from cookbook.cli import main
from cookbook.container import container_script
from cookbook.errors import CookbookError
from cookbook.launch import free_port
from cookbook.recipes import REPO_ROOT, RECIPES_DIR, load_recipe, load_recipe_file, recipe_paths, serve_argv
from test_container import hostile_recipe, stand_ins

# The oldest Kubernetes release the manifests claim, and the newest whose schemas the pinned package bundles.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# From the seed pages (Hardware rows): 2x Gaudi 2 (TP 2), 4x Gaudi 2 (TP 4), 4x Gaudi 2 (TP 4, expert parallel).
SEED_CARDS = {"Qwen/Qwen-AgentWorld-35B-A3B": 2, "Qwen/Qwen3-Coder-Next": 4, "Qwen/Qwen3.5-122B-A10B-FP8": 4}
SNAPSHOTS = Path(__file__).parent / "snapshots" / "k8s"
RECIPE_IDS = [p.parent.relative_to(RECIPES_DIR).as_posix() for p in recipe_paths()]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of commands and env values, as documented: `$$` is `$`, `$(NAME)` is NAME's value when
    the container defines it (else left as written), any other `$` is itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, text[i:end + 1]))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"] if obj["kind"] in ("Deployment", "Job") else obj["spec"]


def validate_offline(objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict schemas (unknown fields refused) of each pinned release, with every network call refused."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("schema validation tried the network")

    with monkeypatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "getaddrinfo", refuse)
        for obj in objects:
            for version in KUBERNETES_VERSIONS:
                assert kubernetes_validate.validate(obj, version, strict=True) == version.rsplit(".", 1)[0]


def name_problems(obj: dict[str, Any]) -> list[str]:
    """What the schemas do not check: object, container, volume and port names, label values."""
    problems = []
    name = obj["metadata"]["name"]
    pattern = DNS_1035 if obj["kind"] == "Service" else DNS_LABEL
    if len(name) > 63 or not pattern.match(name):
        problems.append(f"{obj['kind']} name {name!r}")
    labels = dict(obj["metadata"].get("labels", {}))
    if obj["kind"] in ("Deployment", "Job"):
        labels.update(obj["spec"]["template"]["metadata"]["labels"])
    problems += [f"label {k}={v!r}" for k, v in labels.items() if len(v) > 63 or not LABEL_VALUE.match(v)]
    if obj["kind"] in ("Deployment", "Job", "Pod"):
        spec = pod_spec(obj)
        for container in spec.get("initContainers", []) + spec["containers"]:
            if not DNS_LABEL.match(container["name"]):
                problems.append(f"container {container['name']!r}")
            problems += [f"port {p['name']!r}" for p in container.get("ports", []) if len(p["name"]) > 15]
        problems += [f"volume {v['name']!r}" for v in spec.get("volumes", []) if not DNS_LABEL.match(v["name"])]
    return problems


@pytest.fixture(params=RECIPE_IDS)
def rendered(request: pytest.FixtureRequest) -> tuple[Any, k8s.RecipeManifests]:
    recipe = load_recipe(request.param)
    return recipe, k8s.render_recipe(recipe)


def test_every_recipe_is_rendered_and_checked() -> None:
    assert len(RECIPE_IDS) >= 5 and set(SEED_CARDS) <= set(RECIPE_IDS)


def test_manifests_pass_the_official_schemas(rendered: tuple[Any, k8s.RecipeManifests], monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, item = rendered
    objects = item.objects()
    validate_offline(objects, monkeypatch)
    assert [name_problems(o) for o in objects] == [[] for _ in objects]
    kinds = [o["kind"] for o in objects]
    assert kinds == ["PersistentVolumeClaim", "PersistentVolumeClaim", "Deployment", "Service", "Job", "Pod"]
    # The written text is what was validated.
    for rel, text in k8s.rendered_files([item]).items():
        assert list(yaml.safe_load_all(text)) == item.files[rel.relative_to(item.name).as_posix()]


def test_the_schemas_do_refuse_a_broken_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation can fail: a wrong type and a misspelt field are both refused."""
    item = k8s.render_recipe(load_recipe("Qwen/Qwen3-Coder-Next"))
    deployment = of_kind(item.objects(), "Deployment")[0]
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    for broken in (wrong_type, misspelt):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_offline([broken], monkeypatch)


def test_server_requests_the_recipes_cards_or_cpu(rendered: tuple[Any, k8s.RecipeManifests]) -> None:
    recipe, item = rendered
    server = pod_spec(of_kind(item.objects(), "Deployment")[0])["containers"][0]
    resources = server["resources"]
    if recipe.hardware.kind == "cpu":
        assert k8s.GAUDI_RESOURCE not in json.dumps(resources)
        assert resources == {"requests": {"cpu": "2", "memory": resources["requests"]["memory"]}}
        assert int(resources["requests"]["memory"].removesuffix("Gi")) >= 5  # the CPU server's tree is about 5 GiB
    else:
        cards = str(recipe.hardware.cards)
        assert resources == {"requests": {k8s.GAUDI_RESOURCE: cards}, "limits": {k8s.GAUDI_RESOURCE: cards}}
    if recipe.id in SEED_CARDS:
        assert resources["limits"][k8s.GAUDI_RESOURCE] == str(SEED_CARDS[recipe.id])
        assert resources["requests"][k8s.GAUDI_RESOURCE] == str(SEED_CARDS[recipe.id])


def test_server_pod_shape(rendered: tuple[Any, k8s.RecipeManifests]) -> None:
    recipe, item = rendered
    objects = item.objects()
    deployment, service = of_kind(objects, "Deployment")[0], of_kind(objects, "Service")[0]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"] == service["spec"]["selector"]
    spec = pod["spec"]
    server = spec["containers"][0]
    assert server["image"] == f"{recipe.image.kind}:{recipe.image.tag}"
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert service["spec"]["ports"][0]["targetPort"] == "http" and item.service_url == f"http://{service['metadata']['name']}:8000"
    for probe in ("startupProbe", "readinessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= k8s.DEFAULT_STARTUP_BUDGET_S >= 1800
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["/dev/shm"]["name"] == "dshm"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == ("1Gi" if recipe.hardware.kind == "cpu" else f"{4 * recipe.hardware.cards}Gi")
    hf_home = next(e["value"] for e in server["env"] if e["name"] == "HF_HOME")
    assert mounts[hf_home]["name"] == "hf-cache"
    claims = {c["metadata"]["name"]: c for c in of_kind(objects, "PersistentVolumeClaim")}
    assert volumes["hf-cache"]["persistentVolumeClaim"]["claimName"] in claims
    cache = claims[volumes["hf-cache"]["persistentVolumeClaim"]["claimName"]]
    assert int(cache["spec"]["resources"]["requests"]["storage"].removesuffix("Gi")) >= recipe.precision.weights_gb
    # $COOKBOOK is the checkout the init container copies from the cookbook image.
    assert mounts["/cookbook"]["subPath"] == "checkout" and "cp -a /cookbook/. /shared/checkout/" in spec["initContainers"][0]["command"][2]
    assert spec["enableServiceLinks"] is False


@pytest.mark.parametrize("recipe_id", RECIPE_IDS)
def test_bash_runs_the_fix_step_then_vllm_serve_exactly(recipe_id: str, tmp_path: Path) -> None:
    """The container's command, after Kubernetes' expansion with the pod's environment, is the docker run's script;
    bash runs it against stand-in python3 and vllm that print their argv."""
    recipe = load_recipe(recipe_id)
    item = k8s.render_recipe(recipe)
    spec = pod_spec(of_kind(item.objects(), "Deployment")[0])
    server = spec["containers"][0]
    env = {e["name"]: expand(e["value"], {}) for e in server["env"] if "value" in e}
    assert server["command"][:2] == ["bash", "-c"] and expand(server["command"][2], env) == container_script(recipe)
    assert {k: v for k, v in env.items() if k in recipe.environment} == recipe.environment
    shell_env = {**stand_ins(tmp_path / "bin", "python3", "vllm"), **env}
    ran = subprocess.run(["bash", "-c", expand(server["command"][2], env)], env=shell_env, capture_output=True, text=True, check=True)
    fix, serve = (json.loads(line) for line in ran.stdout.splitlines())
    assert fix == ["python3", "/cookbook/fixes/apply_all.py", "--profile", recipe.fixes.profile, *recipe.fixes.opt_in]
    expected = [w.replace(str(REPO_ROOT), "/cookbook") for w in serve_argv(recipe, Path(k8s.SERVER_MODELS))]
    assert serve == expected
    if recipe.serve.weights is not None:  # the prepared weights the init container copies
        assert "/shared/models/" in spec["initContainers"][0]["command"][2] and serve[2].startswith(k8s.SERVER_MODELS + "/")


def test_run_job_runs_cookbook_run_against_the_service(rendered: tuple[Any, k8s.RecipeManifests]) -> None:
    recipe, item = rendered
    job = of_kind(item.objects(), "Job")[0]
    spec = pod_spec(job)
    run = spec["containers"][0]
    env = {e["name"]: e.get("value", "") for e in run["env"]} | {"POD_NAME": f"{item.name}-run-x7k2p"}
    argv = [expand(w, env) for w in run["command"]]
    assert argv[:5] == ["cookbook", "run", recipe.id, "--base-url", item.service_url]
    assert argv[argv.index("--out") + 1] == f"/runs/{item.name}-run-x7k2p"
    assert argv[argv.index("--hardware") + 1].startswith("unknown:not stated")
    assert {m["mountPath"]: m["name"] for m in run["volumeMounts"]} == {"/runs": "runs"}
    claim = {v["name"]: v for v in spec["volumes"]}["runs"]["persistentVolumeClaim"]["claimName"]
    assert claim in {c["metadata"]["name"] for c in of_kind(item.objects(), "PersistentVolumeClaim")}
    wait = spec["initContainers"][0]
    assert wait["command"][:2] == ["python3", "-c"] and wait["command"][3] == f"{item.service_url}/health"
    assert int(wait["command"][4]) > k8s.DEFAULT_STARTUP_BUDGET_S
    assert job["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
    reader = of_kind(item.objects(), "Pod")[0]
    assert reader["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}


class _Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self) -> None:  # noqa: N802
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[str, type[_Health]]]:
    handler = type("Handler", (_Health,), {"answers": [503, 503]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health", handler
    finally:
        server.shutdown()
        server.server_close()


def test_wait_script_waits_for_health_and_gives_up_in_time(health_server: tuple[str, type[_Health]]) -> None:
    """The Job's init container, run here for real: 503, 503, then 200 passes; a closed port fails within its budget."""
    url, handler = health_server
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    ok = subprocess.run([sys.executable, "-c", k8s.WAIT_SCRIPT, url, "60", "0.05"], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "server ready" in ok.stdout and handler.answers == []
    closed = f"http://127.0.0.1:{free_port()}/health"
    down = subprocess.run([sys.executable, "-c", k8s.WAIT_SCRIPT, closed, "0.5", "0.1"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 1 and f"server not ready after 0 s: {closed}" in down.stderr


def planted_recipe(tmp_path: Path) -> Path:
    """test_container's hostile recipe (HF_TOKEN and MY_API_KEY values, an --api-key, a shell-hostile value) plus
    values that Kubernetes would expand if they were written unescaped."""
    path = hostile_recipe(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["environment"].update({"DB_PASSWORD": "pw-live-4242", "EXPAND_TRY": "$(HF_TOKEN) $$ $(MY_API_KEY) end$"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_secrets_are_named_never_written(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe_file(planted_recipe(tmp_path))
    out = tmp_path / "out"
    assert main(["k8s", "render", str(recipe.path), "--out", str(out), "--secret", "team-tokens"]) == 0
    printed = capsys.readouterr().out
    written = "\n".join(p.read_text() for p in sorted(out.rglob("*.yaml")))
    for value in ("hf_live_value_1234", "sk-live-5678", "sk-flag-9999", "pw-live-4242"):
        assert value not in written and value not in printed
    assert "--api-key" not in written
    item = k8s.render_recipe(recipe, k8s.make_options(secret="team-tokens"))
    validate_offline(item.objects(), monkeypatch)
    server = pod_spec(of_kind(item.objects(), "Deployment")[0])["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in server["env"] if "valueFrom" in e}
    assert refs == {
        "HF_TOKEN": {"name": "team-tokens", "key": "HF_TOKEN"},  # the recipe sets it: required
        "MY_API_KEY": {"name": "team-tokens", "key": "MY_API_KEY"},
        "DB_PASSWORD": {"name": "team-tokens", "key": "DB_PASSWORD"},
        "VLLM_API_KEY": {"name": "team-tokens", "key": "VLLM_API_KEY"},  # stands in for --api-key
    }
    assert item.secret_keys == {"HF_TOKEN": True, "MY_API_KEY": True, "DB_PASSWORD": True, "VLLM_API_KEY": True}
    assert "team-tokens with keys HF_TOKEN, MY_API_KEY, DB_PASSWORD, VLLM_API_KEY" in printed
    job_env = pod_spec(of_kind(item.objects(), "Job")[0])["containers"][0]["env"]
    assert {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "team-tokens", "key": "VLLM_API_KEY"}}} in job_env
    # Values Kubernetes would expand arrive as written: no secret is pulled in through $(NAME).
    pod_env = {"HF_TOKEN": "hf_live_value_1234", "MY_API_KEY": "sk-live-5678"}
    plain = {e["name"]: expand(e["value"], pod_env) for e in server["env"] if "value" in e}
    assert plain["EXPAND_TRY"] == "$(HF_TOKEN) $$ $(MY_API_KEY) end$"
    assert plain["ODD_VALUE"] == recipe.environment["ODD_VALUE"] and plain["SPACED"] == "a b  c"


def test_optional_token_when_the_recipe_names_no_secret() -> None:
    item = k8s.render_recipe(load_recipe("Qwen/Qwen3-Coder-Next"))
    server = pod_spec(of_kind(item.objects(), "Deployment")[0])["containers"][0]
    refs = [e for e in server["env"] if "valueFrom" in e]
    assert refs == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": k8s.DEFAULT_SECRET, "key": "HF_TOKEN", "optional": True}}}]
    assert item.secret_keys == {"HF_TOKEN": False}


def test_options_reach_every_object(monkeypatch: pytest.MonkeyPatch) -> None:
    options = k8s.make_options(
        image="registry.local/vllm-gaudi:0.26.0@sha256:" + "a" * 64, cookbook_image="registry.local/cookbook:abc",
        name="coder", namespace="gaudi-ci", secret="tokens", storage_class="fast.ssd", cache_size="300Gi",
        runs_size="20Gi", shm_size="32Gi", startup_budget_s=7200, hardware="gaudi2:four Gaudi 2 cards ($(HF_TOKEN))",
        port=9000)
    item = k8s.render_recipe(load_recipe("Qwen/Qwen3-Coder-Next"), options)
    objects = item.objects()
    validate_offline(objects, monkeypatch)
    assert {o["metadata"]["namespace"] for o in objects} == {"gaudi-ci"}
    assert {c["spec"]["storageClassName"] for c in of_kind(objects, "PersistentVolumeClaim")} == {"fast.ssd"}
    assert [c["spec"]["resources"]["requests"]["storage"] for c in of_kind(objects, "PersistentVolumeClaim")] == ["300Gi", "20Gi"]
    spec = pod_spec(of_kind(objects, "Deployment")[0])
    assert spec["containers"][0]["image"] == options.image and spec["initContainers"][0]["image"] == "registry.local/cookbook:abc"
    assert spec["containers"][0]["startupProbe"]["failureThreshold"] == 720
    assert {v["name"]: v for v in spec["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "32Gi"
    assert of_kind(objects, "Service")[0]["spec"]["ports"][0]["port"] == 9000 and item.service_url == "http://coder:9000"
    run = pod_spec(of_kind(objects, "Job")[0])["containers"][0]
    argv = [expand(w, {"POD_NAME": "p", "HF_TOKEN": "leak"}) for w in run["command"]]
    assert argv[argv.index("--hardware") + 1] == "gaudi2:four Gaudi 2 cards ($(HF_TOKEN))"
    assert argv[argv.index("--base-url") + 1] == "http://coder:9000"
    assert {o["metadata"]["name"] for o in objects} == {"coder", "coder-hf-cache", "coder-runs", "coder-run", "coder-report-reader"}


def test_a_set_of_recipes_renders_apart(tmp_path: Path) -> None:
    recipes = [load_recipe(r) for r in RECIPE_IDS]
    items = k8s.render_recipes(recipes)
    assert len({i.name for i in items}) == len(recipes)
    written = k8s.write_manifests(items, tmp_path)
    assert len(written) == len(recipes) * len(k8s.FILES)
    with pytest.raises(CookbookError, match="--name"):
        k8s.render_recipes(recipes, k8s.make_options(name="one"))
    with pytest.raises(CookbookError, match="would be named"):
        k8s.render_recipes(recipes[:1] * 2)


def test_a_long_recipe_id_keeps_valid_distinct_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = yaml.safe_load((RECIPES_DIR / "Qwen/Qwen3-Coder-Next/recipe.yaml").read_text())
    names = []
    for suffix in ("a", "b"):
        folder = tmp_path / ("9-" + "Very-Long-Model-Name-" * 4 + suffix)
        folder.mkdir()
        (folder / "recipe.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
        item = k8s.render_recipe(load_recipe_file(folder / "recipe.yaml"))
        validate_offline(item.objects(), monkeypatch)
        assert [name_problems(o) for o in item.objects()] == [[]] * 6
        names.append(item.name)
    assert names[0] != names[1] and all(len(n) <= k8s.MAX_NAME and n[0].isalpha() for n in names)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loopback = yaml.safe_load((RECIPES_DIR / "Qwen/Qwen3-Coder-Next/recipe.yaml").read_text())
    loopback["serve"]["flags"]["host"] = "127.0.0.1"
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "recipe.yaml").write_text(yaml.safe_dump(loopback, sort_keys=False))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    out = tmp_path / "out"
    good = "Qwen/Qwen3-Coder-Next"
    cases: list[tuple[list[str], str]] = [
        (["No/Such-Recipe"], "No/Such-Recipe"),
        ([str(tmp_path / "loop" / "recipe.yaml")], "serve.flags.host"),
        ([good, "--startup-budget", "10"], "--startup-budget"),
        ([good, "--name", "Bad_Name"], "--name"),
        ([good, "--name", "x" * 41], "--name"),
        ([good, "--namespace", "UPPER"], "--namespace"),
        ([good, "--secret", "two words"], "--secret"),
        ([good, "--storage-class", "Fast"], "--storage-class"),
        ([good, "--cache-size", "lots"], "--cache-size"),
        ([good, "--shm-size", "16GB"], "--shm-size"),
        ([good, "--runs-size", "5 Gi"], "--runs-size"),
        ([good, "--hardware", "gaudi2"], "--hardware"),
        ([good, "--image", "has space:1"], "--image"),
        ([good, "--cookbook-image", ""], "--cookbook-image"),
        ([good, "--port", "0"], "--port"),
    ]
    for args, message in cases:
        code = main(["k8s", "render", *args, "--out", str(out)])
        err = capsys.readouterr().err
        assert code != 0 and message in err and err.count("\n") == 1, (args, err)
        assert not out.exists()
    assert main(["k8s", "render", good, "--out", str(a_file)]) != 0
    err = capsys.readouterr().err
    assert "--out" in err and err.count("\n") == 1 and a_file.read_text() == ""


def test_expansion_escape_round_trips() -> None:
    for text in ("plain", "$COOKBOOK/x", "$(A)", "$$", "$$(A)", "a$", "$($(A))", "$(", "`$(id)`", "x$$$(B)y"):
        assert expand(k8s.escape_expansion(text), {"A": "SECRET", "B": "SECRET"}) == text


def _snapshot_text(item: k8s.RecipeManifests) -> str:
    return "".join(k8s.rendered_files([item]).values())


def test_snapshots_are_stable(rendered: tuple[Any, k8s.RecipeManifests]) -> None:
    recipe, item = rendered
    path = SNAPSHOTS / f"{item.name}.yaml"
    text = _snapshot_text(item)
    if os.environ.get("COOKBOOK_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no snapshot for {recipe.id}: see this file's docstring to write it"
    assert path.read_text() == text, f"{path.name} differs from the rendering: refresh it (this file's docstring) if intended"


def test_no_stale_snapshots() -> None:
    names = {k8s.object_name(load_recipe(r)) for r in RECIPE_IDS}
    assert {p.stem for p in SNAPSHOTS.glob("*.yaml")} == names


# -- a fleet ----------------------------------------------------------------------------------------------------------

FLEET_EXAMPLE = REPO_ROOT / "docs" / "examples" / "fleet-gaudi.yaml"
FLEET_SNAPSHOT = Path(__file__).parent / "snapshots" / "k8s-fleet" / "fleet-gaudi.yaml"


def test_a_fleet_renders_its_launched_servers_and_one_run_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from cookbook.fleet_file import Fleet, load_fleet

    items = k8s.render_fleet(load_fleet(FLEET_EXAMPLE), k8s.make_options(namespace="gaudi-ci"), source="docs/examples/fleet-gaudi.yaml")
    objects = [o for item in items for o in item.objects()]
    validate_offline(objects, monkeypatch)
    assert [name_problems(o) for o in objects] == [[] for _ in objects]
    servers = {i.recipe: i for i in items[:-1]}
    assert set(servers) == {"Qwen/Qwen3-Coder-Next", "Qwen/Qwen3.5-122B-A10B-FP8"}  # the attached one is not started
    for recipe_id, item in servers.items():
        [deployment] = of_kind(item.objects(), "Deployment")
        limits = pod_spec(deployment)["containers"][0]["resources"]["limits"]
        assert limits["habana.ai/gaudi"] == str(SEED_CARDS[recipe_id])
        assert [o["kind"] for o in item.objects()] == ["PersistentVolumeClaim", "Deployment", "Service"]
    run = items[-1]
    [config] = of_kind(run.objects(), "ConfigMap")
    [job] = of_kind(run.objects(), "Job")
    command = pod_spec(job)["containers"][0]["command"]
    assert command == ["cookbook", "run", "--fleet", "/fleet/fleet.yaml", "--out", "/runs/$(POD_NAME)"]
    assert "initContainers" not in pod_spec(job)  # each entry waits for its own server: one dead server holds none
    fleet = Fleet.model_validate(yaml.safe_load(config["data"]["fleet.yaml"]))  # the Job reads a valid fleet file
    assert [s.base_url for s in fleet.servers] == ["http://qwen-qwen3-coder-next:8000",
                                                   "http://qwen-qwen3-5-122b-a10b-fp8:8000", "http://gaudi-07.lab:8000"]
    assert fleet.servers[2].hardware == "gaudi2:two Gaudi 2 cards (gaudi-07)" and fleet.notebooks == ["verify", "throughput"]
    assert fleet.wait_for_health_s >= k8s.DEFAULT_STARTUP_BUDGET_S
    text = "".join(k8s.rendered_files(items).values())
    FLEET_SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    if os.environ.get("COOKBOOK_UPDATE_SNAPSHOTS") == "1":
        FLEET_SNAPSHOT.write_text(text)
    assert FLEET_SNAPSHOT.read_text() == text, "the fleet's manifests changed: refresh the snapshot (this file's docstring) if intended"


def test_a_fleet_never_writes_url_credentials_into_a_config_map(tmp_path: Path) -> None:
    from cookbook.fleet_file import load_fleet

    path = tmp_path / "fleet.yaml"
    path.write_text("servers:\n  - {recipe: Qwen/Qwen3-Coder-Next, base_url: 'http://me:hunter2@gaudi-07:8000'}\n")
    with pytest.raises(CookbookError, match=r"^servers\.0\.base_url: credentials in a URL"):
        k8s.render_fleet(load_fleet(path))


def test_the_render_command_takes_a_recipe_or_a_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["k8s", "render", "--out", str(tmp_path / "a")]) == 2
    assert main(["k8s", "render", "Qwen/Qwen3-Coder-Next", "--fleet", str(FLEET_EXAMPLE), "--out", str(tmp_path / "b")]) == 2
    assert "give a recipe id or --fleet FILE" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["k8s", "render", "--fleet", str(FLEET_EXAMPLE), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "fleet" / "30-fleet-job.yaml").is_file()
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["fleet", "qwen-qwen3-5-122b-a10b-fp8", "qwen-qwen3-coder-next"]
