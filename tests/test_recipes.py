"""cookbook/recipes.py: schema errors, launch blocks byte-identical to the seeds, hostile values quoted."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from cookbook.errors import RecipeError
from cookbook.image import native_bf16
from cookbook.launch import fallback_words, host_fallback
from cookbook.recipes import (
    RECIPES_DIR,
    list_recipes,
    load_recipe,
    load_recipe_file,
    render_launch_block,
    serve_argv,
)

from shared_files import SEED_FILES, seed_text

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def seed_launch_block(text: str) -> str:
    """From the seed page's first `export` line through the last `vllm serve` flag."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("export "))
    serve = next(i for i in range(start, len(lines)) if lines[i].startswith("vllm serve "))
    end = serve
    while lines[end].endswith(" \\"):
        end += 1
    return "\n".join(lines[start : end + 1]) + "\n"


@pytest.mark.parametrize("recipe_id", sorted(SEED_FILES))
def test_launch_block_is_byte_identical_to_the_seed(recipe_id: str) -> None:
    expected = seed_launch_block(seed_text(recipe_id))
    assert render_launch_block(load_recipe(recipe_id)) == expected


def test_every_recipe_in_the_tree_validates() -> None:
    ids = {r.id for r in list_recipes()}
    assert {CPU, "cookbook/tiny-qwen3-next", *SEED_FILES} <= ids


def test_cpu_recipe_launch_block_uses_the_fix_pack_then_vllm_serve() -> None:
    block = render_launch_block(load_recipe(CPU))
    assert 'python3 "$COOKBOOK/fixes/apply_all.py" --profile cpu-0.32.0 || exit 1' in block
    assert 'vllm serve "$COOKBOOK_MODELS/smollm2-135m-instruct" \\' in block


def test_derived_values_come_from_the_flags() -> None:
    recipe = load_recipe("Qwen/Qwen3.5-122B-A10B-FP8")
    assert (recipe.max_model_len, recipe.max_num_seqs) == (262144, 16)
    assert (recipe.tool_parser, recipe.reasoning_parser) == ("qwen3_coder", "qwen3")


# -- schema errors: each names the file, the field and what was expected ------------------------------------------


def _write_variant(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((RECIPES_DIR / "Qwen/Qwen3-Coder-Next/recipe.yaml").read_text())
    mutate(data)
    path = tmp_path / "Org" / "Model" / "recipe.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set(path: str, value):
    def mutate(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def _delete(path: str):
    def mutate(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


BAD_RECIPES = [
    ("missing field", _delete("image"), "image: required field is missing"),
    ("unknown field", _set("hardware.gpus", 4), "hardware.gpus: unknown field"),
    ("wrong type", _set("hardware.cards", "four"), "hardware.cards: Input should be a valid integer"),
    ("bad enum", _set("hardware.kind", "gaudi9"), "hardware.kind: Input should be 'gaudi2', 'gaudi3' or 'cpu'"),
    ("flag with dashes", _set("serve.flags", {"--max-model-len": 1, "max-num-seqs": 8}), "must be written without dashes"),
    ("missing max-model-len", _set("serve.flags", {"max-num-seqs": 8, "tensor-parallel-size": 4}), "serve.flags needs max-model-len"),
    ("caching disagrees", _set("prefix_caching.enabled", False), "prefix_caching.enabled disagrees"),
    ("tp disagrees", _set("hardware.tensor_parallel", 2), "hardware.tensor_parallel is 2 but serve.flags says 4"),
    ("gaudi image without pins", _delete("image.vllm_commit"), "a vllm-gaudi image needs vllm_commit"),
    ("bad env name", _set("environment", {"BAD-NAME": "1"}), "not a valid shell variable name"),
    ("env bool", _set("environment", {"FLAG": True}), "environment.FLAG must be a string or number"),
    ("active > total", _set("model.params_active", 1e12), "params_active must not exceed params_total"),
    ("caching on without block", _delete("prefix_caching.block_size"), "block_size is required"),
    ("bf16 fallback on a gaudi image", _set("serve.without_native_bf16", {"flags": {"dtype": "float32"}}),
     "serve.without_native_bf16 is for vllm-cpu recipes"),
    ("bf16 fallback flag with dashes", _set("serve.without_native_bf16", {"flags": {"--dtype": "float32"}}),
     "must be written without dashes"),
    ("bf16 fallback env bool", _set("serve.without_native_bf16", {"environment": {"X": True}}), "environment.X must be"),
]


@pytest.mark.parametrize("mutate,expected", [b[1:] for b in BAD_RECIPES], ids=[b[0] for b in BAD_RECIPES])
def test_bad_recipe_names_file_and_field(tmp_path: Path, mutate, expected: str) -> None:
    path = _write_variant(tmp_path, mutate)
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message
    assert "\n" not in message


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "x" / "recipe.yaml"
    path.parent.mkdir()
    path.write_text("title: a\nmodel: [unclosed\n")
    with pytest.raises(RecipeError, match=r"recipe.yaml: line \d+: not valid YAML"):
        load_recipe_file(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("- just a list\n")
    with pytest.raises(RecipeError, match="expected a mapping"):
        load_recipe_file(path)


def test_unknown_recipe_id_lists_the_known_ones() -> None:
    with pytest.raises(RecipeError, match="not found.*known: .*Qwen/Qwen3-Coder-Next"):
        load_recipe("Nope/Nothing")


# -- hostile values: quoted so that nothing runs -----------------------------------------------------------------

HOSTILE = ["$(touch {marker})", "`touch {marker}`", "a b; touch {marker}", "x' ; touch {marker}; '", '"$(touch {marker})"']


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_values_are_quoted_and_run_nothing(tmp_path: Path, template: str) -> None:
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)

    def mutate(data):
        data["environment"] = {"HOSTILE_ENV": value}
        data["serve"]["flags"]["served-model-name"] = value

    recipe = load_recipe_file(_write_variant(tmp_path, mutate))
    block = render_launch_block(recipe)
    exports = block.split("\n\n")[0]
    serve = block[block.index("vllm serve") :]
    # Run the exports, and the serve line with `vllm` replaced by printf: the shell sees every word, runs nothing.
    script = f"{exports}\nprintf '%s\\n' \"$HOSTILE_ENV\"\n" + serve.replace("vllm serve", "printf '%s\\n'", 1)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert not marker.exists()
    lines = out.stdout.splitlines()
    assert lines[0] == value
    assert value in lines  # the flag value arrived as one word, intact
    assert shlex.quote(value) in block


def test_secret_environment_values_are_masked(tmp_path: Path) -> None:
    path = _write_variant(tmp_path, _set("environment", {"HF_TOKEN": "hf_abcdefghijklmnop", "PLAIN": "1"}))
    block = render_launch_block(load_recipe_file(path))
    assert "hf_abcdefghijklmnop" not in block
    assert "export HF_TOKEN='***'" in block


def test_serve_argv_resolves_placeholders_and_is_a_list(tmp_path: Path) -> None:
    recipe = load_recipe(CPU)
    argv = serve_argv(recipe, tmp_path / "models", extra={"port": 9999})
    assert argv[:3] == ["vllm", "serve", str(tmp_path / "models" / "smollm2-135m-instruct")]
    template = argv[argv.index("--chat-template") + 1]
    assert Path(template).is_file()
    assert argv[-2:] == ["--port", "9999"]
    assert "--no-enable-prefix-caching" in serve_argv(load_recipe("Qwen/Qwen-AgentWorld-35B-A3B"))


def test_a_cpu_recipe_serves_its_bf16_fallback_only_on_a_host_without_native_bf16() -> None:
    smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert smol.serve.flags["dtype"] == "bfloat16" and smol.environment["VLLM_CPU_KVCACHE_SPACE"] == "2"
    fallback = host_fallback(smol, native=False)
    assert fallback is not None and fallback.flags == {"dtype": "float32"}
    assert fallback.environment == {"VLLM_CPU_KVCACHE_SPACE": "3"}  # fp32 KV: 69,888 tokens, 8 full-context streams
    assert fallback_words(fallback) == "--dtype float32 with VLLM_CPU_KVCACHE_SPACE=3"
    assert fallback_words(fallback, kept={"dtype"}) == "the recipe's flags with VLLM_CPU_KVCACHE_SPACE=3"
    assert host_fallback(smol, native=True) is None
    assert host_fallback(load_recipe("Qwen/Qwen3-Coder-Next"), native=False) is None
    assert native_bf16("flags\t: fpu avx2 amx_bf16 amx_tile\n") is True
    assert native_bf16("flags\t: fpu avx2 avx512f\n") is False
    assert native_bf16("processor\t: 0\n") is None  # unknown: the recipe's own flags
