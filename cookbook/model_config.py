"""What a checkpoint says about itself: config.json, the safetensors index or headers, the chat template.

`cookbook recipe new` builds a recipe from these facts alone, so a model the cookbook has never seen needs no code:
the layer pattern (Gated DeltaNet / linear attention, full attention, sliding window), experts, heads, positions and
RoPE scaling, dtype and quantization, a text model nested in a vision-language config, the parameter count. Nothing
is downloaded: a hub id is looked up in the local Hugging Face cache only.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import UsageError

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# Layer types that keep a recurrent state instead of a KV cache (a hybrid KV layout).
LINEAR_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "gdn", "gated_deltanet"})
SLIDING_LAYER_TYPES = frozenset({"sliding_attention", "sliding_window", "local_attention"})
# Weight-name fragments of a vision tower, to tell whether the checkpoint carries the one its config describes.
_VISION_WEIGHTS = re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder|vision)\.")
_ROUTED_EXPERT = re.compile(r"\.experts\.")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
           "fp32": "fp32", "half": "fp16", "float": "fp32"}
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0}
_HEADER_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                       "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100 << 20


class CheckpointFacts(BaseModel):
    """Everything `recipe new` reads from a checkpoint, each fact from a named file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    folder: Path = Field(description="The checkpoint folder read (a Hugging Face cache snapshot for a hub id)")
    hub_id: str | None = Field(description="The hub id it was resolved from; None for a folder")
    architecture: str = Field(description="config.json architectures[0]")
    model_type: str = Field(description="config.json model_type (of text_config in a vision-language config)")
    layers: int = Field(description="num_hidden_layers")
    layer_counts: dict[str, int] = Field(description="Layers per type: full_attention, linear_attention, sliding_attention")
    sliding_window: int | None = Field(description="Tokens a sliding-window layer attends to")
    experts_total: int = Field(description="Routed experts per MoE layer; 0 for dense")
    experts_active: int = Field(description="Routed experts per token")
    heads: int = Field(description="num_attention_heads")
    kv_heads: int = Field(description="num_key_value_heads")
    hidden_size: int
    vocab_size: int
    max_positions: int = Field(description="max_position_embeddings")
    rope_scaling: dict[str, Any] | None = Field(description="rope_scaling (or rope_parameters when it scales)")
    context: int = Field(description="Positions the model serves natively: max_position_embeddings, times a "
                                     "YaRN/linear/dynamic factor")
    dtype: str = Field(description="bf16, fp16, fp32 or fp8")
    quantization: str | None = Field(description="quantization_config.quant_method")
    weights_bytes: int = Field(description="Bytes of weights (safetensors data, or the index's total_size)")
    params_total: float
    params_active: float
    params_source: str = Field(description="Where the parameter counts come from")
    has_vision_config: bool = Field(description="The config describes a vision tower")
    has_vision_weights: bool | None = Field(description="The weights hold one; None: no weight names to tell")
    chat_template: str = Field("", description="The chat template (chat_template.jinja or tokenizer_config.json)")

    @property
    def hybrid(self) -> bool:
        return self.layer_counts.get("linear_attention", 0) > 0

    @property
    def moe(self) -> bool:
        return self.experts_total > 0

    @property
    def bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT[self.dtype]

    @property
    def language_model_only(self) -> bool:
        """The config has a vision tower the checkpoint lacks: vLLM must build the text model alone."""
        return self.has_vision_config and self.has_vision_weights is False


def resolve_checkpoint(model: str) -> tuple[Path, str | None]:
    """A folder as given, or a hub id's snapshot in the local Hugging Face cache (never downloaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve(), None
    if not _HUB_ID.match(model):
        raise UsageError(f"MODEL {model!r}: no such folder, and not a hub id (org/name)")
    cache = hub_cache()
    repo = cache / f"models--{model.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return (snapshots / ref.read_text().strip()).resolve(), model
    found = sorted(p for p in snapshots.glob("*") if p.is_dir()) if snapshots.is_dir() else []
    if len(found) == 1:
        return found[0].resolve(), model
    raise UsageError(f"MODEL {model!r}: not in the Hugging Face cache at {cache} "
                     f"({'several snapshots and no refs/main' if found else 'no snapshot'}); nothing is downloaded "
                     "(HF_HUB_OFFLINE=1): fetch it into the cache first, or give the checkpoint folder")


def hub_cache() -> Path:
    """Where huggingface_hub keeps its cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface")
    return Path(home).expanduser() / "hub"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: not readable JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return data


def _int(cfg: dict[str, Any], path: Path, *names: str, default: int | None = None, where: str = "") -> int:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{path}: {where}{name}: expected a whole number, got {value!r}")
            return value
    if default is None:
        raise UsageError(f"{path}: {where}{names[0]}: required field is missing")
    return default


def _layer_counts(cfg: dict[str, Any], layers: int, path: Path, where: str) -> dict[str, int]:
    """Layers per kind, from layer_types, layers_block_type, full_attention_interval or a sliding-window pattern."""
    kinds: list[str] | None = None
    for key in ("layer_types", "layers_block_type"):
        if isinstance(cfg.get(key), list):
            kinds = [str(k) for k in cfg[key]]
            if len(kinds) != layers:
                raise UsageError(f"{path}: {where}{key}: {len(kinds)} entries for {layers} layers")
            break
    if kinds is None and isinstance(cfg.get("full_attention_interval"), int) and cfg["full_attention_interval"] > 0:
        step = cfg["full_attention_interval"]
        kinds = ["full_attention" if (i + 1) % step == 0 else "linear_attention" for i in range(layers)]
    pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
    if kinds is None and isinstance(pattern, int) and pattern > 0 and cfg.get("sliding_window"):
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    if kinds is None:
        sliding = cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False
        kinds = ["sliding_attention" if sliding else "full_attention"] * layers
    counts: dict[str, int] = {}
    for kind in kinds:
        name = ("linear_attention" if kind.lower() in LINEAR_LAYER_TYPES
                else "sliding_attention" if kind.lower() in SLIDING_LAYER_TYPES else "full_attention")
        counts[name] = counts.get(name, 0) + 1
    return counts


def _context(cfg: dict[str, Any], positions: int) -> tuple[int, dict[str, Any] | None]:
    """Native positions after RoPE scaling, as vLLM derives max_model_len: llama3/longrope already count it."""
    scaling = cfg.get("rope_scaling")
    if not isinstance(scaling, dict):
        params = cfg.get("rope_parameters")
        scaling = params if isinstance(params, dict) and "factor" in params else None
    if scaling is None:
        return positions, None
    kind = str(scaling.get("rope_type", scaling.get("type", "default")))
    factor = scaling.get("factor")
    if kind in ("yarn", "linear", "dynamic") and isinstance(factor, (int, float)) and factor > 1:
        base = scaling.get("original_max_position_embeddings", positions) if kind == "yarn" else positions
        return int(base * factor), scaling
    return positions, scaling


def _dtype(cfg: dict[str, Any], top: dict[str, Any], path: Path) -> tuple[str, str | None]:
    quant = top.get("quantization_config") or cfg.get("quantization_config")
    method = str(quant.get("quant_method")) if isinstance(quant, dict) and quant.get("quant_method") else None
    if method == "fp8":
        return "fp8", method
    if method is not None:
        raise UsageError(f"{path}: quantization_config.quant_method: {method!r} is not a precision a recipe states "
                         "(bf16, fp16, fp32, fp8)")
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or top.get("torch_dtype") or top.get("dtype") or "bfloat16"
    if str(raw) not in _DTYPES:
        raise UsageError(f"{path}: torch_dtype: {raw!r} is not bf16, fp16 or fp32")
    return _DTYPES[str(raw)], None


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file: tensor name -> dtype, shape, data_offsets."""
    try:
        with open(path, "rb") as handle:
            size_bytes = handle.read(8)
            if len(size_bytes) != 8:
                raise UsageError(f"{path}: not a safetensors file (shorter than its header length)")
            (size,) = struct.unpack("<Q", size_bytes)
            if size > MAX_HEADER_BYTES:
                raise UsageError(f"{path}: not a safetensors file (a {size:,}-byte header)")
            header = json.loads(handle.read(size))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: not a safetensors file (its header is not a JSON object)")
    return {k: v for k, v in header.items() if k != "__metadata__"}


def _weights(folder: Path, dtype: str) -> tuple[int, float, float | None, list[str], str]:
    """Bytes, total parameters, routed-expert parameters (None: unknown), tensor names and where they came from:
    the safetensors headers when the shards are here, else model.safetensors.index.json's metadata."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        total = 0
        size = 0
        routed = 0.0
        names: list[str] = []
        for file in files:
            for name, info in safetensors_header(file).items():
                shape = info.get("shape") if isinstance(info, dict) else None
                if not isinstance(shape, list):
                    raise UsageError(f"{file}: tensor {name!r} has no shape")
                count = math.prod(int(d) for d in shape)
                total += count
                size += count * _HEADER_DTYPE_BYTES.get(str(info.get("dtype")), 2)
                names.append(name)
                if _ROUTED_EXPERT.search(name) and "shared" not in name:
                    routed += count
        return size, float(total), routed, names, f"the safetensors headers of {len(files)} file(s)"
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        raise UsageError(f"{folder}: no *.safetensors file and no {INDEX_FILE}: cannot count the parameters")
    index = _read_json(index_path)
    raw_meta = index.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UsageError(f"{index_path}: weight_map: required, a mapping of tensor name to shard file")
    raw_size = meta.get("total_size")
    if isinstance(raw_size, bool) or not isinstance(raw_size, int) or raw_size <= 0:
        raise UsageError(f"{index_path}: metadata.total_size: expected the weights' size in bytes, got {raw_size!r}")
    size = raw_size
    params = meta.get("total_parameters")
    if isinstance(params, int) and not isinstance(params, bool) and params > 0:
        return size, float(params), None, list(weight_map), f"{INDEX_FILE} metadata.total_parameters"
    return (size, size / BYTES_PER_WEIGHT[dtype], None, list(weight_map),
            f"{INDEX_FILE} metadata.total_size / {BYTES_PER_WEIGHT[dtype]:g} bytes per weight")


def _chat_template(folder: Path) -> str:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace")
    tok = folder / "tokenizer_config.json"
    if tok.is_file():
        try:
            template = json.loads(tok.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            return ""
        if isinstance(template, list):
            return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
        return template if isinstance(template, str) else ""
    return ""


def read_checkpoint(model: str) -> CheckpointFacts:
    """Read a checkpoint folder, or a hub id from the local cache; errors name the file and the field."""
    folder, hub_id = resolve_checkpoint(model)
    path = folder / CONFIG_FILE
    top = _read_json(path)
    archs = top.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UsageError(f"{path}: architectures: required, a list naming the model class")
    text = top.get("text_config") if isinstance(top.get("text_config"), dict) else None
    cfg = text if text is not None else top
    where = "text_config." if text is not None else ""
    layers = _int(cfg, path, "num_hidden_layers", "n_layer", "num_layers", where=where)
    heads = _int(cfg, path, "num_attention_heads", "n_head", where=where)
    positions = _int(cfg, path, "max_position_embeddings", "n_positions", "max_sequence_length", where=where)
    context, scaling = _context(cfg, positions)
    dtype, quant = _dtype(cfg, top, path)
    experts = _int(cfg, path, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                   default=0, where=where)
    active = _int(cfg, path, "num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k",
                  default=0, where=where) if experts else 0
    size, total, routed, names, source = _weights(folder, dtype)
    hidden = _int(cfg, path, "hidden_size", "n_embd", "d_model", where=where)
    if experts and routed is None:
        moe_layers = layers - len(cfg.get("mlp_only_layers") or []) - int(cfg.get("first_k_dense_replace") or 0)
        width = _int(cfg, path, "moe_intermediate_size", "intermediate_size", where=where)
        routed = 3.0 * hidden * width * experts * max(moe_layers, 0)
        source += "; active parameters estimated from the config (3 x hidden x moe_intermediate_size per expert)"
    if experts and routed is not None and routed >= total:
        source += "; the routed-expert estimate exceeds the total, so active parameters are set to the total"
        routed = 0.0
    active_params = total - (routed or 0.0) * (1 - active / experts) if experts else total
    has_vision = isinstance(top.get("vision_config"), dict)
    vision_weights = any(_VISION_WEIGHTS.search(n) for n in names) if names else None
    window = cfg.get("sliding_window")
    return CheckpointFacts(
        folder=folder, hub_id=hub_id, architecture=archs[0], model_type=str(cfg.get("model_type") or top.get("model_type") or ""),
        layers=layers, layer_counts=_layer_counts(cfg, layers, path, where),
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) else None,
        experts_total=experts, experts_active=active, heads=heads,
        kv_heads=_int(cfg, path, "num_key_value_heads", default=heads, where=where), hidden_size=hidden,
        vocab_size=_int(cfg, path, "vocab_size", where=where), max_positions=positions, rope_scaling=scaling,
        context=context, dtype=dtype, quantization=quant, weights_bytes=size, params_total=total,
        params_active=max(min(active_params, total), 1.0), params_source=source, has_vision_config=has_vision,
        has_vision_weights=vision_weights if has_vision else None, chat_template=_chat_template(folder))
