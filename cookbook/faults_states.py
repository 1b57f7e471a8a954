"""Faults of the engine-states class for the fault proxy: each one must make an engine-states probe fail.

They imitate what the v0.26.0 fixes of this class repair, on the traffic only:
- `corrupt-in-flight`: a request's generated tokens change from the middle on, only while other requests are in
  flight (a row read before another request wrote it, a batch-shape kernel bug); alone it answers correctly.
- `repeat-tail`: under load, the generated tail repeats an earlier stretch, as a request resumed after preemption
  does when it samples again at every recomputed position (`resumed-prefill-logits`).
- `shift-prompt-logprobs`: prompt logprobs past a position (a chunk boundary) come from the next position, as when
  a chunked prefill's logits rows are gathered with an off-by-one (`prompt-logprobs`).

Pass an instance to `FaultProxy(url, fault)`; to name them, build a table of your own with
`fault_table(STATE_FAULTS_BY_NAME)`. They are not in `cookbook.faultproxy.FAULTS`, because the fault matrix of
tests/test_checks.py runs every fault there against the session's server, where the preemption probe is (rightly)
inconclusive.
"""
from __future__ import annotations

from typing import Any

from collections.abc import Mapping
from types import MappingProxyType

from .completions import maybe_token_id
from .faultproxy import Exchange, Fault, choices


def _token_number(token: Any) -> int | None:
    return maybe_token_id(str(token))


def _rewrite_tokens(choice: dict[str, Any], start: int, new_ids: list[int]) -> None:
    """Replace the generated tokens from `start` on (completions logprobs with token ids), text and logprobs too."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    for offset, token_id in enumerate(new_ids):
        index = start + offset
        if index >= len(tokens):
            break
        tokens[index] = f"token_id:{token_id}"
        lps = logprobs.get("token_logprobs") or []
        if index < len(lps) and lps[index] is not None:
            lps[index] = float(lps[index]) - 0.01
    if choice.get("text"):
        choice["text"] = choice["text"][: len(choice["text"]) // 2] + " [changed]"


def _busy_completions(ex: Exchange, body: Any, min_tokens: int) -> list[tuple[dict[str, Any], list[int]]]:
    """The choices of a /v1/completions response answered while another request was in flight, with their token
    ids (return_tokens_as_token_ids), when they have at least `min_tokens`."""
    if ex.status != 200 or ex.in_flight() < 2 or not ex.path.startswith("/v1/completions"):
        return []
    found = []
    for choice in choices(body):
        ids = [_token_number(t) for t in (choice.get("logprobs") or {}).get("tokens") or []]
        if len(ids) >= min_tokens and all(i is not None for i in ids):
            found.append((choice, [i for i in ids if i is not None]))
    return found


class CorruptInFlight(Fault):
    """Generated tokens change from the middle on, only when another request is in flight through the proxy."""

    name = "corrupt-in-flight"
    catches = ("same-step-prefix", "batch-composition", "preemption")
    symptom = r"solo run"

    def response(self, ex: Exchange, body: Any) -> Any:
        for choice, ids in _busy_completions(ex, body, 2):
            start = len(ids) // 2
            _rewrite_tokens(choice, start, [i + 1 for i in ids[start:]])
        return body


class RepeatTail(Fault):
    """Under load (another request in flight) the second half of the answer repeats the stretch before it."""

    name = "repeat-tail"
    catches = ("preemption",)
    symptom = r"solo run"

    def response(self, ex: Exchange, body: Any) -> Any:
        for choice, ids in _busy_completions(ex, body, 4):
            start = len(ids) // 2
            repeated = [ids[start - 3 + (k % 3)] for k in range(len(ids) - start)]  # the last three tokens, again
            if repeated != ids[start:]:
                _rewrite_tokens(choice, start, repeated)
        return body


class ShiftPromptLogprobs(Fault):
    """Prompt logprobs from position `boundary` on are those of the next position (the last one repeated)."""

    name = "shift-prompt-logprobs"
    catches = ("chunked-prompt-logprobs",)
    symptom = r"own (prompt )?token|sampler|prompt_logprobs"

    def __init__(self, boundary: int | None = None) -> None:
        self.boundary = boundary  # None: the middle of each prompt

    def response(self, ex: Exchange, body: Any) -> Any:
        if ex.status != 200:
            return body
        holders = [c for c in choices(body) if c.get("prompt_logprobs")]
        if isinstance(body, dict) and body.get("prompt_logprobs"):
            holders.append(body)
        for holder in holders:
            entries = holder["prompt_logprobs"]
            start = self.boundary if self.boundary is not None else len(entries) // 2
            if 0 < start < len(entries) - 1:
                holder["prompt_logprobs"] = entries[:start] + entries[start + 1 :] + entries[-1:]
        return body


STATE_FAULTS: tuple[Fault, ...] = (CorruptInFlight(), RepeatTail(), ShiftPromptLogprobs())
STATE_FAULTS_BY_NAME: Mapping[str, Fault] = MappingProxyType({f.name: f for f in STATE_FAULTS})
