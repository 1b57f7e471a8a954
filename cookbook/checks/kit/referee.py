"""The model's reference for a probe's own prompts, asked only when two runs part (or drift), and once per prompt.

`Referee` finds the numerics oracle's reference the way every probe needs it: the recipe's golden file where it
knows the prompt, else a forward pass computed here (cookbook.reference.reference_for_any_prompt), else none, with
why. It memoises what it scored, so a probe that judges several runs of one prompt pays one forward pass.
"""
from __future__ import annotations

from typing import Any

from ...errors import CookbookError
from ...reference import RefPosition, RefScore, Reference
from ..params import Param
from ..registry import CheckContext

# Top-k asked of the reference: wider than the served top-5, so a token the run chose is rarely outside it.
REFERENCE_TOP_K = 20
MEMO_LIMIT = 256

# What picks the reference (cookbook.reference.reference_for); every check that judges by one reads these.
REFERENCE = Param("reference", "text", "the recipe's golden file, else a forward pass computed here, else none",
                  "the reference to judge by: golden, computed, none or the URL of another server")
REFERENCE_MODEL = Param("reference_model", "text", "the served model's name",
                        "with reference=URL: the model name that server serves")
REFERENCE_CHECKPOINT = Param("reference_checkpoint", "text", "a CPU recipe's prepared weights",
                             "a local checkpoint folder of the served model, for a reference computed here")
USE_REFERENCE = Param("use_reference", "bool", "true", "false: judge by the runs' own top-k, with no reference")
REFERENCE_PARAMS = (REFERENCE, REFERENCE_MODEL, REFERENCE_CHECKPOINT, USE_REFERENCE)


class Referee:
    """A check's reference, loaded on first use. `enabled=False` (or check parameter `use_reference: false` or
    `reference: none`) leaves the runs' own top-k to judge, with that said."""

    def __init__(self, ctx: CheckContext, enabled: bool = True) -> None:
        self.ctx = ctx
        off = ctx.params.get("use_reference") is False or ctx.params.get("reference") == "none"
        self.why_none = "turned off by a check parameter" if off or not enabled else ""
        self._reference: Reference | None = None
        self._looked = bool(self.why_none)
        self._memo: dict[tuple[int, ...], RefScore | None] = {}

    @property
    def reference(self) -> Reference | None:
        if not self._looked:
            self._looked = True
            from ...reference import reference_for_any_prompt

            try:
                self._reference, why = reference_for_any_prompt(self.ctx)
            except CookbookError as exc:
                self._reference, why = None, str(exc)
            if self._reference is None:
                self.why_none = why or "no reference"
        return self._reference

    @property
    def source(self) -> str | None:
        return self.reference.source if self.reference is not None else None

    def describe(self) -> str:
        """Who judges departures, for a check's details."""
        if self.reference is not None:
            return f"the reference: {self.reference.source}"
        return f"both runs' own top-k (no reference: {self.why_none})"

    def score(self, ids: list[int]) -> RefScore | None:
        """The reference's prompt logprobs of `ids` (with top-k) and its next token; None when it cannot score them."""
        key = tuple(ids)
        if key in self._memo:
            return self._memo[key]
        reference = self.reference
        scored: RefScore | None = None
        if reference is not None:
            try:
                if reference.can_score(list(ids)):
                    scored = reference.score(list(ids), 1, top_k=REFERENCE_TOP_K)
                else:
                    self.why_none = f"{reference.source} cannot score this prompt"
            except CookbookError as exc:
                self.why_none = f"the reference failed: {exc}"
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.pop(next(iter(self._memo)))
        self._memo[key] = scored
        return scored

    def path(self, prompt: list[int], tokens: list[int]) -> list[RefPosition | None] | None:
        """The reference at each of `tokens` given `prompt` and the tokens before it (teacher forced), and at the
        step after them (its top-k, its greedy token): len(tokens) + 1 entries; None without a reference."""
        scored = self.score(list(prompt) + list(tokens))
        if scored is None:
            return None
        steps = list(scored.prompt[len(prompt):]) if tokens else []
        steps += [scored.greedy[0] if scored.greedy else None]
        return steps

    def details(self) -> dict[str, Any]:
        return {"judge": self.describe(), "reference_source": self.source, "why_no_reference": self.why_none or None}
