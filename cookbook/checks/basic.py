"""Known-answer checks, and the request helpers every check module of the suite shares.

The helpers send chat requests through `Endpoint.chat` (the one way every check and probe sends one) with the
run's timeout and no retries, and turn its errors (mapped once, in cookbook.endpoint) into the runner's terms: an
HTTP error, no answer in time or a lost connection ends the check as a fail with the request and the error as
evidence (`CheckFailed`), a server that no longer answers /health is `ServerDown` (the rest of the run is
"not run: server down").
"""
from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import RequestFailed, RequestTimeout, ServerDown
from ..results import Evidence
from .matching import answer_matches
from .params import CONCURRENCY
from .registry import CheckContext, CheckFailed, CheckOutcome, check

EXCERPT_CHARS = 600

# ---------------------------------------------------------------------------------------------------------------
# Request helpers


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A response (or part of one) as at most `limit` characters of text, for evidence."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@dataclass
class Reply:
    """One answered chat request: the body sent and the JSON that came back (chunks too when streamed)."""

    request: dict[str, Any]
    body: dict[str, Any]
    seconds: float
    chunks: list[dict[str, Any]] | None = None

    @property
    def choice(self) -> dict[str, Any]:
        choices = self.body.get("choices") or [{}]
        return dict(choices[0] or {})

    @property
    def message(self) -> dict[str, Any]:
        return dict(self.choice.get("message") or {})

    @property
    def content(self) -> str:
        """The answer; for reasoning models the part after the reasoning."""
        return str(self.message.get("content") or "")

    @property
    def finish_reason(self) -> str | None:
        return self.choice.get("finish_reason")

    @property
    def completion_tokens(self) -> int:
        return int((self.body.get("usage") or {}).get("completion_tokens") or 0)

    @property
    def token_logprobs(self) -> list[dict[str, Any]]:
        return list((self.choice.get("logprobs") or {}).get("content") or [])

    def evidence(self, note: str, response: Any = None) -> Evidence:
        """The request and an excerpt of the response (the content unless said otherwise), with `note`."""
        shown = self.content or self.message or self.body if response is None else response
        if isinstance(shown, dict):  # the SDK's many empty fields say nothing
            shown = {k: v for k, v in shown.items() if v not in (None, [], {})}
        return Evidence(request=self.request, response=excerpt(shown), note=note)


def chat(ctx: CheckContext, body: dict[str, Any], stream: bool = False) -> Reply:
    """Send one chat completion (`model` added). Streamed, the reply keeps every chunk and the final chunk's
    usage; its body holds no assembled message (assembly is what a streaming check checks)."""
    body = {"model": ctx.endpoint.model, **body}
    try:
        answer = ctx.endpoint.chat(body, ctx.request_timeout_s, stream=stream)
    except RequestFailed as exc:
        response = excerpt(exc.body) if exc.status_code is not None else None
        what = str(exc).split(":", 1)[0] if exc.status_code is not None else str(exc)
        raise CheckFailed(what, [Evidence(request=body, response=response, note=str(exc) if exc.status_code is None
                                          else _status_note(exc))]) from None
    except RequestTimeout as exc:
        raise CheckFailed(str(exc), [Evidence(request=body, note=str(exc))], timed_out=True) from None
    sent = {**body, "stream": True} if stream else body
    return Reply(sent, answer.body, answer.seconds, answer.chunks)


def _status_note(exc: RequestFailed) -> str:
    """The evidence's note for an HTTP error: the status and an excerpt of the body (a redirect: where to)."""
    text = str(exc)
    return text if "redirect" in text else f"HTTP {exc.status_code}: {excerpt(exc.body, 300)}"


def chat_all(ctx: CheckContext, bodies: list[dict[str, Any]]) -> list[Reply]:
    """Send every body at once (one thread each, so all are in flight together); replies in the bodies' order.
    If one fails, the first failure is raised after all have finished (server down first)."""
    with ThreadPoolExecutor(max_workers=max(1, len(bodies))) as pool:
        futures = [pool.submit(chat, ctx, body) for body in bodies]
        outcomes: list[Reply | BaseException] = []
        for future in futures:
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise next((e for e in errors if isinstance(e, ServerDown)), errors[0])
    return [o for o in outcomes if isinstance(o, Reply)]


def answer_budget(ctx: CheckContext, floor: int) -> int:
    """max_tokens for a free-text answer: at least `floor`, and the recipe's budget (large for reasoning models)."""
    return max(floor, ctx.max_tokens)


def no_answer_note(reply: Reply) -> str | None:
    """Why a reply holds no answer at all (a reasoning model that used the whole budget), else None."""
    if reply.content.strip():
        return None
    if reply.finish_reason == "length":
        return f"no answer within max_tokens {reply.request.get('max_tokens')} (finish_reason length); give the recipe a real token budget"
    return f"empty answer (finish_reason {reply.finish_reason})"


# ---------------------------------------------------------------------------------------------------------------
# Known-answer prompts


@dataclass(frozen=True)
class KnownAnswer:
    kind: str  # arithmetic, fact or translation
    prompt: str
    answer: str  # a number ("24") or words ("Paris"); see matching.answer_matches


# Eight prompts a 135M instruct model gets right at temperature 0 on the CPU server, and any real model does.
KNOWN_ANSWERS: tuple[KnownAnswer, ...] = (
    KnownAnswer("arithmetic", "What is 2 + 2? Answer with just the number.", "4"),
    KnownAnswer("arithmetic", "What is 12 + 12? Answer with just the number.", "24"),
    KnownAnswer("arithmetic", "What is 7 + 8? Answer with just the number.", "15"),
    KnownAnswer("fact", "What is the capital of France? Answer in one word.", "Paris"),
    KnownAnswer("fact", "What is the capital of Japan? Answer in one word.", "Tokyo"),
    KnownAnswer("fact", "How many days are in a week? Answer with just the number.", "7"),
    KnownAnswer("translation", "What is the Spanish word for 'hello'?", "hola"),
    KnownAnswer("translation", "What is the French word for 'thank you'?", "merci"),
)


def _known_answer_body(ctx: CheckContext, item: KnownAnswer) -> dict[str, Any]:
    return {"messages": user(item.prompt), "temperature": 0, "max_tokens": answer_budget(ctx, 32)}


def _grade(items: list[KnownAnswer], replies: list[Reply]) -> CheckOutcome:
    """'right/total'; each wrong answer is evidence, naming the prompt it answers instead if there is one."""
    evidence: list[Evidence] = []
    answers = []
    for item, reply in zip(items, replies):
        ok = answer_matches(reply.content, item.answer, item.prompt)
        answers.append({"prompt": item.prompt, "expected": item.answer, "answer": reply.content, "ok": ok})
        if ok:
            continue
        note = no_answer_note(reply) or f"wrong answer: expected {item.answer!r} for {item.prompt!r}"
        other = next((o for o in items if o.answer != item.answer and answer_matches(reply.content, o.answer, o.prompt)), None)
        if other is not None:
            note += f"; the answer fits another prompt in flight ({other.prompt!r})"
        evidence.append(reply.evidence(note))
    right = sum(bool(a["ok"]) for a in answers)
    return CheckOutcome(right == len(items), f"{right}/{len(items)}", evidence, {"answers": answers})


@check("known-answer", "Known-answer prompts (arithmetic, facts, translation), temperature 0")
def known_answer(ctx: CheckContext) -> CheckOutcome:
    """One prompt at a time, greedy."""
    items = list(KNOWN_ANSWERS)
    return _grade(items, [chat(ctx, _known_answer_body(ctx, item)) for item in items])


@check("known-answer-concurrent", "The same prompts, {concurrency} in flight", params=(CONCURRENCY,))
def known_answer_concurrent(ctx: CheckContext) -> CheckOutcome:
    """The same prompts, as many in flight as the recipe serves at once; each answer graded against its own prompt,
    so responses crossed between requests fail."""
    items = list(itertools.islice(itertools.cycle(KNOWN_ANSWERS), ctx.concurrency))
    return _grade(items, chat_all(ctx, [_known_answer_body(ctx, item) for item in items]))
