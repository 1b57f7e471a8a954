"""The lint rule schema: what a rule is (`LintRule`) and the one test of a recipe it is made of (`Condition`).

Apart from `cookbook.lint` because the recipe schema embeds it (a recipe declares its own rules under `lint:`):
the recipe imports the schema from here, and the linter, which reads recipes, sits above both.
"""
from __future__ import annotations

from typing import Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Scalar = Union[bool, int, float, str]

# The facts of a recipe a rule may look at (dotted paths into the schema, plus the values read from the flags).
Fact = Literal[
    "model.id", "model.architecture", "model.hybrid", "model.experts_total", "model.bytes_per_weight",
    "hardware.kind", "hardware.cards", "hardware.tensor_parallel", "hardware.expert_parallel",
    "image.kind", "image.tag", "fixes.profile", "prefix_caching.enabled", "prefix_caching.block_size",
    "precision.dtype", "max_model_len", "max_num_seqs",
]
FACTS: tuple[str, ...] = get_args(Fact)


class Condition(BaseModel):
    """One test of a recipe: exactly one subject (env, flag, fix or fact) and the operators that must all hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = Field(None, description="An environment variable of the recipe, e.g. PT_HPU_LAZY_MODE")
    flag: str | None = Field(None, description="A `vllm serve` flag without dashes; a `false` flag counts as absent")
    fix: str | None = Field(None, description="A fix id: `applied` says whether the profile and opt-ins apply it")
    fact: Fact | None = Field(None, description="A fact of the recipe, e.g. model.hybrid or hardware.expert_parallel")
    present: bool | None = Field(None, description="The env variable or flag is set (true) or not (false)")
    applied: bool | None = Field(None, description="With fix: the fix is applied (true) or not (false)")
    equals: Scalar | None = Field(None, description="The value equals this (strings compared case-insensitively)")
    not_equals: Scalar | None = None
    one_of: list[Scalar] | None = Field(None, description="The value is one of these")
    at_least: float | None = Field(None, description="The value is a number >= this")
    at_most: float | None = Field(None, description="The value is a number <= this")

    @model_validator(mode="after")
    def _one_subject(self) -> "Condition":
        subjects = [n for n in ("env", "flag", "fix", "fact") if getattr(self, n) is not None]
        if len(subjects) != 1:
            raise ValueError("a condition names exactly one of env, flag, fix, fact")
        ops = [n for n in ("present", "applied", "equals", "not_equals", "one_of", "at_least", "at_most")
               if getattr(self, n) is not None]
        if not ops:
            raise ValueError("a condition needs an operator: present, applied, equals, not_equals, one_of, at_least, at_most")
        if (self.applied is not None) != (self.fix is not None) or (self.fix is not None and ops != ["applied"]):
            raise ValueError("`applied` goes with `fix`, and `fix` takes only `applied`")
        if self.present is not None and self.fact is not None:
            raise ValueError("`present` goes with env or flag")
        return self

    @property
    def where(self) -> str:
        """The recipe field the condition reads, for the finding's message."""
        if self.env is not None:
            return f"environment.{self.env}"
        if self.flag is not None:
            return f"serve.flags.{self.flag}"
        if self.fix is not None:
            return "fixes.opt_in"
        return str(self.fact)


class LintRule(BaseModel):
    """A rule a recipe must keep: broken when every condition of `when` holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Short stable name, e.g. no-lazy-mode")
    severity: Literal["error", "warning"] = Field(description="An error fails `cookbook recipe validate`")
    reason: str = Field(min_length=1, description="Why, in the words of where the rule came from")
    source: str = Field("", description="Where the rule came from (a seed page); a recipe's own rule: the recipe")
    when: list[Condition] = Field(min_length=1, description="All must hold for the recipe to break the rule")
    field: str | None = Field(None, description="The recipe field to name; default: the last condition's")
