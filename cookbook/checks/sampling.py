"""Logprobs, structured output and the sampling controls behind the seeds' fixes, each checked for effect.

Every control is checked so that a server ignoring it fails: `logit_bias` +100 must make every token the biased
one; `min_p` 1.0 at temperature 1.5 must leave only the most likely token at every step; `min_tokens` must keep a
short answer going; `bad_words` must keep the greedy answer's first word out; the same `seed` must give the same
text and another seed another text; a JSON schema must give a valid object where the prompt alone would not.

The seed requests are sent together, with their top logprobs: vLLM is not batch-invariant
(https://docs.vllm.ai/en/latest/usage/reproducibility/), and requests sent at once still share only most of their
batches, so a same-seed pair may part late without any bug (measured on a 2-vCPU AMX machine: after 22 tokens of
32). A pair that parts passes only when the tokens it shared first are ones two unseeded samples would share with
less than `SEED_UNSEEDED_CHANCE`: the seed demonstrably held; a server that ignores the seed parts early and fails.

The same probes then run all at once (sampling-concurrent), because the seeds' sampling bugs only show when
requests with different parameters share a batch. Reasoning models are asked not to think in the sampling-control
and logprob requests (`chat_template_kwargs: {enable_thinking: false}`, ignored by templates without it), so that
token counts and first words are the answer's; the JSON schema request lets them think, with the recipe's budget.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CookbookError
from ..results import Evidence
from .basic import Reply, answer_budget, chat, chat_all, excerpt, no_answer_note, user
from .params import CONCURRENCY
from .registry import CheckContext, CheckFailed, CheckInconclusive, CheckOutcome, check

TAKES_EFFECT = "takes effect"
OPEN_PROMPT = "Write one sentence about the sea."
MIN_TOKENS = 32
TOP_LOGPROBS = 20
PROMPT_LOGPROBS = 5
BIAS_CANDIDATES = (" banana", " purple", " yes")
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "country": {"type": "string", "minLength": 1, "maxLength": 40},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_millions", "is_capital"],
    "additionalProperties": False,
}


def _body(ctx: CheckContext, prompt: str, think: bool = False, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": user(prompt), **params}
    if not think and ctx.recipe is not None and ctx.recipe.reasoning_parser:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return body


@dataclass
class Probe:
    """One control under test: the requests that show it, and `verify` (None if it took effect, else the
    evidence naming the symptom). `together`: its requests go out at once, else one after the other."""

    control: str
    bodies: list[dict[str, Any]]
    verify: Callable[[list[Reply]], Evidence | None]  # may raise CheckInconclusive: the effect could not show
    details: dict[str, Any] = field(default_factory=dict)
    together: bool = False
    second_try: bool = False  # a statistical verdict: one failed try is sent again, and the retry decides


def judge_with_second_try(probe: Probe, replies: list[Reply], send_again: Callable[[], list[Reply]]) -> Evidence | None:
    """`probe.verify`, and for a statistical probe (the same-seed pair) one more try when the first fails, whose
    verdict stands. A batch-variant engine may part a seeded pair early once in a while (measured: 1 burst in 6 of
    SmolLM2's runs on a loaded machine, at token 6); a server that ignores the seed fails both tries, and passes
    only if one of them shares what unseeded samples share with chance under SEED_UNSEEDED_CHANCE: at most twice
    that."""
    problem = probe.verify(replies)
    if problem is None or not probe.second_try:
        return problem
    first = {k: v for k, v in probe.details.items() if k != "second_try"}
    retry = probe.verify(send_again())
    probe.details["second_try"] = {"first_try": first, "first_problem": problem.note, "passed": retry is None}
    if retry is None:
        held = probe.details.get("note")
        probe.details["note"] = f"a first try failed, {problem.note}; the second held" + (f": {held}" if held else "")
        return None
    retry.note = f"{retry.note} (twice: the first try too, {problem.note})"
    return retry


def _run_alone(ctx: CheckContext, probe: Probe, passed: str = TAKES_EFFECT) -> CheckOutcome:
    def send() -> list[Reply]:
        return chat_all(ctx, probe.bodies) if probe.together else [chat(ctx, body) for body in probe.bodies]

    replies = send()
    problem = judge_with_second_try(probe, replies, send)
    details = {**probe.details, "texts": [r.content for r in replies]}
    if problem is None:
        return CheckOutcome(True, passed, [], details)
    return CheckOutcome(False, problem.note, [problem], details)


# ---------------------------------------------------------------------------------------------------------------
# The probes


def bias_token(ctx: CheckContext) -> tuple[int, str]:
    """A word that is one token in this model's vocabulary (id, text)."""
    for text in BIAS_CANDIDATES:
        ids = ctx.endpoint.tokenize(text)
        if len(ids) == 1:
            return ids[0], text
    raise CookbookError(f"none of {BIAS_CANDIDATES} is a single token for {ctx.endpoint.model}")


def logit_bias_probe(ctx: CheckContext) -> Probe:
    token_id, text = bias_token(ctx)
    body = _body(
        ctx, "Name a color.", temperature=0, max_tokens=8, logit_bias={str(token_id): 100},
        logprobs=True, return_tokens_as_token_ids=True,
    )

    def verify(replies: list[Reply]) -> Evidence | None:
        tokens = [t.get("token") for t in replies[0].token_logprobs]
        hits = tokens.count(f"token_id:{token_id}")
        if tokens and hits == len(tokens):
            return None
        return replies[0].evidence(f"{hits} of {len(tokens)} tokens were the biased token {text!r} (id {token_id})")

    return Probe("`logit_bias`", [body], verify, {"token_id": token_id, "token": text})


def min_p_probe(ctx: CheckContext) -> Probe:
    body = _body(ctx, OPEN_PROMPT, temperature=1.5, min_p=1.0, seed=1, max_tokens=32, logprobs=True, top_logprobs=2)

    def verify(replies: list[Reply]) -> Evidence | None:
        tokens = replies[0].token_logprobs
        if not tokens:
            return replies[0].evidence("no logprobs in the response, so the sampled tokens cannot be judged")
        for i, token in enumerate(tokens):
            top = max([token, *(token.get("top_logprobs") or [])], key=lambda t: t["logprob"])
            if token["logprob"] < top["logprob"] - 1e-6:  # ties in bf16 logits are allowed
                return replies[0].evidence(
                    f"token {i} {token['token']!r} was not the most likely ({token['logprob']:.3f} vs "
                    f"{top['logprob']:.3f} for {top['token']!r}): min_p 1.0 at temperature 1.5 keeps only the top token"
                )
        return None

    return Probe("`min_p`", [body], verify)


def min_tokens_probe(ctx: CheckContext) -> Probe:
    prompt = "What is 2 + 2? Answer with just the number."
    plain = _body(ctx, prompt, temperature=0, max_tokens=MIN_TOKENS + 16)

    def verify(replies: list[Reply]) -> Evidence | None:
        baseline, held = replies
        if baseline.finish_reason != "stop" or baseline.completion_tokens >= MIN_TOKENS:
            why = (
                f"without min_tokens the answer already ran {baseline.completion_tokens} tokens "
                f"(finish_reason {baseline.finish_reason}), so min_tokens {MIN_TOKENS} cannot show"
            )
            raise CheckInconclusive(why, [baseline.evidence(f"inconclusive: {why}")])
        if held.completion_tokens < MIN_TOKENS:
            return held.evidence(
                f"stopped after {held.completion_tokens} tokens (finish_reason {held.finish_reason}), "
                f"before min_tokens {MIN_TOKENS}"
            )
        return None

    return Probe("`min_tokens`", [plain, {**plain, "min_tokens": MIN_TOKENS}], verify)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def bad_words_probe(ctx: CheckContext) -> Probe:
    """Asks for the greedy answer first (one request), then bans its first word."""
    body = _body(ctx, "What is the capital of France? Answer in one word.", temperature=0, max_tokens=24)
    greedy = chat(ctx, body)
    first = re.search(r"[^\W\d_]+", greedy.content)
    if first is None:
        raise CheckFailed("no word in the greedy answer to ban", [greedy.evidence(no_answer_note(greedy) or "no word")])
    word = first.group()

    def verify(replies: list[Reply]) -> Evidence | None:
        answer = replies[0].content
        if _has_word(answer, word):
            return replies[0].evidence(f"the banned word {word!r} still appears in the answer")
        if not answer.strip():
            return replies[0].evidence(no_answer_note(replies[0]) or "empty answer")
        return None

    return Probe("`bad_words`", [{**body, "bad_words": [word]}], verify, {"banned": word, "greedy": greedy.content})


# A same-seed pair may part late without any bug (vLLM is not batch-invariant): it passes when the tokens it shared
# first are ones two unseeded samples would share with less than this chance, i.e. the seed demonstrably held.
SEED_UNSEEDED_CHANCE = 1e-3
SEED_TOP_LOGPROBS = 20


def unseeded_agreement_chance(tokens: list[dict[str, Any]]) -> float:
    """An upper bound on the chance that two independent samples of the same distributions pick these tokens'
    positions alike: the product over positions of sum_v p(v)^2, from the top logprobs (the unseen tail's mass
    counted at the smallest listed probability)."""
    chance = 1.0
    for token in tokens:
        probs = [math.exp(t["logprob"]) for t in token.get("top_logprobs") or [] if t.get("logprob") is not None]
        if not probs:
            return 1.0  # no logprobs to judge with: assume the worst
        tail = max(0.0, 1.0 - sum(probs))
        chance *= min(1.0, sum(p * p for p in probs) + tail * min(probs))
    return chance


def _first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x.get("token") != y.get("token"):
            return i
    return min(len(a), len(b))


def seed_probe(ctx: CheckContext, other_seed: bool = True) -> Probe:
    base = _body(ctx, OPEN_PROMPT, temperature=1.0, max_tokens=32, logprobs=True, top_logprobs=SEED_TOP_LOGPROBS)
    bodies = [{**base, "seed": 1234}, {**base, "seed": 1234}] + ([{**base, "seed": 4321}] if other_seed else [])
    facts: dict[str, Any] = {}

    def verify(replies: list[Reply]) -> Evidence | None:
        first, again = replies[0], replies[1]
        if first.content != again.content:
            ours, theirs = first.token_logprobs, again.token_logprobs
            parted = _first_difference(ours, theirs)
            chance = unseeded_agreement_chance(ours[:parted])
            facts.update(parted_at_token=parted, unseeded_chance=float(f"{chance:.3g}"))
            if not ours or not theirs or chance >= SEED_UNSEEDED_CHANCE:
                return again.evidence(
                    f"the same seed gave different text from token {parted} on (unseeded samples share that much "
                    f"with chance {chance:.2g}); first: {excerpt(first.content, 200)!r}")
            facts["note"] = (f"the same-seed pair parted at token {parted} of {len(ours)}, after a run two unseeded "
                             f"samples share with chance {chance:.1g}: a late flip of a batch-variant engine, not the seed")
        if other_seed and replies[2].content == first.content:
            return replies[2].evidence("a different seed gave the same text")
        return None

    return Probe("`seed`", bodies, verify, facts, together=True, second_try=True)


def json_schema_probe(ctx: CheckContext) -> Probe:
    """The prompt names no keys: only a server that applies the schema gets these exact ones. Reasoning models
    think first here (structured output must start after the reasoning), within the recipe's budget."""
    budget = answer_budget(ctx, 128)
    body = _body(
        ctx, "Describe Paris in JSON.", think=True, temperature=0, max_tokens=budget,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}},
    )

    def verify(replies: list[Reply]) -> Evidence | None:
        reply = replies[0]
        truncated = reply.finish_reason == "length"
        try:
            value = json.loads(reply.content)
        except ValueError:
            why = f"cut off at max_tokens {budget}" if truncated else f"finish_reason {reply.finish_reason}"
            return reply.evidence(f"not JSON ({why})")
        # Imported here, not with the module: jsonschema loads its format checkers (about 1 s of CPU, measured on a
        # 2-vCPU Xeon), which every process importing the checks (each `cookbook` command, pytest, a kernel) paid.
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(CITY_SCHEMA).iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
            return reply.evidence(f"schema violation at {where}: {error.message}")
        if reply.finish_reason != "stop":
            return reply.evidence(f"finish_reason {reply.finish_reason} after a valid object")
        return None

    return Probe("JSON schema", [body], verify)


# ---------------------------------------------------------------------------------------------------------------
# Logprobs


@check("top-logprobs", f"`top_logprobs: {TOP_LOGPROBS}`")
def top_logprobs(ctx: CheckContext) -> CheckOutcome:
    """Every generated token carries exactly 20 distinct alternatives with sane logprobs (the seeds' Gaudi fixes
    guard against bad ids and short lists here)."""
    reply = chat(ctx, _body(ctx, OPEN_PROMPT, temperature=0, max_tokens=16, logprobs=True,
                            top_logprobs=TOP_LOGPROBS, return_tokens_as_token_ids=True))
    tokens = reply.token_logprobs
    problem = None if tokens else "no logprobs in the response"
    for i, token in enumerate(tokens):
        entries = token.get("top_logprobs") or []
        ids = {e.get("token") for e in entries}
        values = [e.get("logprob") for e in entries]
        if len(entries) != TOP_LOGPROBS:
            problem = f"{len(entries)} entries on token {i} of {len(tokens)}"
        elif len(ids) != len(entries):
            problem = f"repeated tokens among the entries of token {i}"
        elif not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 0 for v in values):
            problem = f"a logprob that is not a finite number <= 0 on token {i}: {values}"
        if problem:
            break
    ok = problem is None
    return CheckOutcome(
        ok,
        f"{TOP_LOGPROBS} entries on every token" if ok else str(problem),
        [] if ok else [reply.evidence(str(problem), tokens[: min(len(tokens), 3)] if tokens else reply.body)],
        {"tokens": len(tokens)},
    )


def prompt_logprobs_problem(reply: Reply) -> str | None:
    """Why a reply's prompt_logprobs do not have the shape vLLM promises, else None: one entry per prompt token,
    the first null, then the actual token plus the top k, ranks 1..k among them."""
    entries = reply.body.get("prompt_logprobs") or reply.choice.get("prompt_logprobs")
    prompt_tokens = (reply.body.get("usage") or {}).get("prompt_tokens")
    if not entries:
        return "no prompt_logprobs in the response"
    if len(entries) != prompt_tokens:
        return f"{len(entries)} prompt_logprobs entries for {prompt_tokens} prompt tokens"
    if entries[0] is not None:
        return "the first prompt_logprobs entry is not null"
    for i, entry in enumerate(entries[1:], start=1):
        if not isinstance(entry, dict) or not PROMPT_LOGPROBS <= len(entry) <= PROMPT_LOGPROBS + 1:
            return f"prompt token {i}: {len(entry) if isinstance(entry, dict) else 'no'} entries, expected {PROMPT_LOGPROBS} or {PROMPT_LOGPROBS + 1}"
        ranks = {v.get("rank") for v in entry.values()}
        if not set(range(1, PROMPT_LOGPROBS + 1)) <= ranks:
            return f"prompt token {i}: ranks {sorted(r for r in ranks if r is not None)} do not include 1..{PROMPT_LOGPROBS}"
    return None


@check("prompt-logprobs", f"`prompt_logprobs: {PROMPT_LOGPROBS}`")
def prompt_logprobs(ctx: CheckContext) -> CheckOutcome:
    """The shape of the answer, then the server: on the seeds' hardware the first such request can kill the engine."""
    body = _body(ctx, "The capital of France is Paris.", temperature=0, max_tokens=4, prompt_logprobs=PROMPT_LOGPROBS)
    try:
        reply = chat(ctx, body)
        problem = prompt_logprobs_problem(reply)
        evidence = [reply.evidence(problem, reply.body)] if problem else []
    except CheckFailed as failed:
        problem, evidence = failed.result, failed.evidence
    healthy = ctx.endpoint.healthy()
    if healthy:
        try:
            chat(ctx, _body(ctx, "Say OK.", temperature=0, max_tokens=4))
        except CheckFailed as failed:
            healthy = False
            evidence += failed.evidence
    if not healthy:
        evidence.append(Evidence(note="after the prompt_logprobs request the server is unhealthy"))
    after = "server healthy afterwards" if healthy else "server unhealthy afterwards"
    ok = problem is None and healthy
    return CheckOutcome(ok, f"returned; {after}" if problem is None else f"{problem}; {after}", evidence)


# ---------------------------------------------------------------------------------------------------------------
# Structured output and sampling controls, one at a time


@check("json-schema", "`response_format` JSON schema")
def json_schema(ctx: CheckContext) -> CheckOutcome:
    return _run_alone(ctx, json_schema_probe(ctx), "valid object")


@check("logit-bias", "`logit_bias` +100 on one token")
def logit_bias(ctx: CheckContext) -> CheckOutcome:
    return _run_alone(ctx, logit_bias_probe(ctx))


@check("min-p", "`min_p: 1.0` at temperature 1.5")
def min_p(ctx: CheckContext) -> CheckOutcome:
    return _run_alone(ctx, min_p_probe(ctx))


@check("min-tokens", f"`min_tokens: {MIN_TOKENS}` on a short answer")
def min_tokens(ctx: CheckContext) -> CheckOutcome:
    return _run_alone(ctx, min_tokens_probe(ctx))


@check("bad-words", "`bad_words` with the greedy answer's first word")
def bad_words(ctx: CheckContext) -> CheckOutcome:
    return _run_alone(ctx, bad_words_probe(ctx))


@check("seed", "`seed`, sampled at 1.0")
def seed(ctx: CheckContext) -> CheckOutcome:
    probe = seed_probe(ctx)
    outcome = _run_alone(ctx, probe, "same seed same text, different seed different text")
    if outcome.passed and "note" in probe.details:
        outcome = CheckOutcome(True, f"same seed held (then {probe.details['note']}), different seed different text",
                               outcome.evidence, outcome.details)
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# All at once

_PROBES: tuple[tuple[Callable[[CheckContext], Probe], str], ...] = (
    (logit_bias_probe, "logit-bias"),
    (min_p_probe, "min-p"),
    (min_tokens_probe, "min-tokens"),
    (bad_words_probe, "bad-words"),
    (lambda ctx: seed_probe(ctx, other_seed=False), "seed"),
    (json_schema_probe, "json-schema"),
)
_CONCURRENT_LABEL = "`logit_bias`, `min_p`, `min_tokens`, `bad_words`, `seed` and JSON schema, {concurrency} in flight"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _concurrent_probes(ctx: CheckContext) -> list[Callable[[CheckContext], Probe]]:
    """Probes whose single check the recipe skips or knows to fail on its model are left out: they could not show
    anything here."""
    verification = ctx.recipe.verification if ctx.recipe else None
    left_out = {*verification.skip, *verification.known_limitations} if verification else set()
    return [make for make, name in _PROBES if name not in left_out]


def _no_probes(ctx: CheckContext) -> str | None:
    return None if _concurrent_probes(ctx) else "every sampling control is skipped or a known limitation here"


@check("sampling-concurrent", _CONCURRENT_LABEL, applies=_no_probes, params=(CONCURRENCY,))
def sampling_concurrent(ctx: CheckContext) -> CheckOutcome:
    """Every probe's requests in one burst (repeated to about the recipe's concurrency), each checked for its own
    effect."""
    probes = [make(ctx) for make in _concurrent_probes(ctx)]
    per_round = sum(len(p.bodies) for p in probes)
    probes = probes * max(1, round(ctx.concurrency / per_round))
    every_body = [body for p in probes for body in p.bodies]
    replies = chat_all(ctx, every_body)
    burst_again: list[list[Reply]] = []

    def again(start: int, count: int) -> list[Reply]:
        """The whole burst once more (a second try is judged with others in flight too), sent at most once."""
        if not burst_again:
            burst_again.append(chat_all(ctx, every_body))
        return burst_again[0][start : start + count]

    evidence: list[Evidence] = []
    wrong: list[str] = []
    unsure: list[str] = []
    start = 0
    for probe in probes:
        try:
            problem = judge_with_second_try(probe, replies[start : start + len(probe.bodies)],
                                            functools.partial(again, start, len(probe.bodies)))
        except CheckInconclusive as exc:  # this control could not show in the burst: said, never a pass or a fail
            unsure.append(probe.control)
            evidence.append(Evidence(note=f"{probe.control} with others in flight: inconclusive: {exc.why}"))
            problem = None
        start += len(probe.bodies)
        if problem is not None:
            problem.note = f"{probe.control} with others in flight: {problem.note}"
            evidence.append(problem)
            wrong.append(probe.control)
    in_flight = len(replies)
    unique = list(dict.fromkeys(wrong))
    controls = list(dict.fromkeys(p.control for p in probes))
    if wrong:
        text = f"{len(wrong)} of {len(probes)} wrong with others in flight: {', '.join(unique)}"
    elif unsure:
        text = f"each takes effect except {_and(list(dict.fromkeys(unsure)))}, which could not show (inconclusive)"
    else:
        text = "each takes effect"
    return CheckOutcome(
        not wrong,
        text,
        evidence,
        {"in_flight": in_flight, "probes": [p.control for p in probes]},
        label=f"{_and(controls)}, {in_flight} in flight",
    )
