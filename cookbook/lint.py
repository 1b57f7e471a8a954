"""Lint: the seeds' "What not to do" as rules a machine checks, and rules a recipe declares for itself.

A rule is data (`LintRule`, its schema in `cookbook.lint_rules`): an id, a severity, the reason, where it came
from, and conditions (`when`) that all hold for a recipe that breaks it. A condition looks at one thing of the
recipe: an environment variable, a `vllm serve` flag, whether a fix is applied, or a fact of the schema
(`model.hybrid`, `hardware.expert_parallel`, ...). The seeds' rules are `SEED_RULES` below; a recipe adds its own
under `lint:` in the same schema. `cookbook recipe validate` runs these and the checks of what cannot run
(`cookbook.validate_rules`: flags against vLLM's parser, ranges, parallelism against cards and the model, facts
that must agree, image against profile, literal secrets) through `validate_recipe`, prints one line per finding
and exits non-zero on an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .lint_rules import Condition, LintRule

if TYPE_CHECKING:
    from .recipes import Recipe


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    where: str
    reason: str
    source: str

    def line(self, path: object) -> str:
        return f"{self.severity}: {path}: {self.where}: {self.reason} [{self.rule}; from {self.source}]"


SEED_000 = "seed 000 (Qwen/Qwen-AgentWorld-35B-A3B)"
SEED_002 = "seed 002 (Qwen/Qwen3-Coder-Next)"
SEED_003 = "seed 003 (Qwen/Qwen3.5-122B-A10B-FP8)"
_GAUDI = {"fact": "image.kind", "equals": "vllm-gaudi"}
# Qwen3.5-architecture checkpoints whose config.json describes a vision tower the checkpoint does not ship.
QWEN3_5_VL_ARCHITECTURES = ["Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration"]

SEED_RULES: list[LintRule] = [LintRule.model_validate(rule) for rule in (
    {
        "id": "no-lazy-mode", "severity": "error",
        "reason": "Do not use lazy mode (PT_HPU_LAZY_MODE=1): on vllm-gaudi the GDN hybrids failed the first decode "
                  "at TP 2 in lazy mode, the seeded-sampling segfault and the logprob id corruption are lazy-mode bugs",
        "source": f"{SEED_000}, {SEED_002}, {SEED_003}: What not to do",
        "when": [_GAUDI, {"fact": "model.hybrid", "equals": True}, {"env": "PT_HPU_LAZY_MODE", "equals": "1"}],
    },
    {
        "id": "no-non-compact-gdn-with-gdn-prefix-cache", "severity": "error",
        "reason": "do not set VLLM_COMPACT_GDN=0 with gdn-prefix-cache: the fix keeps the GDN layers in their compact "
                  "per-request slots and stores its checkpoints in the KV pages",
        "source": f"{SEED_002}, {SEED_003}: What not to do",
        "when": [{"fix": "gdn-prefix-cache", "applied": True}, {"env": "VLLM_COMPACT_GDN", "equals": "0"}],
    },
    {
        "id": "gdn-prefix-caching-needs-the-fix", "severity": "error",
        "reason": "do not turn on prefix caching on a Gated DeltaNet hybrid without gdn-prefix-cache: on v0.26.0 a "
                  "prefix-cache hit on the GDN layers resumes from the wrong state and still answers fluently",
        "source": f"{SEED_000}, {SEED_002}, {SEED_003}: What not to do",
        "field": "prefix_caching.enabled",
        "when": [_GAUDI, {"fact": "fixes.profile", "equals": "v0.26.0"}, {"fact": "model.hybrid", "equals": True},
                 {"fact": "prefix_caching.enabled", "equals": True}, {"fix": "gdn-prefix-cache", "applied": False}],
    },
    {
        "id": "no-hybrid-cache-by-hand", "severity": "error",
        "reason": "do not set VLLM_USE_HYBRID_CACHE by hand: v0.26.0 enables it for GDN models on its own",
        "source": f"{SEED_002}: What not to do",
        "when": [_GAUDI, {"env": "VLLM_USE_HYBRID_CACHE", "present": True}],
    },
    {
        "id": "moe-gather-ratio-needs-expert-parallel", "severity": "error",
        "reason": "do not copy VLLM_HPU_MOE_GATHER_RATIO to a layout without expert parallelism: the ratio is "
                  "relative to the experts on one card",
        "source": f"{SEED_003}: What not to do",
        "when": [{"env": "VLLM_HPU_MOE_GATHER_RATIO", "present": True}, {"flag": "enable-expert-parallel", "present": False}],
    },
    {
        "id": "language-model-only", "severity": "error",
        "reason": "do not drop --language-model-only: config.json describes a vision tower, the checkpoint ships only "
                  "the language model, and without the flag vLLM tries to build the visual modules and fails",
        "source": f"{SEED_000}: Launch notes and What not to do; {SEED_003} launches with it",
        "when": [_GAUDI, {"fact": "model.architecture", "one_of": QWEN3_5_VL_ARCHITECTURES},
                 {"flag": "language-model-only", "present": False}],
    },
    {
        "id": "coder-next-not-tp-2-at-256k", "severity": "warning",
        "reason": "do not move Qwen3-Coder-Next to TP 2 for a general-purpose 256K configuration",
        "source": f"{SEED_002}: What not to do",
        "when": [_GAUDI, {"fact": "model.id", "equals": "Qwen/Qwen3-Coder-Next"},
                 {"fact": "hardware.tensor_parallel", "at_most": 2}, {"fact": "max_model_len", "at_least": 262144}],
    },
)]


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


def _fact(recipe: "Recipe", path: str) -> Any:
    value: Any = recipe
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _same(a: Any, b: Any) -> bool:
    na, nb = _number(a), _number(b)
    if na is not None and nb is not None:
        return na == nb
    return str(a).strip().lower() == str(b).strip().lower()


def _applied_fixes(recipe: "Recipe") -> set[str]:
    from .fixpack import load_pack

    return {f.id for f in load_pack().selection(recipe.fixes.profile, recipe.fixes.opt_in)}


def holds(condition: Condition, recipe: "Recipe", applied: set[str]) -> bool:
    """Whether one condition holds for the recipe."""
    if condition.fix is not None:
        return (condition.fix in applied) is condition.applied
    if condition.env is not None:
        present = condition.env in recipe.environment
        value: Any = recipe.environment.get(condition.env)
    elif condition.flag is not None:
        raw = recipe.serve.flags.get(condition.flag)
        present = raw is not None and raw is not False
        value = raw if present else None
    else:
        present, value = True, _fact(recipe, str(condition.fact))
    if condition.present is not None and present is not condition.present:
        return False
    if not present and any(getattr(condition, n) is not None for n in ("equals", "one_of", "at_least", "at_most")):
        return False
    if condition.equals is not None and not _same(value, condition.equals):
        return False
    if condition.not_equals is not None and present and _same(value, condition.not_equals):
        return False
    if condition.one_of is not None and not any(_same(value, v) for v in condition.one_of):
        return False
    number = _number(value)
    if condition.at_least is not None and (number is None or number < condition.at_least):
        return False
    if condition.at_most is not None and (number is None or number > condition.at_most):
        return False
    return True


def lint_recipe(recipe: "Recipe", rules: list[LintRule] | None = None) -> list[Finding]:
    """Every rule the recipe breaks: the seeds' rules, then the recipe's own (`lint:`), errors first."""
    applied = _applied_fixes(recipe)
    own = [rule if rule.source else rule.model_copy(update={"source": f"this recipe ({recipe.path.name}: lint)"})
           for rule in recipe.lint]
    findings = []
    for rule in (SEED_RULES if rules is None else rules) + own:
        if all(holds(c, recipe, applied) for c in rule.when):
            findings.append(Finding(rule.id, rule.severity, rule.field or rule.when[-1].where, rule.reason, rule.source))
    return sorted(findings, key=lambda f: f.severity != "error")
