"""benchmarks/core_gemm.py counts a model's linear-layer FLOPs per token from its config (grouped KV heads, an explicit
head_dim, the vocabulary projection, a multimodal text_config) and refuses bad input in one line naming the flag or field."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts_under_test import load_script

core_gemm = load_script(Path(__file__).resolve().parent.parent / "benchmarks" / "core_gemm.py")

SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152}


def test_smollm2s_flops_per_token_count_every_projection() -> None:
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q and o, k and v (3 KV heads of 64), the MLP
    stack, with_vocab = core_gemm.flops_per_token(SMOLLM2)
    assert stack == 2 * 30 * per_layer == 212_336_640
    assert with_vocab == stack + 2 * 576 * 49152


def test_an_explicit_head_dim_wider_than_hidden_over_heads_is_used() -> None:
    config = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 1, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 10}
    stack, _ = core_gemm.flops_per_token(config)
    assert stack == 2 * (1024 * 2048 * 2 + 1024 * 1024 * 2 + 3 * 1024 * 3072)


def test_a_folder_without_a_config_is_refused_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert core_gemm.main(["--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"core_gemm: --model: no config.json in {tmp_path}"


def test_an_unknown_dtype_is_refused_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert core_gemm.main(["--model", str(tmp_path), "--dtypes", "float32,fp33"]) == 2
    assert capsys.readouterr().err.strip() == "core_gemm: --dtypes: 'fp33' is not one of float32, bfloat16, float16"


def test_a_config_without_a_needed_field_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    assert core_gemm.main(["--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"core_gemm: {tmp_path / 'config.json'}: no 'intermediate_size'"


def test_a_multimodal_config_is_read_from_its_text_config() -> None:
    nested = {"model_type": "gemma3", "text_config": SMOLLM2}
    assert core_gemm.flops_per_token(core_gemm.text_config(nested)) == core_gemm.flops_per_token(SMOLLM2)
