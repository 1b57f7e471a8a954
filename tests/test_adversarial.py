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

from test_recipes import _set as _setter  # noqa: E402

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _variant(tmp_path: Path, mutate, base: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> Path:
    data = yaml.safe_load((RECIPES_DIR / base / "recipe.yaml").read_text())
    mutate(data)
    path = tmp_path / "Org" / "Model" / "recipe.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


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


# -- 7. inputs that passed validation and failed later, or failed with a traceback ---------------------------------

import math  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402

from cookbook.cli import main  # noqa: E402
from cookbook.compare import compare_runs  # noqa: E402
from cookbook.errors import ResultsError  # noqa: E402
from cookbook.results import Figure, Hardware, RunResults, read_results, write_results  # noqa: E402

BAD_FIELDS = [
    ("serve.flags.max-num-seqs", -5), ("serve.flags.max-num-seqs", 0), ("serve.flags.max-num-seqs", 10**400),
    ("serve.flags.max-model-len", "abc"), ("serve.flags.max-model-len", 0), ("model.params_total", math.inf),
    ("model.params_active", math.nan), ("precision.weights_gb", math.inf), ("serve.flags.tensor-parallel-size", "x"),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={str(v)[:12]}" for f, v in BAD_FIELDS])
def test_recipe_fields_have_sane_ranges(tmp_path: Path, field: str, value, capsys: pytest.CaptureFixture[str]) -> None:
    path = _variant(tmp_path, _setter(field, value))
    code = main(["recipe", "validate", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {path}: ") and field.split(".")[-1] in err[0], err


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_non_utf8_recipe_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"title: caf\xe9\n")
    code, err = _cli_error(["recipe", "validate", str(path)], capsys)
    assert code == 2 and len(err) == 1 and str(path) in err[0] and "UTF-8" in err[0]


def test_deep_yaml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("title: " + "[" * 5000 + "]" * 5000 + "\n")
    code, err = _cli_error(["recipe", "validate", str(path)], capsys)
    assert code == 2 and len(err) == 1 and str(path) in err[0] and "deep" in err[0]


def test_a_fifo_named_recipe_yaml_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_recipe_file(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock the reader before failing
        with open(fifo, "w") as handle:
            handle.write("x: 1\n")
        thread.join(5)
        pytest.fail("loading a FIFO blocked")
    assert isinstance(outcome[0], RecipeError) and "not a regular file" in str(outcome[0])


@pytest.mark.parametrize("ref", ["../tests", "Qwen/../../tests", "HuggingFaceTB/../../../tmp/x", "/etc"])
def test_recipe_ids_cannot_leave_the_recipes_folder(ref: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # so that the reference is read as an id, not as a folder beside the caller
    with pytest.raises(RecipeError) as info:
        load_recipe(ref)
    assert ref in str(info.value)


def _results(**metrics: float) -> RunResults:
    figure = Figure(name="single-stream", label="One stream", result="x", metrics=dict(metrics))
    return RunResults(recipe="r", model="m", hardware=Hardware(kind="cpu", description="box"), performance=[figure])


def test_deep_json_results_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ResultsError) as info:
        read_results(path)
    assert str(path) in str(info.value) and "deep" in str(info.value)


def test_a_results_json_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run" / "results.json").mkdir(parents=True)
    write_results(_results(tokens_per_s=1.0), tmp_path / "b.json")
    code, err = _cli_error(["compare", str(tmp_path / "run"), str(tmp_path / "b.json")], capsys)
    assert code == 2 and len(err) == 1 and "results.json" in err[0] and "not a file" in err[0]


def test_an_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    data = json.loads(_results().model_dump_json())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as info:
        read_results(path)
    assert "schema_version" in str(info.value) and "99" in str(info.value)


@pytest.mark.parametrize("before,after", [(10.0, math.nan), (math.nan, 10.0), (10.0, math.inf)])
def test_a_nan_metric_is_a_regression(before: float, after: float) -> None:
    comparison = compare_runs(_results(tokens_per_s=before, requests=3), _results(tokens_per_s=after, requests=3))
    assert not comparison.ok and [d.metric for d in comparison.regressions] == ["tokens_per_s"]


BAD_FLAGS = [
    (["verify", "--base-url", "not a url"], "--base-url"),
    (["verify", "--base-url", "ftp://127.0.0.1:9"], "--base-url"),
    (["verify", "--base-url", "http://[::1"], "--base-url"),
    (["verify", "--base-url", "http://127.0.0.1:99999"], "--base-url"),
    (["verify", "--base-url", "http://127.0.0.1:9", "--timeout", "nan"], "--timeout"),
    (["verify", "--base-url", "http://127.0.0.1:9", "--timeout", "inf"], "--timeout"),
    (["verify", "--base-url", "http://127.0.0.1:9", "--model", "m", "--param", "concurrency=abc"], "--param"),
    (["verify", "--base-url", "http://127.0.0.1:9", "--model", "m", "--param", "concurrency=0"], "--param"),
    (["verify", "--base-url", "http://127.0.0.1:9", "--model", "m", "--param", "needle_depths=2"], "--param"),
    (["bench", "--base-url", "not a url"], "--base-url"),
    (["bench", "--base-url", "http://127.0.0.1:9", "--timeout", "nan"], "--timeout"),
    (["run", CPU, "--base-url", "ftp://x"], "--base-url"),
    (["run", CPU, "--base-url", "http://127.0.0.1:9", "--out", "/proc/version/run"], "--out"),
    (["page", CPU, "--out", "/proc/version/page.md"], "--out"),
    (["compare", "a", "b", "--figure", "/proc/version/x.png"], "--figure"),
    (["compare", "a", "b", "--threshold", "nan"], "--threshold"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_FLAGS])
def test_bad_flags_are_one_line_naming_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _cli_error(argv, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err


# -- 3. secrets in what is shown: recipe show, the launch block, the page ------------------------------------------

from cookbook.secrets import ScrubbingStream, mask, strip_url_credentials  # noqa: E402


def _secret_recipe(tmp_path: Path) -> Path:
    def mutate(data):
        data["environment"] = {**data["environment"], "HF_TOKEN": "hf_envsecret_123456", "DB_PASSWORD": "pw"}
        data["serve"]["flags"]["api-key"] = "sk-flagsecret-987654"
        data["serve"]["flags"]["hf-token"] = "hf_flagtoken_555555"

    return _variant(tmp_path, mutate)


def test_recipe_show_masks_secret_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _secret_recipe(tmp_path)
    assert main(["recipe", "show", str(path)]) == 0
    out = capsys.readouterr().out
    for secret in ("hf_envsecret_123456", "sk-flagsecret-987654", "hf_flagtoken_555555", "DB_PASSWORD: pw"):
        assert secret not in out
    shown = yaml.safe_load(out)
    assert shown["environment"]["HF_TOKEN"] == MASK and shown["serve"]["flags"]["api-key"] == MASK


def test_secret_flags_come_from_the_environment_in_the_launch_block_and_page(tmp_path: Path) -> None:
    recipe = load_recipe_file(_secret_recipe(tmp_path))
    block = render_launch_block(recipe)
    assert '--api-key "$VLLM_API_KEY"' in block and '--hf-token "$HF_TOKEN"' in block
    assert "# Set VLLM_API_KEY, HF_TOKEN first" in block
    for secret in ("sk-flagsecret-987654", "hf_flagtoken_555555", "hf_envsecret_123456"):
        assert secret not in block


def test_the_page_shows_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _secret_recipe(tmp_path)
    out_file = tmp_path / "page.md"
    assert main(["page", str(path), "--out", str(out_file)]) == 0
    text = out_file.read_text()
    assert '--api-key "$VLLM_API_KEY"' in text
    for secret in ("sk-flagsecret-987654", "hf_flagtoken_555555", "hf_envsecret_123456"):
        assert secret not in text


def test_credentials_in_text_are_masked() -> None:
    text = "GET http://bob:hunter2-pw@host:8000/v1 with {'Authorization': 'Bearer sk-live-abc123'} and Basic dGVzdDp0ZXN0"
    masked = mask(text, [])
    assert "hunter2" not in masked and "sk-live-abc123" not in masked and "dGVzdDp0ZXN0" not in masked
    assert "http://host:8000/v1" in masked
    assert mask("Basic checks and a Bearer of news", []) == "Basic checks and a Bearer of news"
    assert strip_url_credentials("https://u:p@h:1/x") == "https://h:1/x"


@pytest.mark.parametrize("password", ["pw-1234567", "pw"])  # a short password is not searched for, its URL form is
def test_mask_folder_strips_url_credentials(tmp_path: Path, password: str) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"base_url": f"http://alice:{password}@127.0.0.1:8000"}))
    (tmp_path / "03_verify.html").write_text(f"<p>BASE_URL = 'http://alice:{password}@127.0.0.1:8000'</p>")
    (tmp_path / "clean.txt").write_text("nothing to see")
    outcome = mask_folder(tmp_path, [password])
    assert json.loads((tmp_path / "summary.json").read_text()) == {"base_url": "http://127.0.0.1:8000"}
    assert "alice" not in (tmp_path / "03_verify.html").read_text()
    assert sorted(p.name for p in outcome.changed) == ["03_verify.html", "summary.json"]


# -- 8. control characters never reach a terminal raw; compare --figure says the file it wrote -------------------


def test_control_characters_in_environment_values_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    value = "x\x1b[2J\x1b]0;pwned\x07\rcleared"
    path = _variant(tmp_path, lambda d: d["environment"].update({"FANCY": value}))
    for argv in (["recipe", "launch-script", str(path)], ["recipe", "show", str(path)]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    block = render_launch_block(load_recipe_file(path))
    assert "\x1b" not in block
    exported = block.split("\n")[[line.startswith("export FANCY=") for line in block.split("\n")].index(True)]
    out = subprocess.run(["bash", "-c", f"{exported}\nprintf %s \"$FANCY\""], capture_output=True, check=True).stdout
    assert out == value.encode()  # the same value, escaped only in how it is written


def test_the_terminal_stream_masks_and_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("MY_API_KEY", "sk-terminal-secret-1")
    sink = io.StringIO()
    ScrubbingStream(sink).write("key sk-terminal-secret-1 \x1b[31mred\n")
    assert sink.getvalue() == f"key {MASK} \\x1b[31mred\n"


@pytest.mark.parametrize("name,written", [("cmp", "cmp.png"), ("cmp.png", "cmp.png"), ("cmp.svg", "cmp.svg"), ("cmp.v2", "cmp.v2.png")])
def test_compare_figure_prints_the_path_it_wrote(tmp_path: Path, name: str, written: str, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_results(_results(tokens_per_s=10.0), a)
    write_results(_results(tokens_per_s=10.0), b)
    assert main(["compare", str(a), str(b), "--figure", str(tmp_path / name)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / written).is_file() and f"figure: {tmp_path / written}" in out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("cmp")] == [written]
