"""A golden file in the recipe's folder: prompts, token ids and top-k logprobs recorded once, scored as recorded."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._types import ReferenceError, RefPosition, RefScore, _position

if TYPE_CHECKING:
    from ..recipes import Recipe

GOLDEN_FORMAT = 1
GOLDEN_DIR = "reference"
GOLDEN_FILE = "golden.json"


@dataclass
class GoldenPrompt:
    """One recorded prompt: its kind (short, blocks, window, long), why it is in the set, and what was recorded."""

    kind: str
    why: str
    prompt_ids: list[int]
    text: str | None
    positions: list[int]  # prompt positions recorded (1..len-1); the rest are None in the score
    prompt: dict[int, RefPosition]
    greedy: list[RefPosition]


class GoldenReference:
    """A recorded golden file: scores only the prompts it holds, as recorded."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data = data
        self.produced: dict[str, Any] = dict(data.get("produced") or {})
        self.top_k = int(data.get("top_k", 5))
        self.prompts: list[GoldenPrompt] = []
        for i, item in enumerate(data.get("prompts") or []):
            try:
                ids = [int(t) for t in item["prompt_ids"]]
                positions = [int(p) for p in item["positions"]]
                raw_prompt = item["prompt"]
                if len(raw_prompt) != len(positions):
                    raise ValueError("prompt and positions differ in length")
                self.prompts.append(
                    GoldenPrompt(
                        kind=str(item.get("kind", "")),
                        why=str(item.get("why", "")),
                        prompt_ids=ids,
                        text=item.get("text"),
                        positions=positions,
                        prompt={
                            pos: p for pos, p in zip(positions, (_position(r) for r in raw_prompt)) if p is not None
                        },
                        greedy=[p for p in (_position(g) for g in item["greedy"]) if p is not None],
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ReferenceError(f"{self.path}: prompts.{i}: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> "GoldenReference":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ReferenceError(f"{path}: no such golden file") from None
        except ValueError as exc:
            raise ReferenceError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != GOLDEN_FORMAT:
            raise ReferenceError(f"{path}: format: expected {GOLDEN_FORMAT}")
        return cls(path, data)

    @property
    def source(self) -> str:
        p = self.produced
        return (
            f"golden file {self.path.name} in the recipe's folder, recorded {p.get('at', '?')} from "
            f"{p.get('source', '?')}"
        )

    def find(self, prompt_ids: list[int]) -> GoldenPrompt | None:
        return next((g for g in self.prompts if g.prompt_ids == list(prompt_ids)), None)

    def can_score(self, prompt_ids: list[int]) -> bool:
        return self.find(prompt_ids) is not None

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        found = self.find(prompt_ids)
        if found is None:
            raise ReferenceError(f"{self.path}: this prompt ({len(prompt_ids)} tokens) was not recorded")
        prompt: list[RefPosition | None] = [found.prompt.get(i) for i in range(len(found.prompt_ids))]
        prompt = [None if p is None else RefPosition(p.token_id, p.logprob, _top(p.top, top_k)) for p in prompt]
        greedy = [RefPosition(g.token_id, g.logprob, _top(g.top, top_k)) for g in found.greedy[:max_new_tokens]]
        return RefScore(self.source, prompt, greedy)


def _top(top: dict[int, float], k: int) -> dict[int, float]:
    return dict(sorted(top.items(), key=lambda kv: -kv[1])[:k])


def golden_path(recipe: "Recipe") -> Path:
    """Where the recipe's golden file is: its oracle's `golden`, else reference/golden.json in its folder."""
    configured = recipe.verification.oracle.golden if recipe.verification.oracle else None
    return recipe.folder / (configured or f"{GOLDEN_DIR}/{GOLDEN_FILE}")
