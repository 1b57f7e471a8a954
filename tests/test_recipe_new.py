"""`cookbook recipe new` (cookbook/recipe_new.py, cookbook/model_config.py) and the fix pack's relevance data.

A recipe written from a checkpoint's facts alone must load, validate, lint, render its launch block, container
command, manifests and page, and its page must name only the fixes and reasons true of that model: checked on the
three CPU recipes' checkpoints and on checkpoints of architectures the project has never seen, built here.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from cookbook import fixpack, pages
from cookbook.cli import main
from cookbook.container import render_docker_run
from cookbook.errors import FixPackError, UsageError
from cookbook.k8s import FILES, render_recipe
from cookbook.lint import lint_recipe
from cookbook.model_config import read_checkpoint
from cookbook.models import models_dir
from cookbook.recipe_new import REVIEW, new_recipe
from cookbook.recipes import Recipe, load_recipe, load_recipe_file, render_launch_block, serve_argv

QWEN_SEEDS = ["Qwen/Qwen3-Coder-Next", "Qwen/Qwen-AgentWorld-35B-A3B", "Qwen/Qwen3.5-122B-A10B-FP8"]
CPU_RECIPES = ["HuggingFaceTB/SmolLM2-135M-Instruct", "cookbook/tiny-qwen3-next", "cookbook/tiny-gemma3"]
QWEN_VOCAB = 151_936  # the Qwen3-Next and Qwen3.5 tokenizers' vocabulary (config.json vocab_size)


def _checkpoint(folder: Path, config: dict[str, Any], total_size: int, tensors: list[str],
                template: str | None = None) -> Path:
    """A checkpoint as `recipe new` reads it: config.json, a safetensors index (no shards), a chat template."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    index = {"metadata": {"total_size": total_size}, "weight_map": {t: "model-00001-of-00002.safetensors" for t in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    if template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder


def _new_arch(tmp_path: Path) -> Path:
    """A vision-language FP8 MoE of an architecture the cookbook has never seen: the text model nested in
    text_config, YaRN x4 over 32K positions, a vision config but no vision weights, Hermes tool calls and <think>."""
    config = {
        "architectures": ["Zephyr9MoeForConditionalGeneration"], "model_type": "zephyr9_vl",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "vision_config": {"depth": 24, "hidden_size": 1024},
        "text_config": {
            "model_type": "zephyr9", "num_hidden_layers": 48, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 4, "vocab_size": QWEN_VOCAB, "max_position_embeddings": 32768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "torch_dtype": "bfloat16",
        },
    }
    tensors = ["model.embed_tokens.weight", "model.layers.0.mlp.experts.0.up_proj.weight", "lm_head.weight"]
    template = "{% if tools %}<tools></tools>{% endif %}<tool_call>{{ x }}</tool_call><think>\n"
    return _checkpoint(tmp_path / "zephyr9", config, 62_000_000_000, tensors, template)


def _llama_like(tmp_path: Path) -> Path:
    """The issue's dense 8B case: Llama 3.1's facts (llama3 RoPE scaling, 131,072 positions, 128K vocabulary)."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
        "torch_dtype": "bfloat16",
    }
    tensors = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
    return _checkpoint(tmp_path / "llama-like", config, 16_060_522_496, tensors, "<|python_tag|>{{ messages }}")


def _fix_ids(rows: list[tuple[str, str]]) -> list[str]:
    return [fix.split("`")[1] for fix, _ in rows]


def _renders(recipe: Recipe) -> str:
    """Everything a recipe is rendered into must work on it; the page is returned for its own assertions."""
    assert not [f for f in lint_recipe(recipe) if f.severity == "error"]
    assert "vllm serve" in render_launch_block(recipe)
    assert serve_argv(recipe)[:2] == ["vllm", "serve"]
    if recipe.image.kind == "vllm-gaudi":
        assert "docker run" in render_docker_run(recipe)
        deployment = next(o for o in render_recipe(recipe).files[FILES[1]] if o["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["containers"]
    return pages.render_page(recipe)


def test_a_new_architecture_gets_a_complete_recipe_whose_page_names_only_its_fixes(tmp_path: Path) -> None:
    out = tmp_path / "recipe"
    assert main(["recipe", "new", str(_new_arch(tmp_path)), "--hardware", "gaudi3", "--cards", "4",
                 "--name", "acme/Zephyr9-MoE-FP8", "--out", str(out)]) == 0
    recipe = load_recipe_file(out / "recipe.yaml")
    flags = recipe.serve.flags
    # The seeds' order; TP from the cards, EP for an FP8 MoE on several cards, the template's parsers.
    assert list(flags) == [
        "tensor-parallel-size", "enable-expert-parallel", "served-model-name", "max-model-len", "max-num-seqs",
        "gpu-memory-utilization", "block-size", "max-num-batched-tokens", "enable-chunked-prefill",
        "enable-prefix-caching", "enable-prompt-tokens-details", "language-model-only", "reasoning-parser",
        "enable-auto-tool-choice", "tool-call-parser"]
    assert flags["tensor-parallel-size"] == 4 and recipe.hardware.expert_parallel
    assert flags["max-model-len"] == 131072  # YaRN x4 over 32,768 positions
    assert flags["tool-call-parser"] == "hermes" and flags["reasoning-parser"] == "deepseek_r1"
    assert recipe.model.experts_total == 128 and recipe.model.experts_active == 8 and recipe.precision.dtype == "fp8"
    routed = 3 * 4096 * 768 * 128 * 48  # no shard headers: the config's estimate of the routed experts
    assert recipe.model.params_total == 62e9  # FP8: one byte a weight
    assert recipe.model.params_active == pytest.approx(62e9 - routed * (1 - 8 / 128))
    assert recipe.image.tag == "v0.26.0" and recipe.image.commit == "b059f9c" and recipe.image.gaudi_sw == "1.24.1"
    assert recipe.model.summary.startswith(REVIEW) and recipe.model.description.startswith(REVIEW)
    assert not recipe.verification.skip and recipe.verification.max_tokens == 2048  # tools parsed; it reasons
    assert all(note.startswith(REVIEW) for note in recipe.serve.notes)
    page = _renders(recipe)
    rows = pages.fix_rows(recipe)
    ids = _fix_ids(rows)
    # A non-hybrid at 131K positions, TP 4, compile mode, prefix caching on, an FP8 MoE.
    assert "rank-exception-fatal" in ids and "prompt-order" in ids and "resumed-prefill-logits" in ids
    for absent in ("hybrid-decode-pad", "gdn-prefix-cache", "rope-cpu-cache", "gather-logprobs-int32",
                   "seeded-sampling"):
        assert absent not in ids, absent
    why = dict(zip(ids, (w for _, w in rows)))
    assert "151,936-token vocabulary" in why["prompt-logprobs"] and "qwen3_5_moe" not in page
    assert "at TP 4" in why["rank-exception-fatal"]
    assert "196K" not in page and "hybrid KV" not in page  # no other model's reason
    assert "not needed by this model: `hybrid-decode-pad`" in recipe.fixes.note
    assert "`fp8-moe-gather` (`Zephyr9MoeForConditionalGeneration` is an FP8 MoE (128 experts" in recipe.fixes.note
    assert f"{len(ids)} fixes this configuration depends on" in page


def test_the_issues_dense_8b_page_does_not_borrow_the_seeds_reasons(tmp_path: Path) -> None:
    recipe = new_recipe(str(_llama_like(tmp_path)), hardware="gaudi2", cards=1, name="meta-llama/Llama-like-8B",
                        out=tmp_path / "recipe")
    page = _renders(recipe)
    ids = _fix_ids(pages.fix_rows(recipe))
    assert ids == ["prompt-order", "sampling-rows-refresh", "structured-output-rows", "bad-words-index",
                   "logitsprocs-rows", "async-discard-counter", "resumed-prefill-logits", "prompt-logprobs",
                   "logprobs-decode-guard"]
    assert "9 fixes this configuration depends on" in page  # the issue's page said 14
    assert recipe.serve.flags["tool-call-parser"] == "llama3_json" and "reasoning-parser" not in recipe.serve.flags
    assert recipe.max_model_len == 131072 and "expert_parallel" not in recipe.hardware.description
    for borrowed in ("qwen3_5_moe", "196K", "hybrid KV", "TP rank"):  # the seeds' reasons for their own models
        assert borrowed not in page, borrowed


@pytest.mark.parametrize("prepared", ["smollm2-135m-instruct", "tiny-qwen3-next", "tiny-gemma3"])
def test_the_cpu_recipes_checkpoints(tmp_path: Path, prepared: str) -> None:
    folder = models_dir() / prepared
    if not (folder / "config.json").is_file():
        pytest.skip(f"{folder}: not prepared on this machine (`cookbook setup`)")
    recipe = new_recipe(str(folder), hardware="cpu", out=tmp_path / prepared)
    assert recipe.serve.weights is not None and recipe.serve.weights.prepare == prepared
    assert serve_argv(recipe, models_dir())[2] == str(folder)
    assert recipe.image.kind == "vllm-cpu" and recipe.image.tag == "0.32.0" and recipe.fixes.profile == "cpu-0.32.0"
    assert list(recipe.fixes.why) == ["vllm-cpu-version"]  # eager, not a Qwen3.5: the other three are not needed
    assert "not needed by this model: `aot-cache-inductor-load`" in recipe.fixes.note
    page = _renders(recipe)
    assert "1 fix this configuration depends on" in page
    shipped = load_recipe({"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
                           "tiny-qwen3-next": "cookbook/tiny-qwen3-next", "tiny-gemma3": "cookbook/tiny-gemma3"}[prepared])
    assert recipe.model.architecture == shipped.model.architecture
    assert recipe.model.hybrid == shipped.model.hybrid
    assert recipe.model.experts_total == shipped.model.experts_total
    assert recipe.model.experts_active == shipped.model.experts_active
    assert recipe.precision.weights_gb == pytest.approx(shipped.precision.weights_gb, abs=0.01)
    if prepared == "smollm2-135m-instruct":
        assert recipe.model.params_total == pytest.approx(shipped.model.params_total, rel=0.001)
    assert set(recipe.verification.skip) == {"tool-call-auto", "tool-call-streamed", "tool-result"}  # no tool parser
    if recipe.model.hybrid:  # the hybrid block is vLLM's to size: caching off until it is measured
        assert recipe.serve.flags["enable-prefix-caching"] is False and "block-size" not in recipe.serve.flags
    else:
        assert recipe.prefix_caching.enabled and recipe.prefix_caching.block_size == recipe.serve.flags["block-size"]
    if prepared == "tiny-gemma3":
        assert "sliding-window" in recipe.model.tags and "512 tokens" in recipe.model.description


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    repo = cache / "models--acme--Zephyr9"
    shutil.copytree(_new_arch(tmp_path), repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    facts = read_checkpoint("acme/Zephyr9")
    assert facts.hub_id == "acme/Zephyr9" and facts.folder == (repo / "snapshots" / "0123abcd").resolve()
    recipe = new_recipe("acme/Zephyr9", cards=2, out=tmp_path / "r")
    assert recipe.model.id == "acme/Zephyr9" and "served-model-name" not in recipe.serve.flags
    with pytest.raises(UsageError, match=r"'acme/Missing': not in the Hugging Face cache at .*nothing is downloaded"):
        read_checkpoint("acme/Missing")


def test_safetensors_headers_count_the_parameters(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["TinyMoeForCausalLM"], "num_hidden_layers": 1, "hidden_size": 4, "num_attention_heads": 2,
        "vocab_size": 10, "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 1}))
    header = {"embed.weight": {"dtype": "BF16", "shape": [10, 4], "data_offsets": [0, 80]},
              **{f"layers.0.experts.{e}.w.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}
                 for e in range(4)}}
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    facts = read_checkpoint(str(folder))
    assert facts.params_total == 40 + 4 * 16 and facts.params_active == 40 + 16
    assert facts.weights_bytes == 2 * (40 + 64) and facts.kv_heads == 2 and facts.layer_counts == {"full_attention": 1}


@pytest.mark.parametrize(("edit", "flags", "message"), [
    ({}, ["--cards", "3"], "--cards 3: the model's 32 attention heads do not split over 3 cards"),
    ({}, ["--hardware", "cpu", "--profile", "v0.26.0"], "--profile v0.26.0: --hardware cpu needs a vllm-cpu profile"),
    ({}, ["--hardware", "cpu", "--cards", "2"], "--cards 2: a CPU recipe runs on one machine"),
    ({}, ["--max-model-len", "200000"], "--max-model-len 200000: past the model's 131,072 positions"),
    ({}, ["--max-num-seqs", "0"], "--max-num-seqs 0: at least 1"),
    ({"quantization_config": {"quant_method": "awq"}}, [], "quantization_config.quant_method: 'awq' is not"),
    ({"num_attention_heads": None}, [], "config.json: num_attention_heads: required field is missing"),
    ({"architectures": []}, [], "config.json: architectures: required"),
])
def test_bad_input_is_one_line_naming_the_flag_or_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        edit: dict[str, Any], flags: list[str], message: str) -> None:
    folder = _llama_like(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(edit)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    assert main(["recipe", "new", str(folder), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "recipe.yaml").exists()


def test_an_existing_recipe_is_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, out = _llama_like(tmp_path), tmp_path / "out"
    assert main(["recipe", "new", str(folder), "--out", str(out)]) == 0
    before = (out / "recipe.yaml").read_text()
    assert main(["recipe", "new", str(folder), "--out", str(out), "--cards", "2"]) == 2
    assert "pass --force to overwrite it" in capsys.readouterr().err
    assert (out / "recipe.yaml").read_text() == before
    assert main(["recipe", "new", str(folder), "--out", str(out), "--cards", "2", "--force"]) == 0
    assert yaml.safe_load((out / "recipe.yaml").read_text())["hardware"]["cards"] == 2


# -- the pack's relevance data ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe_id", QWEN_SEEDS + CPU_RECIPES)
def test_relevance_data_agrees_with_every_hand_written_why(recipe_id: str) -> None:
    """The seeds' per-model reasons were written by hand; the pack's rules, given each recipe's facts, pick the same
    fixes. The one exception is the seeds' own: gather-logprobs-int32 is lazy-mode only, kept by them in compile
    mode "to keep one fix set"."""
    recipe = load_recipe(recipe_id)
    vocab = QWEN_VOCAB if recipe_id in QWEN_SEEDS else 49152
    traits = pages.model_traits(recipe).model_copy(update={"vocab_size": vocab})
    rows = fixpack.load_pack().required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, traits=traits)
    assert all(r.needed is not None for r in rows)
    assert {r.id for r in rows if r.needed} == set(recipe.fixes.why) - {"gather-logprobs-int32"}
    assert all(r.why == fixpack.NOT_NEEDED for r in rows if not r.needed)


def test_a_page_without_hand_written_why_takes_the_packs_reasons(tmp_path: Path) -> None:
    source = Path(load_recipe("Qwen/Qwen-AgentWorld-35B-A3B").path)
    data = yaml.safe_load(source.read_text())
    data["fixes"]["why"] = {}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe_file(tmp_path / "recipe.yaml")
    rows = dict(pages.fix_rows(recipe))
    assert rows["`seeded-sampling`"] == rows["`prompt-order`"] == fixpack.NOT_NEEDED
    assert rows["`prompt-logprobs`"].startswith("`Qwen3_5MoeForConditionalGeneration` returns flat hidden states")
    assert "at TP 2" in rows["`rank-exception-fatal`"]
    page = pages.render_page(recipe)
    assert "10 fixes this configuration depends on" in page  # the 11 of its why, less gather-logprobs-int32


def _pack_with(tmp_path: Path, fix: str, relevant_when: Any) -> Path:
    root = tmp_path / "fixes"
    shutil.copytree(fixpack.FIXES_DIR, root, ignore=shutil.ignore_patterns("__pycache__", "tools", "*.py"))
    path = root / "v0.26.0" / fix / "fix.json"
    meta = json.loads(path.read_text())
    meta["relevant_when"] = relevant_when
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


@pytest.mark.parametrize(("relevant_when", "message"), [
    ([{"facts": {"is_big": True}, "why": "x"}], r"relevant_when\.0\.facts\.is_big: Extra inputs"),
    ([{"facts": {"moe": True}, "why": "{colour} experts"}], r"relevant_when\.0\.why: .*names \{colour\}, not a model trait"),
    ([{"facts": {}, "why": "{vocab_size:,} tokens"}], r"why names \{vocab_size\}, which these facts do not make known"),
    ([{"facts": {"tensor_parallel_min": 0}, "why": "x"}], r"relevant_when\.0\.facts\.tensor_parallel_min"),
    ([], r"relevant_when: List should have at least 1 item"),
])
def test_fixpack_loading_validates_relevant_when(tmp_path: Path, relevant_when: Any, message: str) -> None:
    path = _pack_with(tmp_path, "rank-exception-fatal", relevant_when)
    with pytest.raises(FixPackError, match=message) as caught:
        fixpack.load_pack(path.parents[2])
    assert str(path) in str(caught.value)


def test_every_fix_says_when_it_matters() -> None:
    raw = [json.loads(p.read_text()) for p in sorted(fixpack.FIXES_DIR.glob("*/*/fix.json"))]
    assert raw and all(meta.get("relevant_when") for meta in raw)
