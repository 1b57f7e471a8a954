"""The fix pack's metadata (fixes/) as typed models, for recipe pages and validation; never apply anything.

The only way to change an image is ``fixes/apply_all.py``, which runs inside the bare image with the standard library
alone.  The pack has one reader, that tool's engine (``fixes/fixengine``): this module loads the pack through it and
types what it read, so recipes can be checked against the pack and pages can render their "Required fixes" tables
from the recipe's per-model reason plus each fix's own metadata.
"""
from __future__ import annotations

import importlib.util
import string
import sys
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import FixPackError

FIXES_DIR = Path(__file__).resolve().parent.parent / "fixes"
ENGINE_DIR = FIXES_DIR / "fixengine"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Probe(_Model):
    """A small shell command that demonstrates the bug (exits non-zero while the bug is there)."""

    probe: str


class Target(_Model):
    path: str = Field(description="Package-relative path, e.g. vllm/compilation/decorators.py (the engine refuses "
                                  "'..', '.', empty or absolute parts)")
    pre: str | None = Field(description="sha256 in the pristine image; None: the fix creates the file")
    post: str | None = Field(description="sha256 after this fix alone; None: unknown (no payload) or deleted")


class Proof(_Model):
    """What was shown of a fix, and where: the test that shows it, and whether that test reproduces the bug itself."""

    shown: Literal["cpu", "gaudi-only"] = Field(
        description="cpu: the test fails on the pristine module with the symptom and passes with the payload; "
                    "gaudi-only: only a Gaudi card shows the bug, the test checks what the payload promises")
    hook: str | None = Field(default=None, description="The bug lives in vLLM: which vLLM function the payload "
                                                       "wraps, and from which vllm_gaudi file")
    test: str = Field(description="tests/<file>.py::test_<fix id with - as _>, the test that shows it")
    summary: str = Field(description="The symptom on the pristine file, and what the test shows with the payload")


class ModelTraits(_Model):
    """The facts about a served model that decide which fixes concern it: what `relevant_when` rules test and what
    their reason templates may name (``{architecture}``, ``{vocab_size:,}``...). None: the recipe does not say."""

    architecture: str = Field(description="config.json architecture, e.g. Qwen3NextForCausalLM")
    hybrid: bool = Field(description="Linear-attention (Gated DeltaNet / Mamba) layers beside attention: a hybrid KV cache")
    moe: bool = Field(description="Routed experts")
    experts_total: int = Field(0, description="Routed experts per MoE layer")
    experts_active: int = Field(0, description="Routed experts per token")
    fp8: bool = Field(description="FP8 weights (precision.dtype fp8)")
    prefix_caching: bool = Field(description="Prefix caching on")
    enforce_eager: bool = Field(description="--enforce-eager: no torch.compile")
    lazy_mode: bool | None = Field(description="Gaudi lazy mode (PT_HPU_LAZY_MODE other than 0); None: not set")
    tensor_parallel: int = Field(description="--tensor-parallel-size")
    max_model_len: int = Field(description="--max-model-len: the highest position served")
    max_num_batched_tokens: int | None = Field(description="--max-num-batched-tokens: the longest prefill chunk")
    vocab_size: int | None = Field(description="Vocabulary size (model.vocab_size)")

    @property
    def chunk_logits_gb(self) -> float | None:
        """fp32 logits of one whole prefill chunk, in GB: what the stock prompt-logprobs path allocates at once."""
        if self.vocab_size is None or self.max_num_batched_tokens is None:
            return None
        return self.max_num_batched_tokens * self.vocab_size * 4 / 1e9

    def value(self, name: str) -> Any:
        return self.chunk_logits_gb if name == "chunk_logits_gb" else getattr(self, name)


# What a reason template may name: every trait, and the derived chunk size.
TRAIT_NAMES = (*ModelTraits.model_fields, "chunk_logits_gb")


class RelevanceFacts(_Model):
    """The closed vocabulary of a relevance rule: every fact given must hold (none given: every model)."""

    hybrid: bool | None = Field(None, description="The model has (true) or lacks (false) a hybrid KV layout")
    moe: bool | None = Field(None, description="The model is (or is not) a mixture of experts")
    fp8: bool | None = Field(None, description="The weights are (or are not) FP8")
    prefix_caching: bool | None = Field(None, description="The recipe serves with prefix caching on (or off)")
    enforce_eager: bool | None = Field(None, description="The recipe runs eager (true) or compiles (false)")
    lazy_mode: bool | None = Field(None, description="The recipe runs Gaudi lazy mode (or compile mode)")
    architecture_in: list[str] | None = Field(None, min_length=1, description="model.architecture is one of these")
    tensor_parallel_min: int | None = Field(None, ge=1, description="--tensor-parallel-size is at least this")
    max_model_len_min: int | None = Field(None, ge=1, description="--max-model-len is at least this")
    chunk_logits_gb_min: float | None = Field(None, gt=0, description="A prefill chunk's fp32 logits "
                                                                     "(max-num-batched-tokens x vocab x 4 bytes) reach this many GB")

    def holds(self, traits: ModelTraits) -> bool | None:
        """True when every fact holds, False when one does not, None when the recipe leaves one unknown."""
        unknown = False
        for name, wanted in self:
            if wanted is None:
                continue
            if name == "architecture_in":
                ok: bool | None = traits.architecture in wanted
            elif name.endswith("_min"):
                have = traits.value(name.removesuffix("_min"))
                ok = None if have is None else have >= wanted
            else:
                have = traits.value(name)
                ok = None if have is None else have is wanted
            if ok is False:
                return False
            unknown = unknown or ok is None
        return None if unknown else True

    def unknown(self, traits: ModelTraits) -> list[str]:
        """The facts this rule needs that the recipe does not state."""
        missing = []
        for name, wanted in self:
            trait = name.removesuffix("_min")
            if wanted is None or name == "architecture_in" or traits.value(trait) is not None:
                continue
            if trait == "chunk_logits_gb":
                missing += [n for n in ("max_num_batched_tokens", "vocab_size") if traits.value(n) is None]
            else:
                missing.append(trait)
        return missing


_SAMPLE_TRAITS = ModelTraits(architecture="SampleForCausalLM", hybrid=True, moe=True, experts_total=8,
                             experts_active=2, fp8=True, prefix_caching=True, enforce_eager=False, lazy_mode=True,
                             tensor_parallel=2, max_model_len=262144, max_num_batched_tokens=8192, vocab_size=151936)


class RelevanceCase(_Model):
    """One way a fix concerns a model: the facts, and the reason true of every model that has them."""

    facts: RelevanceFacts = Field(description="What makes the fix relevant (all must hold; {} = every model)")
    why: str = Field(min_length=1, description="Why such a model needs it, a str.format template over the traits, "
                                               "e.g. 'at TP {tensor_parallel}, ...'")

    @field_validator("why")
    @classmethod
    def _template(cls, why: str) -> str:
        names = [field for _, field, _, _ in string.Formatter().parse(why) if field is not None]
        unknown = [n for n in names if n not in TRAIT_NAMES]
        if unknown:
            raise ValueError(f"names {{{unknown[0]}}}, not a model trait (traits: {', '.join(TRAIT_NAMES)})")
        try:
            why.format(**{n: _SAMPLE_TRAITS.value(n) for n in TRAIT_NAMES})
        except (ValueError, IndexError, KeyError) as exc:
            raise ValueError(f"not a valid template ({exc})") from None
        return why

    @model_validator(mode="after")
    def _named_facts_known(self) -> "RelevanceCase":
        """A template may name an optional trait only when its facts make it known (else the text has a None)."""
        names = {field for _, field, _, _ in string.Formatter().parse(self.why) if field}
        known = set(TRAIT_NAMES) - {"lazy_mode", "max_num_batched_tokens", "vocab_size", "chunk_logits_gb"}
        if self.facts.chunk_logits_gb_min is not None:
            known |= {"max_num_batched_tokens", "vocab_size", "chunk_logits_gb"}
        if self.facts.lazy_mode is not None:
            known.add("lazy_mode")
        loose = sorted(names - known)
        if loose:
            raise ValueError(f"why names {{{loose[0]}}}, which these facts do not make known")
        return self


class Fix(_Model):
    id: str
    profile: str
    title: str
    why: str = Field(description="Generic symptom and cause; the per-model reason lives in each recipe")
    kind: Literal["bugfix", "backport", "workaround"]
    origin: str
    upstream: list[str]
    remove_when: str
    opt_in: bool
    depends_on: list[str]
    conflicts: list[str]
    check: str | Probe
    targets: list[Target] | None = Field(description="None: the files this fix touches are not known")
    has_payload: bool
    relevant_when: list[RelevanceCase] = Field(
        min_length=1, description="The model facts that make this fix relevant, each with the reason true of such a "
                                  "model; the first case that holds gives the page's why")
    notes: str = ""
    proof: Proof | None = Field(default=None, description="What was shown and where; None: nothing yet (no payload, "
                                                          "or a profile proven by serving, as cpu-0.32.0)")

    @property
    def proof_label(self) -> str:
        """What was shown of this fix, and where, in the words `apply_all.py --list` uses."""
        proof = None if self.proof is None else self.proof.model_dump()
        return str(engine().base.proof_label(proof, self.has_payload))

    @property
    def symptom(self) -> str:
        """The first sentence of ``why``: what a user sees."""
        first = self.why.split(". ")[0].rstrip(".")
        return first + "."

    @property
    def check_label(self) -> str:
        return self.check if isinstance(self.check, str) else f"probe: {self.check.probe}"

    def relevance(self, traits: ModelTraits) -> tuple[bool | None, str]:
        """Whether this fix concerns a model with these traits, and why: the reason of the first case that holds;
        False with no reason; None (unknown) naming the facts the recipe leaves out."""
        unknown: list[str] = []
        for case in self.relevant_when:
            holds = case.facts.holds(traits)
            if holds:
                return True, case.why.format(**{n: traits.value(n) for n in TRAIT_NAMES})
            if holds is None:
                unknown += [n for n in case.facts.unknown(traits) if n not in unknown]
        if unknown:
            return None, ", ".join(unknown)
        return False, ""


class Pin(_Model):
    what: str
    dist: str
    version: str | None = None
    version_prefix: str | None = None
    commit: str | None = None
    required: bool = True


class Profile(_Model):
    name: str
    title: str
    image: str
    anchor: str
    pins: list[Pin]
    files: dict[str, str | None] = Field(description="Path -> pristine sha256 (None: must be absent)")
    fixes: list[str] = Field(description="Every fix of the profile, opt-in ones included, in pack order")
    notes: str = ""


class RequiredFix(_Model):
    """One row of a recipe page's Required fixes table."""

    id: str
    opt_in: bool
    why: str = Field(description="Why this model needs it (the recipe's reason, else the fix's reason for such a "
                                 "model, else its symptom)")
    needed: bool | None = Field(True, description="False: applied by the profile, not needed by this model; "
                                                  "None: the recipe does not state the facts that decide it")
    fix: Fix


NOT_NEEDED = "applied by the profile; not needed by this model"


class FixPack(_Model):
    root: Path
    order: list[str]
    fixes: dict[str, Fix]
    profiles: dict[str, Profile]

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            raise FixPackError(f"unknown fix profile {name!r} (profiles: {', '.join(self.profiles)})") from None

    def fix(self, fix_id: str) -> Fix:
        try:
            return self.fixes[fix_id]
        except KeyError:
            raise FixPackError(f"unknown fix {fix_id!r}") from None

    def selection(self, profile: str, opt_in: list[str] | tuple[str, ...] = ()) -> list[Fix]:
        """What ``apply_all.py --profile PROFILE OPT_IN...`` applies, in order; the same errors, as FixPackError."""
        prof = self.profile(profile)
        for name in opt_in:
            fix = self.fixes.get(name)
            if fix is None or fix.profile != prof.name:
                raise FixPackError(f"unknown fix {name!r} for profile {prof.name}")
            if not fix.opt_in:
                raise FixPackError(f"fix {name!r} is not opt-in: profile {prof.name} already applies it")
        chosen = [self.fixes[f] for f in prof.fixes if not self.fixes[f].opt_in or f in opt_in]
        ids = {f.id for f in chosen}
        for fix in chosen:
            missing = [d for d in fix.depends_on if d not in ids]
            if missing:
                raise FixPackError(f"fix {fix.id!r} depends on {missing[0]!r}: name it too")
            clash = [c for c in fix.conflicts if c in ids]
            if clash:
                raise FixPackError(f"fix {fix.id!r} conflicts with {clash[0]!r}")
        return chosen

    def required_fixes(self, profile: str, opt_in: list[str] | tuple[str, ...] = (),
                       why: dict[str, str] | None = None, traits: ModelTraits | None = None) -> list[RequiredFix]:
        """Rows for a page's Required fixes table: the recipe's per-model ``why`` in its own order when it has one
        (every name must be applied by the selection); else, given the model's ``traits``, the fixes that concern it
        with their reason (pack order), then the rest as applied but not needed; else every fix with its symptom."""
        selected = {f.id: f for f in self.selection(profile, opt_in)}
        if why:
            unknown = [name for name in why if name not in selected]
            if unknown:
                raise FixPackError(f"{unknown[0]!r} is not applied by profile {profile} "
                                   f"{' '.join(opt_in)}".rstrip())
            return [RequiredFix(id=n, opt_in=selected[n].opt_in, why=text, fix=selected[n]) for n, text in why.items()]
        if traits is None:
            return [RequiredFix(id=f.id, opt_in=f.opt_in, why=f.symptom, fix=f) for f in selected.values()]
        rows = []
        for fix in selected.values():
            needed, reason = fix.relevance(traits)
            if needed is False:
                reason = NOT_NEEDED
            elif needed is None:
                reason = f"applied by the profile; may concern this model (the recipe does not state its {reason})"
            rows.append(RequiredFix(id=fix.id, opt_in=fix.opt_in, why=reason, needed=needed, fix=fix))
        return sorted(rows, key=lambda r: r.needed is not True)


def engine() -> ModuleType:
    """The pack's engine, ``fixes/fixengine``, loaded by path under its own name (the module apply_all.py loads).

    By path because ``fixes/`` must not go on ``sys.path``: its folders would shadow installed packages."""
    loaded = sys.modules.get("fixengine")
    if loaded is not None and Path(loaded.__file__ or "").resolve().parent == ENGINE_DIR:
        return loaded
    spec = importlib.util.spec_from_file_location("fixengine", ENGINE_DIR / "__init__.py",
                                                  submodule_search_locations=[str(ENGINE_DIR)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fixengine"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("fixengine", None)
        raise
    return module


def _where(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def load_pack(root: Path | None = None, checks: Collection[str] | None = None) -> FixPack:
    """Read fixes/ (or ``root``) with the engine's loader and type it; any error is a FixPackError naming the file.

    ``checks``: the check registry's names (``cookbook.checks.CHECKS``); given, a fix whose ``check`` names another
    check is an error naming its fix.json and the field.  Passed in by the caller, because the checks import the
    recipes, which read this pack."""
    fixengine = engine()
    try:
        raw: Any = fixengine.load_pack(FIXES_DIR if root is None else Path(root), checks)
    except fixengine.FixError as exc:
        raise FixPackError(str(exc).removeprefix("pack error: ")) from None
    fixes: dict[str, Fix] = {}
    profiles: dict[str, Profile] = {}
    for name, raw_profile in raw.profiles.items():
        for raw_fix in raw_profile.fixes:
            meta = {k: v for k, v in raw_fix.meta.items() if k != "payload"}
            meta.update(profile=name, has_payload=raw_fix.has_payload)
            try:
                fixes[raw_fix.id] = Fix.model_validate(meta)
            except ValidationError as exc:
                raise FixPackError(f"{raw_fix.source}: {_where(exc)}") from None
        try:
            profiles[name] = Profile.model_validate({**raw_profile.meta, "fixes": [f.id for f in raw_profile.fixes]})
        except ValidationError as exc:
            raise FixPackError(f"{raw.root / name / 'profile.json'}: {_where(exc)}") from None
    return FixPack(root=raw.root, order=raw.order, fixes=fixes, profiles=profiles)
