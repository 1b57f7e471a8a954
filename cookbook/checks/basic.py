"""Known-answer checks, and the request helpers every check module of the suite shares.

The helpers send chat requests through the `openai` client with the run's timeout and no retries, and turn what
can go wrong into the runner's terms: an HTTP error ends the check as a fail with the request and the error as
evidence (`CheckFailed`), a lost connection to a server that no longer answers /health is `ServerDown` (the rest
of the run is "not run: server down").
"""
from __future__ import annotations

import inspect
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from ..endpoint import Endpoint
from ..errors import ServerDown
from ..results import Evidence
from .matching import answer_matches
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


def _client(endpoint: Endpoint, timeout_s: float) -> Any:
    return endpoint.shared_openai(timeout_s)


def _create_kwargs(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI parameters as keywords, vLLM's extras (min_p, bad_words, prompt_logprobs...) in extra_body."""
    known = inspect.signature(client.chat.completions.create).parameters
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def chat(ctx: CheckContext, body: dict[str, Any], stream: bool = False) -> Reply:
    """Send one chat completion (`model` added). Streamed, the reply keeps every chunk and the final chunk's
    usage; its body holds no assembled message (assembly is what a streaming check checks)."""
    body = {"model": ctx.endpoint.model, **body}
    client = _client(ctx.endpoint, ctx.request_timeout_s)
    started = time.monotonic()
    try:
        if not stream:
            response = client.chat.completions.create(**_create_kwargs(client, body))
            return Reply(body, response.model_dump(), time.monotonic() - started)
        chunks = [c.model_dump() for c in client.chat.completions.create(**_create_kwargs(client, {**body, "stream": True}))]
        usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
        return Reply({**body, "stream": True}, {"usage": usage}, time.monotonic() - started, chunks)
    except openai.APIStatusError as exc:
        note = f"HTTP {exc.status_code}: {excerpt(exc.response.text, 300)}"
        location = exc.response.headers.get("location")
        if 300 <= exc.status_code < 400:  # redirects are never followed: another origin's answers are never scored
            note = f"HTTP {exc.status_code}: a redirect to {location!r}, not followed"
        raise CheckFailed(f"HTTP {exc.status_code}", [Evidence(request=body, response=excerpt(exc.response.text), note=note)]) from None
    except (openai.APIConnectionError, httpx.TransportError) as exc:  # timeouts, and a stream cut off midway
        timed_out = isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException))
        budget = ctx.endpoint.budget
        if timed_out and budget is not None and budget.expired:
            what = f"no answer before {budget.describe()} ran out"
        elif timed_out:
            what = f"no answer within {ctx.request_timeout_s:g} s"
        else:
            what = "connection lost"
        if not ctx.endpoint.healthy():
            raise ServerDown(f"{ctx.endpoint.base_url}: {type(exc).__name__}: server not reachable") from None
        raise CheckFailed(what, [Evidence(request=body, note=f"{what} ({type(exc).__name__})")], timed_out=timed_out) from None


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
    right = sum(a["ok"] for a in answers)
    return CheckOutcome(right == len(items), f"{right}/{len(items)}", evidence, {"answers": answers})


@check("known-answer", "Known-answer prompts (arithmetic, facts, translation), temperature 0")
def known_answer(ctx: CheckContext) -> CheckOutcome:
    """One prompt at a time, greedy."""
    items = list(KNOWN_ANSWERS)
    return _grade(items, [chat(ctx, _known_answer_body(ctx, item)) for item in items])


@check("known-answer-concurrent", "The same prompts, {concurrency} in flight")
def known_answer_concurrent(ctx: CheckContext) -> CheckOutcome:
    """The same prompts, as many in flight as the recipe serves at once; each answer graded against its own prompt,
    so responses crossed between requests fail."""
    items = list(itertools.islice(itertools.cycle(KNOWN_ANSWERS), ctx.concurrency))
    return _grade(items, chat_all(ctx, [_known_answer_body(ctx, item) for item in items]))
