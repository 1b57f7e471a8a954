"""`cookbook recipe validate` knows what cannot run (issue 23, item 3): every hostile edit of a real recipe fails with
its own finding naming the file and the field, all findings of one file come in one run, and the vLLM flag lists the
validator reads are what the images' own `vllm serve` parsers say (re-captured by the integration test)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from cookbook.cli import main
from cookbook.image import cache_dir, cpu_image_dir
from cookbook.recipes import RECIPES_DIR, RecipeError, RecipeInvalid, load_recipe_file, recipe_paths
from cookbook.validate_rules import DATA_DIR, load_parser

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CODER = "Qwen/Qwen3-Coder-Next"
FP8 = "Qwen/Qwen3.5-122B-A10B-FP8"
CAPTURE = Path(__file__).resolve().parent.parent / "scripts" / "capture_vllm_flags.py"
Change = Callable[[dict[str, Any]], None]


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model config unless a test writes one: the findings never depend on this machine's Hugging Face cache."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


def write_config(hub: Path, model_id: str, config: dict[str, Any]) -> Path:
    """A synthetic snapshot in the offline hub cache's layout (refs/main -> snapshots/<rev>/config.json)."""
    repo = hub / f"models--{model_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    path = repo / "snapshots" / "0123abcd" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    return path


def variant(tmp_path: Path, recipe_id: str, *changes: Change, extra_text: str = "") -> Path:
    data = yaml.safe_load((RECIPES_DIR / recipe_id / "recipe.yaml").read_text())
    for change in changes:
        change(data)
    folder = tmp_path / "recipes" / recipe_id
    folder.mkdir(parents=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False) + extra_text)
    return path


def validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = main(["recipe", "validate", str(path)])
    out = capsys.readouterr()
    return code, out.err.strip().splitlines(), out.out


def flags(**values: Any) -> Change:
    return lambda d: d["serve"]["flags"].update({k.replace("_", "-"): v for k, v in values.items()})


def setting(dotted: str, value: Any) -> Change:
    def change(data: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return change


CODER_CONFIG = {"architectures": ["Qwen3NextForCausalLM"], "num_attention_heads": 16, "num_key_value_heads": 2,
                "num_experts": 512, "max_position_embeddings": 262144}

# name: (recipe, changes, config.json written for the model or None, rule, field, words of the message)
HOSTILE: dict[str, tuple[str, list[Change], dict[str, Any] | None, str, str, str]] = {
    "misspelt flag (CPU parser)": (SMOL, [flags(enable_prefix_cachin=True)], None, "unknown-vllm-flag",
                                   "serve.flags.enable-prefix-cachin", "did you mean --enable-prefix-caching?"),
    "misspelt flag (v0.26.0 parser)": (CODER, [flags(speculative_confg='{"method": "ngram"}')], None,
                                       "unknown-vllm-flag", "serve.flags.speculative-confg",
                                       "did you mean --speculative-config?"),
    "value outside the parser's choices": (SMOL, [flags(dtype="bf16")], None, "vllm-flag-value", "serve.flags.dtype",
                                           "'bf16' is not one of vLLM's choices"),
    "memory utilization 1.5": (CODER, [flags(gpu_memory_utilization=1.5)], None, "memory-utilization-range",
                               "serve.flags.gpu-memory-utilization", "1.5 is not a fraction in (0, 1]"),
    "nine cards on a Gaudi 2 node": (CODER, [setting("hardware.cards", 9)], None, "cards-per-node", "hardware.cards",
                                     "9 cards: a gaudi2 node has 8"),
    "TP 4 on one card": (CODER, [setting("hardware.cards", 1)], None, "parallel-within-cards",
                         "serve.flags.tensor-parallel-size", "TP 4 needs 4 cards but hardware.cards is 1"),
    "TP against the model's heads": (CODER, [], {**CODER_CONFIG, "num_attention_heads": 6},
                                     "tp-against-heads", "serve.flags.tensor-parallel-size",
                                     "TP 4 does not divide the model's 6 attention heads"),
    "EP against the model's experts": (CODER, [flags(enable_expert_parallel=True),
                                               setting("hardware.expert_parallel", True)],
                                       {**CODER_CONFIG, "num_experts": 2}, "ep-against-experts",
                                       "serve.flags.enable-expert-parallel", "2 experts over 4 expert-parallel ranks"),
    "max-model-len past the positions": (CODER, [flags(max_model_len=10_000_000)], CODER_CONFIG,
                                         "max-model-len-within-positions", "serve.flags.max-model-len",
                                         "10,000,000 tokens is past the model's 262,144 positions"),
    "block size 256 beside --block-size 128": (SMOL, [setting("prefix_caching.block_size", 256)], None,
                                               "block-size-agrees", "prefix_caching.block_size",
                                               "256 but serve.flags.block-size is 128"),
    "expert_parallel without the flag": (CODER, [setting("hardware.expert_parallel", True)], None,
                                         "expert-parallel-agrees", "hardware.expert_parallel",
                                         "the page would show EP the server does not run"),
    "image tag v0.30.0 with profile v0.26.0": (CODER, [setting("image.tag", "v0.30.0")], None,
                                               "image-matches-profile", "image.tag",
                                               "v0.30.0 but profile v0.26.0 is for vllm-gaudi v0.26.0"),
    "literal HF_TOKEN": (CODER, [lambda d: d["environment"].update(HF_TOKEN="hf_abcdefghijklmnopqrstuv")], None,
                         "no-literal-secrets", "environment.HF_TOKEN", "remove it and export HF_TOKEN"),
    "literal api-key flag": (SMOL, [flags(api_key="sk-abcdefghijklmnopqrstuv")], None, "no-literal-secrets",
                             "serve.flags.api-key", "export VLLM_API_KEY where the server starts"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_edit_fails_with_its_own_finding(case: str, tmp_path: Path, empty_hub_cache: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    recipe_id, changes, config, rule, field, words = HOSTILE[case]
    if config is not None:
        write_config(empty_hub_cache, recipe_id, config)
    path = variant(tmp_path, recipe_id, *changes)
    code, err, out = validate(path, capsys)
    assert code == 2, (err, out)
    assert err == [next(line for line in err if f"[{rule}; from " in line)]  # exactly this finding, none other
    assert err[0].startswith(f"error: {path}: {field}: ") and words in err[0], err
    assert "invalid: " in out and "1 error(s)" in out
    for secret in ("hf_abcdefghijklmnopqrstuv", "sk-abcdefghijklmnopqrstuv"):
        assert secret not in "\n".join(err) + out


def test_the_unedited_recipes_are_clean_with_those_configs(tmp_path: Path, empty_hub_cache: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The hostile cases' config.json alone gives no finding: each finding above comes from its edit."""
    write_config(empty_hub_cache, CODER, CODER_CONFIG)
    code, err, out = validate(variant(tmp_path, CODER), capsys)
    assert (code, err) == (0, []) and out.startswith("ok: ")


def test_many_hostile_edits_give_every_finding_in_one_run(tmp_path: Path, empty_hub_cache: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_config(empty_hub_cache, CODER, CODER_CONFIG)
    path = variant(
        tmp_path, CODER,
        setting("hardware.cards", 1), setting("hardware.expert_parallel", True), setting("image.tag", "v0.30.0"),
        setting("prefix_caching.block_size", 200),
        flags(gpu_memory_utilization=1.5, max_model_len=10_000_000, enable_prefix_cachin=True,
              speculative_confg="{}"),
        lambda d: d["environment"].update(HF_TOKEN="hf_abcdefghijklmnopqrstuv"),
        extra_text="context_note: said twice\n",
    )
    duplicate_line = len(path.read_text().splitlines())  # the recipe's context_note, given again at the end
    code, err, out = validate(path, capsys)
    assert code == 2
    fields = {line.split(": ")[2] for line in err}
    assert fields == {
        f"line {duplicate_line}",
        "hardware.expert_parallel", "image.tag", "prefix_caching.block_size", "serve.flags.gpu-memory-utilization",
        "serve.flags.max-model-len", "serve.flags.enable-prefix-cachin", "serve.flags.speculative-confg",
        "serve.flags.tensor-parallel-size", "environment.HF_TOKEN",
    }, err
    assert f"{len(err)} error(s)" in out and len(err) == 10


def test_a_duplicate_key_names_the_file_the_key_and_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (RECIPES_DIR / SMOL / "recipe.yaml").read_text()
    assert text.count("  block_size: 128\n") == 1
    path = tmp_path / "recipe.yaml"
    path.write_text(text.replace("  block_size: 128\n", "  block_size: 128\n  block_size: 256\n"))
    line = text[: text.index("  block_size: 128\n")].count("\n") + 2
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert str(info.value) == f"{path}: line {line}: duplicate key 'block_size' (first at line {line - 1}; YAML would " \
                              "keep only the last)"
    code, err, _ = validate(path, capsys)
    assert code == 2 and err[0] == f"error: {info.value}"


def test_every_schema_error_comes_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(data: dict[str, Any]) -> None:
        del data["image"]
        data["hardware"]["cards"] = "four"
        data["hardware"]["gpus"] = 4
        data["serve"]["flags"]["max-model-len"] = None  # fails every branch of the flag-value union: one error

    path = variant(tmp_path, CODER, broken)
    with pytest.raises(RecipeInvalid) as info:
        load_recipe_file(path)
    assert len(info.value.problems) == 4 and "\n" not in str(info.value)
    code, err, out = validate(path, capsys)
    assert code == 2 and [line.split(": ")[2] for line in err] == [
        "hardware.cards", "hardware.gpus", "image", "serve.flags.max-model-len"]
    assert "4 error(s)" in out


def test_prefix_caching_disagreeing_with_its_flag_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = variant(tmp_path, SMOL, setting("prefix_caching.enabled", False))
    code, err, _ = validate(path, capsys)
    assert code == 2 and len(err) == 1 and "prefix_caching.enabled disagrees with serve.flags.enable-prefix-caching" in err[0]


def test_vllm_spellings_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An alias (`device-memory-utilization`) and a boolean's `no-` form are flags vLLM has."""
    path = variant(tmp_path, SMOL, flags(device_memory_utilization=0.5, no_enable_log_requests=True))
    code, err, _ = validate(path, capsys)
    assert (code, err) == (0, [])
    bad = variant(tmp_path / "b", SMOL, flags(no_enable_log_requests=False, enforce_eager=3))
    code, err, _ = validate(bad, capsys)
    assert code == 2 and sorted(line.split(": ")[2] for line in err) == [
        "serve.flags.enforce-eager", "serve.flags.no-enable-log-requests"], err


def test_launch_profile_flags_are_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = variant(tmp_path, SMOL, lambda d: d["verification"].setdefault("launch_profiles", {}).update(
        small={"num-gpu-blocks-overide": 64}))
    code, err, _ = validate(path, capsys)
    assert code == 2 and len(err) == 1
    assert "verification.launch_profiles.small.num-gpu-blocks-overide" in err[0] and "did you mean" in err[0]


def test_every_recipe_in_the_checkout_validates(capsys: pytest.CaptureFixture[str]) -> None:
    for path in recipe_paths():
        code, err, out = validate(path, capsys)
        assert (code, err) == (0, []) and "warning" not in out, (path, err, out)


def test_each_recipe_has_its_parser_captured() -> None:
    for path in recipe_paths():
        recipe = load_recipe_file(path)
        release = recipe.fixes.profile.removeprefix("cpu-").removeprefix("v")
        parser = load_parser(release)
        assert parser is not None and "enable-prefix-caching" in parser.flags, path


# -- the captured parsers match the images' own ---------------------------------------------------------------------

IMAGES = {  # captured file -> the image's interpreter and the marker that says it is built
    "vllm-serve-flags-0.32.0.json": (cpu_image_dir() / "bin" / "python", cpu_image_dir() / ".complete"),
    "vllm-serve-flags-0.26.0.json": (cache_dir() / "images" / "vllm-gaudi-0.26.0-sim" / "bin" / "python",
                                     cache_dir() / "images" / "vllm-gaudi-0.26.0-sim" / "bin" / "python"),
}


@pytest.mark.integration
@pytest.mark.own_server  # two vLLM imports of its own (~20 s each): left out of --tier fast
def test_the_captured_parsers_match_the_images() -> None:
    """Re-capture each image's `vllm serve` parser (both at once: each spends ~20 s importing vLLM) and compare the
    committed file byte for byte, so the flag lists cannot drift from the pinned vLLM."""
    present = {name: python for name, (python, marker) in IMAGES.items() if marker.exists()}
    if not present:
        pytest.skip(f"no image to capture from: build the CPU image (`cookbook setup`) or the simulated v0.26.0 "
                    f"image (tests/gaudi_sim.py); looked for {', '.join(str(p) for p, _ in IMAGES.values())}")
    started = time.monotonic()
    runs = {}
    for name, python in present.items():
        committed = json.loads((DATA_DIR / name).read_text())
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VLLM_PLUGINS")}
        env["HF_HUB_OFFLINE"] = "1"
        if committed["vllm_plugins"] is not None:
            env["VLLM_PLUGINS"] = committed["vllm_plugins"]
        runs[name] = subprocess.Popen([str(python), str(CAPTURE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        assert out == (DATA_DIR / name).read_text(), f"{name} drifted from the image: re-run {CAPTURE.name}"
    print(f"captured {', '.join(runs)} in {time.monotonic() - started:.0f} s")


@pytest.mark.parametrize("factor,ok", [(4.0, False), (8.0, True)])
def test_max_model_len_counts_the_rope_scaling(factor: float, ok: bool, tmp_path: Path, empty_hub_cache: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """262,144 served tokens on 32,768 yarn-scaled positions: past them at factor 4, within them at factor 8."""
    rope = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 32768}
    write_config(empty_hub_cache, CODER, {**CODER_CONFIG, "max_position_embeddings": 32768, "rope_scaling": rope})
    code, err, _ = validate(variant(tmp_path, CODER), capsys)
    if ok:
        assert (code, err) == (0, [])
    else:
        assert code == 2 and len(err) == 1 and "past the model's 131,072 positions (original_max_position_embeddings " \
            "32,768 x yarn factor 4.0)" in err[0], err


def test_allowing_long_contexts_makes_it_a_warning(tmp_path: Path, empty_hub_cache: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_config(empty_hub_cache, CODER, {**CODER_CONFIG, "max_position_embeddings": 131072})
    path = variant(tmp_path, CODER, lambda d: d["environment"].update(VLLM_ALLOW_LONG_MAX_MODEL_LEN="1"))
    code, err, out = validate(path, capsys)
    assert (code, err) == (0, []) and "warning: " in out and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in out
