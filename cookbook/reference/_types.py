"""What every reference returns and how it is named: a scored position, a scored prompt, the `Reference` protocol,
the raw form the forward script and the golden file share, and the error a reference raises."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from ..errors import CookbookError


class ReferenceError(CookbookError):
    """The reference could not be produced or read (a golden file that does not parse, a forward pass that died)."""

    exit_code = 1


@dataclass(frozen=True)
class RefPosition:
    """The reference's log-softmax (fp32) of the token at one position, and the top-k of that position."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)

    @property
    def argmax(self) -> int:
        """The reference's most likely token here (the first of `top`, else the scored token)."""
        return max(self.top, key=lambda t: self.top[t]) if self.top else self.token_id

    def logprob_of(self, token: int) -> float | None:
        """The reference's logprob of `token`, when it is the scored token or in the top-k; else None."""
        if token == self.token_id:
            return self.logprob
        return self.top.get(token)

    def floor(self) -> float:
        """The lowest logprob in the top-k: a token outside it is at most this likely."""
        values = list(self.top.values()) or [self.logprob]
        return min(values)


@dataclass(frozen=True)
class RefScore:
    """A prompt scored by the reference: one position per prompt token (the first is None, as in vLLM's
    prompt_logprobs; a golden file also leaves out positions it did not record), and the greedy continuation."""

    source: str
    prompt: list[RefPosition | None]
    greedy: list[RefPosition]

    @property
    def greedy_ids(self) -> list[int]:
        return [p.token_id for p in self.greedy]


@runtime_checkable
class Reference(Protocol):
    """Anything that can score a prompt: computed here, a golden file or another server."""

    @property
    def source(self) -> str: ...

    def can_score(self, prompt_ids: list[int]) -> bool:
        """Whether `score` can answer for these token ids (a golden file only knows its own prompts)."""
        ...

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        """Log-softmax of every prompt token given its prefix, and the greedy continuation with top-k."""
        ...


def _position(raw: Any) -> RefPosition | None:
    """[token, logprob, [[id, logprob], ...]] (the forward script's and the golden file's form) as a RefPosition."""
    if raw is None:
        return None
    token, logprob, top = raw
    return RefPosition(int(token), float(logprob), {int(i): float(v) for i, v in top})


def _raw(position: RefPosition | None, digits: int = 5) -> Any:
    if position is None:
        return None
    return [
        position.token_id, round(position.logprob, digits), [[t, round(v, digits)] for t, v in position.top.items()]
    ]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
