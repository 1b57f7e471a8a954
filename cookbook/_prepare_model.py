"""Builds a local Hugging Face checkpoint for a CPU recipe. Runs with the image's Python, not the cookbook's.

This file is executed as a script by `cookbook.models` inside the CPU image's environment (it needs torch
and transformers, which the cookbook's own environment never has). It imports nothing from `cookbook`.

    python _prepare_model.py smollm2-135m-instruct OUT_DIR --gguf FILE
    python _prepare_model.py tiny-qwen3-next OUT_DIR --tokenizer-from SMOLLM2_DIR
    python _prepare_model.py tiny-qwen3-5 OUT_DIR --tokenizer-from SMOLLM2_DIR   (the fix pack's Qwen3.5 proof)
    python _prepare_model.py tiny-gemma3 OUT_DIR --tokenizer-from SMOLLM2_DIR    (sliding-window layers)

All are deterministic: the GGUF file is a pinned package's, the tiny hybrids' weights come from a fixed seed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF file into a bf16 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.bfloat16)
    # A GGUF-loaded model refuses to save while it still carries its quantizer ("not serializable").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# The tiny hybrids' shared layout: three Gated DeltaNet layers and one attention layer, SmolLM2's vocabulary so its
# tokenizer fits, untied embeddings (vLLM's hybrid loaders ignore tied ones: the output head would never load).
HYBRID_LAYOUT = dict(
    vocab_size=49152,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def _save_tiny(model: "object", out: Path, tokenizer_from: Path) -> None:
    import torch

    model = model.to(torch.bfloat16)  # type: ignore[attr-defined]
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[attr-defined]
    for name in TOKENIZER_FILES:
        source = tokenizer_from / name
        if source.exists():
            shutil.copy2(source, out / name)
    if not (out / "tokenizer.json").exists():
        raise SystemExit(f"no tokenizer.json in {tokenizer_from}")


def generate_tiny_qwen3_next(out: Path, tokenizer_from: Path, seed: int) -> None:
    """A 16M-parameter Qwen3-Next (Gated DeltaNet + attention + MoE) with seeded random weights."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        **HYBRID_LAYOUT,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        num_experts=4,
        num_experts_per_tok=2,
        torch_dtype="bfloat16",
    )
    _save_tiny(Qwen3NextForCausalLM(config), out, tokenizer_from)


def generate_tiny_qwen3_5(out: Path, tokenizer_from: Path, seed: int) -> None:
    """A 28M-parameter Qwen3.5 text model (Qwen3_5ForCausalLM): the fix pack's proof that the architecture starts."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**HYBRID_LAYOUT)
    config.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(seed)
    _save_tiny(Qwen3_5ForCausalLM(config), out, tokenizer_from)


# The sliding-window model: Gemma 3's layout at toy size, two sliding-window layers then one global layer, twice.
# The window (512) is much shorter than the context (4,096), so long prompts cross it several times.
SLIDING_LAYOUT = dict(
    vocab_size=49152,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    sliding_window=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    query_pre_attn_scalar=64,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def generate_tiny_gemma3(out: Path, tokenizer_from: Path, seed: int) -> None:
    """A 14M-parameter Gemma 3 text model (Gemma3ForCausalLM): sliding-window and global attention layers."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**SLIDING_LAYOUT)
    config.architectures = ["Gemma3ForCausalLM"]
    torch.manual_seed(seed)
    _save_tiny(Gemma3ForCausalLM(config), out, tokenizer_from)


GENERATORS = {
    "tiny-qwen3-next": generate_tiny_qwen3_next,
    "tiny-qwen3-5": generate_tiny_qwen3_5,
    "tiny-gemma3": generate_tiny_gemma3,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["smollm2-135m-instruct", *GENERATORS])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--tokenizer-from", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kind == "smollm2-135m-instruct":
        if args.gguf is None:
            parser.error("--gguf is required for smollm2-135m-instruct")
        convert_gguf(args.gguf, args.out)
    else:
        if args.tokenizer_from is None:
            parser.error(f"--tokenizer-from is required for {args.kind}")
        GENERATORS[args.kind](args.out, args.tokenizer_from, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
