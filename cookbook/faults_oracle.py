"""Faults of the numerics oracle's class for the fault proxy: served logprobs that are wrong the same way every time.

They imitate what a wrong RoPE base, a wrong window or a mis-scaled layer does to a real server: logprobs moved on
some prompt positions (from a position on, as state past a window would), and a greedy step that picks a token the
model ranks clearly lower. Text stays fluent, the server stays healthy, and every self-comparison still passes.
To name them, build a table of your own with `fault_table(ORACLE_FAULTS)`. They are not in
`cookbook.faultproxy.FAULTS`, because the fault matrix of tests/test_checks.py runs every fault there against the
whole selection (the oracle's tests run them).
"""
from __future__ import annotations

from typing import Any

from collections.abc import Mapping
from types import MappingProxyType

from .faultproxy import Exchange, Fault, choices


def _is_completion(ex: Exchange) -> bool:
    return ex.path.split("?")[0].endswith("/v1/completions") and ex.status == 200


class ShiftedPromptLogprobs(Fault):
    """From prompt position `start` on, every `every`-th position's prompt_logprobs moved by `delta` (the chosen
    token and its top-k alike), as a layer that goes wrong past some position would."""

    name = "oracle-shifted-logprobs"
    catches = ("oracle",)
    symptom = r"depart from the reference.*positions off by more than"

    def __init__(self, delta: float = 1.5, start: int = 64, every: int = 3) -> None:
        self.delta = delta
        self.start = start
        self.every = every

    def response(self, ex: Exchange, body: Any) -> Any:
        if not _is_completion(ex):
            return body
        for choice in choices(body):
            for i, entry in enumerate(choice.get("prompt_logprobs") or []):
                if entry is None or i < self.start or (i - self.start) % self.every:
                    continue
                for item in entry.values():
                    item["logprob"] = float(item["logprob"]) - self.delta
        return body


class SwappedGreedyToken(Fault):
    """At greedy step `step` the served token is swapped for the lowest of its own top-k (token and logprob), the
    way a kernel that mis-scales one layer picks a clearly worse token; the rest of the answer is left alone."""

    name = "oracle-swapped-token"
    catches = ("oracle",)
    symptom = r"greedy continuation departs from the reference.*ranked .* below|outside the reference's top"

    def __init__(self, step: int = 2) -> None:
        self.step = step

    def response(self, ex: Exchange, body: Any) -> Any:
        if not _is_completion(ex):
            return body
        for choice in choices(body):
            lp = choice.get("logprobs") or {}
            tokens, logprobs, tops = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
            if len(tokens) <= self.step or len(tops) <= self.step or not tops[self.step]:
                continue
            worst_token, worst_lp = min(tops[self.step].items(), key=lambda kv: kv[1])
            if worst_token == tokens[self.step]:
                continue
            tokens[self.step] = worst_token
            logprobs[self.step] = worst_lp
        return body


ORACLE_FAULTS: Mapping[str, Fault] = MappingProxyType({f.name: f for f in (ShiftedPromptLogprobs(), SwappedGreedyToken())})
