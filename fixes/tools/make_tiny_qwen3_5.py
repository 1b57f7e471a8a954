#!/usr/bin/env python3
"""Write a tiny random-weight Qwen3.5 text model (``Qwen3_5ForCausalLM``) to prove the qwen3-vl-no-torchvision fix.

Run it with the image's interpreter (it needs the image's transformers and torch):

    $IMAGE/bin/python fixes/tools/make_tiny_qwen3_5.py OUT --tokenizer-from $MODELS/smollm2-135m-instruct

Why so small: the point is that vLLM's qwen3_5 module starts at all on an image without torchvision; the weights
are seeded random numbers, so the text is meaningless.  The layout mirrors the seeds' Qwen3.5 family: Gated DeltaNet
(linear_attention) layers plus a full-attention layer, with SmolLM2's 49,152-token vocabulary so its tokenizer fits.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the checkpoint to")
    parser.add_argument("--tokenizer-from", type=Path, required=True,
                        help="a model folder whose tokenizer files are copied (SmolLM2-135M-Instruct)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
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
        tie_word_embeddings=False,  # vLLM's hybrid loaders ignore tied embeddings (see research/cpu-server.md)
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(args.seed)
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        src = args.tokenizer_from / name
        if src.exists():
            shutil.copy2(src, args.out / name)
    if not (args.out / "tokenizer.json").exists():
        print(f"no tokenizer.json in {args.tokenizer_from}", file=sys.stderr)
        return 1
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: Qwen3_5ForCausalLM, {params / 1e6:.1f}M parameters, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
