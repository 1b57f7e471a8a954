"""Hostile and unlucky inputs (issue 15): masking that never corrupts, launch blocks that run nothing, inputs refused
in one line, results files that cannot take a tool down. No server needed; the hostile stand-in servers live in
tests/test_adversarial_servers.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cookbook import report
from cookbook.secrets import MASK, is_secret_name, mask_folder, plausible_secret, secret_values


# -- 1. masking never corrupts a file ----------------------------------------------------------------------------


def test_tokenizers_parallelism_is_not_a_secret() -> None:
    assert not is_secret_name("TOKENIZERS_PARALLELISM")
    assert not is_secret_name("KEYBOARD_LAYOUT")
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "VLLM_API_KEY", "APIKEY", "MY_SECRETS", "HUGGING_FACE_HUB_TOKEN"):
        assert is_secret_name(name)


@pytest.mark.parametrize("value", ["false", "true", "1", "0.5", "12345678", "abc", "password", "disabled", "None"])
def test_values_that_are_not_plausibly_secret_are_never_searched_for(value: str) -> None:
    assert not plausible_secret(value)
    assert secret_values({"MY_TOKEN": value}) == []


def test_real_looking_secrets_are(tmp_path: Path) -> None:
    for value in ("hf_abcdefghijklmnop", "sk-abcdef", "Tr0ub4dor&3", "correcthorsebatterystaple"):
        assert plausible_secret(value)


def _run_folder(tmp_path: Path, secret: str) -> Path:
    folder = tmp_path / "run"
    (folder / "parts").mkdir(parents=True)
    results = {"schema_version": 1, "ok": True, "failed": False, "note": f"token {secret} used", "n": 3,
               "nested": {"list": [False, True, None, 1.5, f"x{secret}y"]}}
    (folder / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (folder / "parts" / "03_verify.json").write_text(json.dumps(results, indent=2) + "\n")
    notebook = {"cells": [{"cell_type": "code", "outputs": [{"text": [f"HF_TOKEN={secret}\n"]}], "source": "x = True"}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "03_verify.ipynb").write_text(json.dumps(notebook, indent=1, sort_keys=True) + "\n")
    (folder / "index.html").write_text(f"<p>{secret}</p>")
    return folder


@pytest.mark.parametrize("secret", ["false", "true", "hf_plain_secret_123", 'hf_quote"back\\slash_123', "hf_ünïcode_secret_1"])
def test_masking_keeps_every_json_file_valid(tmp_path: Path, secret: str) -> None:
    folder = _run_folder(tmp_path, secret)
    before = {p: p.read_text() for p in folder.rglob("*") if p.is_file()}
    report.mask_secrets(folder, secret_values({"TOKENIZERS_PARALLELISM": secret, "HF_TOKEN": secret}))
    for path in folder.rglob("*.json"):
        data = json.loads(path.read_text())  # still valid JSON
        assert data["ok"] is True and data["failed"] is False and data["n"] == 3
    json.loads((folder / "03_verify.ipynb").read_text())
    if plausible_secret(secret):
        for path in folder.rglob("*"):
            if path.is_file():
                text = path.read_text()
                assert secret not in text and json.dumps(secret)[1:-1] not in text, path
        assert MASK in (folder / "results.json").read_text()
    else:
        assert {p: p.read_text() for p in folder.rglob("*") if p.is_file()} == before  # nothing touched


def test_an_escaped_secret_is_masked(tmp_path: Path) -> None:
    secret = 'sk-quo"te\\back'
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"echo": f"Authorization {secret}"}))
    assert json.dumps(secret)[1:-1] in path.read_text() and secret not in path.read_text()
    report.mask_secrets(tmp_path, [secret])
    assert json.loads(path.read_text()) == {"echo": f"Authorization {MASK}"}


def test_a_binary_file_holding_a_secret_is_kept(tmp_path: Path) -> None:
    secret = "hf_binary_secret_42"
    blob = tmp_path / "figure.png"
    data = b"\x89PNG\r\n\x1a\n\xff\xfe" + secret.encode() + b"\x00tail"
    blob.write_bytes(data)
    outcome = mask_folder(tmp_path, [secret])
    assert blob.exists() and outcome.binary == [blob]
    kept = blob.read_bytes()
    assert secret.encode() not in kept and len(kept) == len(data) and kept.endswith(b"\x00tail")


# -- 2. no shell injection through the recipe ----------------------------------------------------------------------

import subprocess  # noqa: E402

import yaml  # noqa: E402

from cookbook.errors import RecipeError  # noqa: E402
from cookbook.recipes import RECIPES_DIR, load_recipe, load_recipe_file, render_launch_block  # noqa: E402

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _variant(tmp_path: Path, mutate, base: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> Path:
    data = yaml.safe_load((RECIPES_DIR / base / "recipe.yaml").read_text())
    mutate(data)
    path = tmp_path / "Org" / "Model" / "recipe.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _setter(dotted: str, value):
    def mutate(data):
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


INJECTIONS = ['$COOKBOOK/x"; touch {m}; echo "', "$COOKBOOK$(touch {m})", "$COOKBOOK/`touch {m}`", "org/m; touch {m}",
              "$(touch {m})", "org/model name", "-rf", "org/model\ntouch {m}"]


@pytest.mark.parametrize("template", INJECTIONS)
def test_a_model_id_that_cannot_be_a_model_is_refused(tmp_path: Path, template: str) -> None:
    marker = tmp_path / "pwned"
    path = _variant(tmp_path, _setter("model.id", template.format(m=marker)), base="Qwen/Qwen3-Coder-Next")
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert "model.id" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["$COOKBOOK/models/a b", '$COOKBOOK/x"; touch {m}; echo "', "$COOKBOOK_MODELS/$(touch {m})",
                                   "$COOKBOOK/a'b", "plain/$(touch {m})"])
def test_every_launch_word_is_quoted_the_same_way(tmp_path: Path, value: str) -> None:
    marker = tmp_path / "pwned"
    value = value.format(m=marker)

    def mutate(data):
        data["serve"]["flags"]["chat-template"] = value
        data["serve"]["flags"]["served-model-name"] = value

    block = render_launch_block(load_recipe_file(_variant(tmp_path, mutate)))
    serve = block[block.index("vllm serve"):]
    script = "COOKBOOK=/ck; COOKBOOK_MODELS=/models\n" + serve.replace("vllm serve", "printf '%s\\n'", 1)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert not marker.exists()
    expected = value.replace("$COOKBOOK_MODELS", "/models") if value.startswith("$COOKBOOK_MODELS/") else (
        value.replace("$COOKBOOK", "/ck", 1) if value.startswith("$COOKBOOK/") else value)
    assert out.stdout.splitlines().count(expected) == 2, out.stdout


def test_the_cpu_recipes_model_word_still_expands(tmp_path: Path) -> None:
    block = render_launch_block(load_recipe(CPU))
    assert 'vllm serve "$COOKBOOK_MODELS/smollm2-135m-instruct"' in block
