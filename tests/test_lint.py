"""Lint (issue 11, item 3): the seeds' "What not to do" as rules, each broken by a hostile copy of a seed recipe,
the seeds and CPU recipes clean, and the rules a recipe declares for itself."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from cookbook import lint
from cookbook.cli import main
from cookbook.errors import RecipeError
from cookbook.recipes import RECIPES_DIR, list_recipes, load_recipe_file

CODER = "Qwen/Qwen3-Coder-Next"
FP8 = "Qwen/Qwen3.5-122B-A10B-FP8"
AGENT = "Qwen/Qwen-AgentWorld-35B-A3B"


def variant(tmp_path: Path, recipe_id: str, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of a recipe with one change, in a folder of its own."""
    data = yaml.safe_load((RECIPES_DIR / recipe_id / "recipe.yaml").read_text())
    change(data)
    folder = tmp_path / recipe_id.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rules_broken(path: Path) -> dict[str, str]:
    return {f.rule: f.severity for f in lint.lint_recipe(load_recipe_file(path))}


def test_every_recipe_in_the_checkout_lints_clean() -> None:
    for recipe in list_recipes():
        assert lint.lint_recipe(recipe) == [], recipe.id


def _without_gdn_prefix_cache(data: dict[str, Any]) -> None:
    data["fixes"]["opt_in"].remove("gdn-prefix-cache")
    del data["fixes"]["why"]["gdn-prefix-cache"]


def _ratio_without_ep(data: dict[str, Any]) -> None:
    data["serve"]["flags"].pop("enable-expert-parallel")
    data["hardware"]["expert_parallel"] = False


def _coder_at_tp_2(data: dict[str, Any]) -> None:
    data["serve"]["flags"]["tensor-parallel-size"] = 2
    data["hardware"].update(tensor_parallel=2, cards=2)


HOSTILE = {
    "no-lazy-mode": (CODER, lambda d: d["environment"].update(PT_HPU_LAZY_MODE="1")),
    "no-non-compact-gdn-with-gdn-prefix-cache": (FP8, lambda d: d["environment"].update(VLLM_COMPACT_GDN="0")),
    "gdn-prefix-caching-needs-the-fix": (CODER, _without_gdn_prefix_cache),
    "no-hybrid-cache-by-hand": (CODER, lambda d: d["environment"].update(VLLM_USE_HYBRID_CACHE="1")),
    "moe-gather-ratio-needs-expert-parallel": (FP8, _ratio_without_ep),
    "language-model-only": (AGENT, lambda d: d["serve"]["flags"].pop("language-model-only")),
    "coder-next-not-tp-2-at-256k": (CODER, _coder_at_tp_2),
}


@pytest.mark.parametrize("rule", sorted(HOSTILE))
def test_each_seed_rule_catches_its_violation(tmp_path: Path, rule: str, capsys: pytest.CaptureFixture[str]) -> None:
    recipe_id, change = HOSTILE[rule]
    path = variant(tmp_path, recipe_id, change)
    broken = rules_broken(path)
    assert list(broken) == [rule]  # exactly this rule, none other
    spec = next(r for r in lint.SEED_RULES if r.id == rule)
    assert spec.source.startswith("seed ") and spec.reason
    code = main(["recipe", "validate", str(path)])
    out = capsys.readouterr()
    line = next(ln for ln in (out.err + out.out).splitlines() if f"[{rule}; from seed" in ln)
    assert line.startswith(f"{spec.severity}: {path}: ")
    assert code == (2 if spec.severity == "error" else 0)


def test_each_seed_rule_has_a_hostile_recipe() -> None:
    assert sorted(HOSTILE) == sorted(r.id for r in lint.SEED_RULES)


def test_rules_stay_quiet_where_the_seeds_allow(tmp_path: Path) -> None:
    # Lazy mode set to 0 explicitly, compact GDN on, a flag written `false`: none of these breaks a rule.
    assert rules_broken(variant(tmp_path, CODER, lambda d: d["environment"].update(PT_HPU_LAZY_MODE="0"))) == {}
    # Prefix caching off on the hybrid without the fix: the seeds' own AgentWorld layout.
    assert rules_broken(RECIPES_DIR / AGENT / "recipe.yaml") == {}
    # A `false` flag is an absent flag: --no-language-model-only breaks the rule like dropping it.
    path = variant(tmp_path, AGENT, lambda d: d["serve"]["flags"].update({"language-model-only": False}))
    assert rules_broken(path) == {"language-model-only": "error"}
    # The CPU hybrid with prefix caching and no gdn fix: the v0.26.0 rule is about vllm-gaudi only.
    assert rules_broken(RECIPES_DIR / "cookbook/tiny-qwen3-next/recipe.yaml") == {}


def test_a_recipe_declares_its_own_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = [
        {"id": "keep-long-timeout", "severity": "error", "reason": "the 300 s default stops the engine mid-compile",
         "when": [{"env": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "at_most": 300}]},
        {"id": "eight-seqs", "severity": "warning", "reason": "validated at 8 in flight", "field": "serve.flags.max-num-seqs",
         "when": [{"flag": "max-num-seqs", "not_equals": 8}]},
    ]
    clean = variant(tmp_path, CODER, lambda d: d.update(lint=own))
    assert rules_broken(clean) == {}

    def broken(d: dict[str, Any]) -> None:
        d.update(lint=own)
        d["environment"]["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = "300"
        d["serve"]["flags"]["max-num-seqs"] = 16

    path = variant(tmp_path / "b", CODER, broken)
    findings = lint.lint_recipe(load_recipe_file(path))
    assert [(f.rule, f.severity, f.where) for f in findings] == [
        ("keep-long-timeout", "error", "environment.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"),
        ("eight-seqs", "warning", "serve.flags.max-num-seqs"),
    ]
    assert findings[0].source == "this recipe (recipe.yaml: lint)"
    assert main(["recipe", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "mid-compile [keep-long-timeout; from this recipe" in err


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"id": "x", "severity": "error", "reason": "r", "when": [{"env": "A", "flag": "b", "present": True}]},
         "exactly one of env, flag, fix, fact"),
        ({"id": "x", "severity": "error", "reason": "r", "when": [{"env": "A"}]}, "needs an operator"),
        ({"id": "x", "severity": "error", "reason": "r", "when": [{"fact": "model.secret", "equals": 1}]}, "lint.0.when.0.fact"),
        ({"id": "x", "severity": "fatal", "reason": "r", "when": [{"env": "A", "present": True}]}, "lint.0.severity"),
        ({"id": "x", "severity": "error", "reason": "r", "when": [{"fix": "gdn-prefix-cache", "equals": 1}]}, "`applied` goes with `fix`"),
        ({"id": "x", "severity": "error", "reason": "r", "when": []}, "lint.0.when"),
        ({"id": "x", "severity": "error", "reason": "r", "when": [{"env": "A", "present": True}], "run": "rm -rf /"}, "lint.0.run"),
    ],
)
def test_a_malformed_rule_is_one_line_naming_the_field(tmp_path: Path, rule: dict[str, Any], message: str) -> None:
    path = variant(tmp_path, CODER, lambda d: d.update(lint=[rule]))
    with pytest.raises(RecipeError) as caught:
        load_recipe_file(path)
    text = str(caught.value)
    assert str(path) in text and message in text and "\n" not in text
