"""`cookbook recipe new`: a complete recipe for a model the cookbook has never seen, from its checkpoint's facts.

The flags follow the seeds' order and the facts that decide them (TP from the cards, expert parallelism for an FP8
MoE on several cards, the parsers its chat template ships, block size and prefix caching for a hybrid,
--language-model-only for a vision config without vision weights); the fixes come from the fix pack's
`relevant_when` data, so the page names only the fixes and reasons true of this model. Every prose field is filled
from the facts and starts with REVIEW, for the engineer to check; nothing here is per model.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import UsageError
from .fixpack import NOT_NEEDED, FixPack, Profile, load_pack
from .model_config import CheckpointFacts
from .pages import model_traits
from .recipes import RECIPE_FILE, RECIPES_DIR, Recipe, load_recipe_file

REVIEW = "TODO(review): "
HardwareKind = Literal["gaudi2", "gaudi3", "cpu"]
HARDWARE_LABEL = {"gaudi2": "Gaudi 2", "gaudi3": "Gaudi 3"}
CPU_PROFILE_ANCHOR = "vllm"  # a profile whose anchor package is vllm patches the vllm-cpu image
CPU_DEFAULT_CONTEXT = 8192  # a CPU serves short contexts: the CPU recipes' longest
GAUDI_DEFAULTS = {"max-num-seqs": 8, "gpu-memory-utilization": 0.9, "block-size": 128, "max-num-batched-tokens": 8192}
# The chat template's own markers -> the vLLM tool parser that reads them (first match wins).
TOOL_PARSERS = (("<function=", "qwen3_coder"), ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"),
                ("[TOOL_CALLS]", "mistral"))
TOOL_CHECKS = ("tool-call-auto", "tool-call-streamed", "tool-result")
# A template that thinks in <think> tags: the reasoning parser of its model family, else deepseek_r1's.
REASONING_PARSERS = {"qwen": "qwen3"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _params(count: float) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"


def _layers_phrase(facts: CheckpointFacts) -> str:
    counts = facts.layer_counts
    words = {"linear_attention": "linear-attention (Gated DeltaNet)", "full_attention": "full-attention",
             "sliding_attention": f"sliding-window ({facts.sliding_window or '?'} tokens)"}
    if len(counts) == 1:
        return f"{facts.layers} {words[next(iter(counts))]} layers"
    return " and ".join(f"{n} {words[k]}" for k, n in counts.items()) + " layers"


def _image(profile: Profile) -> dict[str, Any]:
    pins = {p.dist: p for p in profile.pins}
    if profile.anchor == CPU_PROFILE_ANCHOR:
        cpu = pins.get("vllm-cpu")
        if cpu is None or cpu.version is None:
            raise UsageError(f"--profile {profile.name}: its profile.json pins no vllm-cpu version")
        return {"kind": "vllm-cpu", "tag": cpu.version}
    gaudi, vllm, sw = pins.get("vllm-gaudi"), pins.get("vllm"), pins.get("habana-torch-plugin")
    if gaudi is None or gaudi.commit is None or vllm is None or vllm.commit is None or sw is None:
        raise UsageError(f"--profile {profile.name}: its profile.json lacks the vllm-gaudi, vllm or Gaudi SW pin")
    gaudi_sw = sw.version or (sw.version_prefix or "").rstrip(".")
    return {"kind": "vllm-gaudi", "tag": profile.name, "commit": gaudi.commit[:7], "vllm_commit": vllm.commit[:8],
            "gaudi_sw": gaudi_sw}


def _parsers(facts: CheckpointFacts) -> tuple[str | None, str | None]:
    template = facts.chat_template
    tool = next((parser for marker, parser in TOOL_PARSERS if marker in template), None)
    reasoning = None
    if "<think>" in template:
        reasoning = next((p for family, p in REASONING_PARSERS.items() if facts.model_type.startswith(family)),
                         "deepseek_r1")
    return tool, reasoning


def _prepared_name(facts: CheckpointFacts) -> str | None:
    """The cookbook's own prepared checkpoint this folder is, if any (a CPU recipe then names it, not a path)."""
    from .models import MODELS, models_dir

    try:
        inside = facts.folder.parent.resolve() == models_dir().resolve()
    except OSError:
        return None
    return facts.folder.name if inside and facts.folder.name in MODELS else None


def build_recipe(facts: CheckpointFacts, pack: FixPack, *, name: str, hardware: HardwareKind, cards: int,
                 profile_name: str, max_model_len: int | None = None, max_num_seqs: int | None = None) -> dict[str, Any]:
    """The recipe as data, in the seeds' field and flag order; every derived prose field starts with REVIEW."""
    profile = pack.profile(profile_name)
    image = _image(profile)
    cpu = hardware == "cpu"
    if cpu != (image["kind"] == "vllm-cpu"):
        want = "a vllm-cpu profile (cpu-0.32.0)" if cpu else "a vllm-gaudi profile (v0.26.0)"
        raise UsageError(f"--profile {profile_name}: --hardware {hardware} needs {want}")
    if cpu and cards != 1:
        raise UsageError(f"--cards {cards}: a CPU recipe runs on one machine (--cards 1)")
    if facts.heads % cards:
        raise UsageError(f"--cards {cards}: the model's {facts.heads} attention heads do not split over {cards} cards "
                         "(tensor parallelism needs a divisor)")
    if cpu and facts.dtype == "fp8":
        raise UsageError(f"--hardware cpu: {facts.folder / 'config.json'} is an FP8 checkpoint; the CPU image "
                         "serves bf16, fp16 or fp32 weights")
    context = max_model_len or (min(facts.context, CPU_DEFAULT_CONTEXT) if cpu else facts.context)
    if context > facts.context:
        raise UsageError(f"--max-model-len {context}: past the model's {facts.context:,} positions "
                         f"({facts.folder / 'config.json'} max_position_embeddings{' and rope_scaling' if facts.rope_scaling else ''})")
    seqs = max_num_seqs or GAUDI_DEFAULTS["max-num-seqs"]
    tool, reasoning = _parsers(facts)
    expert_parallel = facts.moe and facts.dtype == "fp8" and cards > 1 and facts.experts_total % cards == 0
    caching = not facts.hybrid
    prepared = _prepared_name(facts) if cpu else None
    model_id = facts.hub_id or (name if prepared else str(facts.folder))
    served_by_path = prepared is None and facts.hub_id is None
    dtype_label = facts.dtype.upper()
    gb = max(round(facts.weights_bytes / 1e9, 2), 0.01)
    label = HARDWARE_LABEL.get(hardware, "")
    hw_desc = (f"{REVIEW}CPU: describe the machine (vCPUs, ISA); vLLM binds the model to one core" if cpu else
               f"{cards}x {label} (TP {cards}{', expert parallel' if expert_parallel else ''})" if cards > 1
               else f"1x {label}")
    where = "vLLM's CPU build" if cpu else f"{'one' if cards == 1 else cards} {label} card{'s' if cards > 1 else ''}"
    kind_words = ("hybrid " if facts.hybrid else "") + (
        f"MoE ({facts.experts_total} experts, {facts.experts_active} per token, {_params(facts.params_active)} active)"
        if facts.moe else "dense")
    context_note = "native" if context == facts.context else f"of {facts.context:,} native positions"
    rope = (f", RoPE scaling {facts.rope_scaling.get('rope_type', facts.rope_scaling.get('type', '?'))}"
            f" x{facts.rope_scaling.get('factor', '?')}" if facts.rope_scaling else "")
    vision = (" Its config describes a vision tower the checkpoint does not carry: served text only "
              "(--language-model-only)." if facts.language_model_only else
              " Its config describes a vision tower." if facts.has_vision_config else "")

    env: dict[str, str] = {}
    if cpu:
        env.update(VLLM_CPU_KVCACHE_SPACE="2", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    else:
        env["PT_HPU_LAZY_MODE"] = "0"
        if cards > 1:
            env["PT_HPU_ENABLE_LAZY_COLLECTIVES"] = "true"
        if facts.hybrid:
            env.update(VLLM_USE_NAIVE_MAMBA_CACHE_SHARING="1", VLLM_COMPACT_GDN="1")
        env.update(VLLM_SKIP_WARMUP="true", VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="1800")

    flags: dict[str, Any] = {}
    notes: list[str] = []
    if cpu:
        flags["served-model-name"] = name
        if facts.dtype not in _TORCH_DTYPE:
            raise UsageError(f"{facts.folder / 'config.json'}: torch_dtype: {facts.dtype} has no CPU dtype")
        flags["dtype"] = _TORCH_DTYPE[facts.dtype]
    else:
        flags["tensor-parallel-size"] = cards
        if expert_parallel:
            flags["enable-expert-parallel"] = True
            notes.append(f"{REVIEW}--enable-expert-parallel: an FP8 MoE on {cards} cards, as the seeds' FP8 MoE "
                         f"recipe; {facts.experts_total // cards} experts a card.")
        if model_id != name:
            flags["served-model-name"] = name
    flags["max-model-len"] = context
    flags["max-num-seqs"] = seqs
    if not cpu:
        flags["gpu-memory-utilization"] = GAUDI_DEFAULTS["gpu-memory-utilization"]
    if not cpu or not facts.hybrid:
        flags["block-size"] = GAUDI_DEFAULTS["block-size"]
    if not cpu:
        flags["max-num-batched-tokens"] = GAUDI_DEFAULTS["max-num-batched-tokens"]
        flags["enable-chunked-prefill"] = True
    flags["enable-prefix-caching"] = caching
    if caching:
        flags["enable-prompt-tokens-details"] = True
    if cpu:
        flags["enforce-eager"] = True
        notes.append(f"{REVIEW}--enforce-eager: a quick start with no torch.compile on the CPU build.")
    if facts.language_model_only:
        flags["language-model-only"] = True
        notes.append(f"{REVIEW}--language-model-only: {facts.folder.name}'s config.json has a vision_config, but "
                     "no weight of the checkpoint belongs to a vision tower.")
    if reasoning:
        flags["reasoning-parser"] = reasoning
    if tool:
        flags["enable-auto-tool-choice"] = True
        flags["tool-call-parser"] = tool
    notes.insert(0, f"{REVIEW}--max-model-len {context}: " + (
        "the model's native positions" if context == facts.context else
        f"{facts.context:,} native positions, served shorter") + f"{rope}.")
    if tool or reasoning:
        notes.append(f"{REVIEW}parsers from the chat template's own markers: "
                     + ", ".join(x for x in (f"tools {tool}" if tool else "", f"reasoning {reasoning}" if reasoning
                                             else "") if x) + ".")
    else:
        notes.append(f"{REVIEW}no tool or reasoning parser: the chat template has no tool-call or <think> markers.")
    if facts.hybrid:
        notes.append(f"{REVIEW}prefix caching off: a hybrid's KV block is sized by vLLM at start-up to hold a "
                     "linear-attention state page; turn caching on" + (" with the gdn-prefix-cache opt-in fix" if
                                                                       not cpu else "") +
                     " and set prefix_caching.block_size to the block the server reports.")
    if served_by_path and not cpu:
        notes.append(f"{REVIEW}the checkpoint is served from {facts.folder}: that path must exist where vLLM runs "
                     "(inside the container).")

    recipe: dict[str, Any] = {
        "title": f"{name} on vLLM's CPU build" if cpu else name,
        "model": {
            "id": model_id,
            "architecture": facts.architecture,
            "summary": f"{REVIEW}{_params(facts.params_total)} {kind_words} model ({_layers_phrase(facts)}), "
                       f"{dtype_label}, {context:,}-token context on {where}.",
            "description": (
                f"{REVIEW}{facts.architecture} ({facts.model_type}): {_layers_phrase(facts)}, hidden "
                f"{facts.hidden_size}, {facts.heads} attention heads and {facts.kv_heads} KV heads, a "
                f"{facts.vocab_size:,}-token vocabulary, {facts.max_positions:,} positions{rope}; "
                f"{_params(facts.params_total)} parameters (counted from {facts.params_source}) in {dtype_label}, "
                f"{gb} GB of weights, on {where}.{vision}"),
            "params_total": float(facts.params_total),
            "params_active": float(facts.params_active),
            "bytes_per_weight": facts.bytes_per_weight,
            "experts_total": facts.experts_total,
            "experts_active": facts.experts_active,
            "hybrid": facts.hybrid,
            "vocab_size": facts.vocab_size,
            "tags": [t for t, on in (("moe", facts.moe), ("dense", not facts.moe), ("hybrid", facts.hybrid),
                                     ("sliding-window", "sliding_attention" in facts.layer_counts),
                                     ("text", True), ("cpu", cpu)) if on],
        },
        "hardware": {"kind": hardware, "cards": cards, "tensor_parallel": 1 if cpu else cards,
                     "expert_parallel": expert_parallel, "description": hw_desc},
        "image": image,
        "precision": {"dtype": facts.dtype, "weights_gb": gb,
                      "description": f"{dtype_label} ({gb} GB of weights)"},
        "context_note": context_note,
        "variant": "" if cpu else f"{dtype_label} weights ({gb} GB), {where}.",
        "environment": env,
        "fixes": {"profile": profile.name, "opt_in": [], "why": {}, "note": ""},
        "serve": {"flags": flags, "notes": notes},
        "prefix_caching": {"enabled": caching, "block_size": flags["block-size"] if caching else None,
                           "notes": f"{REVIEW}" + (
                               f"prefix caching is on with {flags['block-size']}-token blocks: only full blocks are "
                               "cached, so a prompt shorter than one block never hits." if caching else
                               "prefix caching is off: the hybrid KV block is not known before the server starts.")},
        "buckets": "" if cpu else "No bucket file and no bucket variables.",
        "known_issues": [f"{REVIEW}none measured yet: run `cookbook verify` and record what it shows."],
        "do_not": [f"{REVIEW}{line}" for line, on in (
            ("Do not use lazy mode.", not cpu),
            ("Do not drop --language-model-only.", facts.language_model_only),
            ("Do not turn on prefix caching without gdn-prefix-cache, and do not set VLLM_COMPACT_GDN=0 with it.",
             facts.hybrid and not cpu),
            ("Do not read this page's figures as Gaudi figures: they are measured on a CPU.", cpu)) if on],
        "verification": {"max_tokens": 2048 if reasoning else 64 if cpu else 256},
    }
    if tool is None:  # served without a tool parser, the server takes no tool calls: those checks do not apply
        reason = f"{REVIEW}no --tool-call-parser: the checkpoint's chat template has no tool-call markers"
        recipe["verification"]["skip"] = {name: reason for name in TOOL_CHECKS}
    if prepared is not None:
        recipe["serve"] = {"weights": {"prepare": prepared}, **recipe["serve"]}
    if not recipe["do_not"]:
        del recipe["do_not"]
    recipe["fixes"]["why"], recipe["fixes"]["note"] = _fixes(recipe, pack)
    for optional in ("variant", "buckets"):
        if not recipe[optional]:
            del recipe[optional]
    return recipe


def _fixes(data: dict[str, Any], pack: FixPack) -> tuple[dict[str, str], str]:
    """fixes.why and fixes.note from the pack's relevance data: the fixes that concern this model with the reason
    true of it, the rest named as applied by the profile and not needed, and the opt-in fixes that concern it."""
    recipe = Recipe.model_validate({**data, "id": "new", "path": Path("new") / RECIPE_FILE})
    rows = pack.required_fixes(recipe.fixes.profile, traits=model_traits(recipe))
    why = {row.id: row.why for row in rows if row.needed}
    unneeded = [f"`{row.id}`" for row in rows if not row.needed]
    traits = model_traits(recipe)
    profile = pack.profile(recipe.fixes.profile)
    opt_ins = [f for f in (pack.fix(n) for n in profile.fixes) if f.opt_in and f.relevance(traits)[0]]
    note = (f"{REVIEW}All from the {profile.name} profile of the fix pack; the reasons are the pack's own for a "
            "model with these facts (relevant_when in each fix.json).")
    if unneeded:
        note += f" {NOT_NEEDED.capitalize()}: {', '.join(unneeded)}."
    if opt_ins:
        note += " Opt-in fixes that concern this model, not named yet: " + "; ".join(
            f"`{f.id}` ({f.relevance(traits)[1]})" for f in opt_ins) + "."
    return why, note


def default_out(name: str) -> Path:
    return RECIPES_DIR / name


def write_recipe(data: dict[str, Any], folder: Path, source: CheckpointFacts, force: bool = False) -> Recipe:
    """Write folder/recipe.yaml only once it loads and validates; refuse to overwrite without force."""
    path = folder / RECIPE_FILE
    if path.exists() and not force:
        raise UsageError(f"--out {folder}: {path} exists; pass --force to overwrite it")
    folder.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `cookbook recipe new` from {source.folder / 'config.json'}\n"
              f"# (parameters from {source.params_source}). Every field starting with {REVIEW.strip()} was\n"
              "# filled from the checkpoint's facts: check it against the model card, then drop the marker.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)
    tmp = folder / f".{RECIPE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(text, encoding="utf-8")
    try:
        try:
            rid = path.resolve().parent.relative_to(RECIPES_DIR.resolve()).as_posix()
        except ValueError:
            rid = folder.name
        load_recipe_file(tmp, recipe_id=rid)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return load_recipe_file(path, recipe_id=rid)


def recipe_name(facts: CheckpointFacts, name: str | None) -> str:
    chosen = name or facts.hub_id or f"local/{facts.folder.name}"
    if not _NAME.match(chosen):
        raise UsageError(f"--name {chosen!r}: expected org/name (letters, digits, . _ -)")
    return chosen


def new_recipe(model: str, *, hardware: HardwareKind | None = None, cards: int = 1, profile: str | None = None,
               out: Path | None = None, name: str | None = None, force: bool = False,
               max_model_len: int | None = None, max_num_seqs: int | None = None) -> Recipe:
    """Read MODEL's checkpoint, build its recipe and write it; the written recipe, loaded and validated."""
    from .model_config import read_checkpoint

    pack = load_pack()
    if profile is None:
        profile = next((p.name for p in pack.profiles.values() if (p.anchor == CPU_PROFILE_ANCHOR) == (hardware == "cpu")),
                       None)
        if profile is None:
            raise UsageError(f"--profile: the fix pack has no profile for --hardware {hardware}")
    if profile not in pack.profiles:
        raise UsageError(f"--profile {profile}: not a profile of the fix pack ({', '.join(pack.profiles)})")
    if hardware is None:
        hardware = "cpu" if pack.profile(profile).anchor == CPU_PROFILE_ANCHOR else "gaudi2"
    for flag, value in (("--cards", cards), ("--max-model-len", max_model_len), ("--max-num-seqs", max_num_seqs)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: at least 1")
    facts = read_checkpoint(model)
    chosen = recipe_name(facts, name)
    data = build_recipe(facts, pack, name=chosen, hardware=hardware, cards=cards, profile_name=profile,
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs)
    return write_recipe(data, Path(out) if out is not None else default_out(chosen), facts, force)
