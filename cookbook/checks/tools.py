"""Tool-call checks: a `get_weather` call under `tool_choice: auto`, the same call streamed, and a tool result used.

The function is declared with `"strict": true`, so servers that constrain "required" and named tool choices to the
schema (vLLM does, with strict functions) produce schema-valid arguments; under "auto" the model decides alone.
"""
from __future__ import annotations

import json
from typing import Any

from ..results import Evidence
from .basic import Reply, answer_budget, chat, chat_all, excerpt, no_answer_note, user
from .matching import normalize, numbers_in
from .registry import CheckContext, CheckOutcome, check

TRIES = 5
TEMPERATURE = 0.6
CITY = "Paris"
QUESTION = f"What is the weather like in {CITY} right now?"
GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Berlin"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# Values no model would guess: an answer that holds both used the tool message.
WEATHER = {"city": CITY, "temperature_c": 23, "condition": "foggy"}


def call_problem(name: str | None, arguments: str | None) -> str | None:
    """Why (name, JSON arguments) is not a valid get_weather call for the city asked about, else None."""
    if name != "get_weather":
        return f"called {name!r} instead of 'get_weather'"
    try:
        args = json.loads(arguments or "")
    except ValueError:
        return f"arguments are not valid JSON: {excerpt(arguments or '', 200)!r}"
    if not isinstance(args, dict):
        return f"arguments are not a JSON object: {excerpt(arguments or '', 200)!r}"
    city = args.get("city")
    if not isinstance(city, str) or normalize(CITY) not in normalize(city).split():
        return f"wrong argument: city={city!r}, expected {CITY!r}"
    return None


def _first_call(reply: Reply) -> tuple[str | None, str | None] | None:
    calls = reply.message.get("tool_calls") or []
    if not calls:
        return None
    function = calls[0].get("function") or {}
    return function.get("name"), function.get("arguments")


def _auto_problem(reply: Reply) -> str | None:
    call = _first_call(reply)
    if call is None:
        return no_answer_note(reply) if not reply.content else f"no tool call: answered in text: {excerpt(reply.content, 200)!r}"
    return call_problem(*call)


def _call_body(ctx: CheckContext, tool_choice: str, temperature: float) -> dict[str, Any]:
    return {
        "messages": user(QUESTION),
        "tools": [GET_WEATHER],
        "tool_choice": tool_choice,
        "temperature": temperature,
        "max_tokens": answer_budget(ctx, 64),
    }


@check("tool-call-auto", "Tool call, `tool_choice: auto`, sampled at 0.6")
def tool_call_auto(ctx: CheckContext) -> CheckOutcome:
    """Five sampled tries, all in flight together; each must be a valid call with the right city."""
    replies = chat_all(ctx, [_call_body(ctx, "auto", TEMPERATURE)] * TRIES)
    problems = [_auto_problem(r) for r in replies]
    evidence = [r.evidence(p, r.message) for r, p in zip(replies, problems) if p]
    valid = problems.count(None)
    return CheckOutcome(
        valid == TRIES,
        f"{valid}/{TRIES} valid `get_weather` calls with the right argument",
        evidence,
        {"problems": problems},
    )


def assemble_streamed_call(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The first tool call of a stream: id from its first delta, name and argument fragments joined in order."""
    call: dict[str, Any] = {"id": None, "name": "", "arguments": "", "argument_chunks": 0, "deltas": 0}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                if delta.get("index", 0) != 0:
                    continue
                call["deltas"] += 1
                call["id"] = call["id"] or delta.get("id")
                function = delta.get("function") or {}
                call["name"] += function.get("name") or ""
                if function.get("arguments"):
                    call["arguments"] += function["arguments"]
                    call["argument_chunks"] += 1
    return call


@check("tool-call-streamed", "Streamed tool call")
def tool_call_streamed(ctx: CheckContext) -> CheckOutcome:
    """The same greedy call streamed and not: the streamed deltas must assemble into the same name and arguments."""
    body = _call_body(ctx, "required", 0)
    whole = chat(ctx, body)
    streamed = chat(ctx, body, stream=True)
    call = assemble_streamed_call(streamed.chunks or [])
    evidence: list[Evidence] = []
    expected = _first_call(whole)
    if expected is None or call_problem(*expected):
        note = f"the non-streamed call is not valid: {call_problem(*expected) if expected else 'no tool call'}"
        evidence.append(whole.evidence(note, whole.message))
    if call["deltas"] == 0:
        problem: str | None = "no tool call in the stream"
    elif not call["id"]:
        problem = "the first tool-call delta has no id"
    elif not call["arguments"]:
        problem = "no streamed arguments: no argument chunks arrived"
    else:
        problem = call_problem(call["name"] or None, call["arguments"])
        if problem:
            problem = f"streamed call assembled from {call['argument_chunks']} argument chunks: {problem}"
        elif expected is not None and (call["name"], json.loads(call["arguments"])) != (expected[0], _json(expected[1])):
            problem = f"streamed call differs from the non-streamed one: {call['arguments']!r} vs {expected[1]!r}"
    if problem:
        evidence.append(Evidence(request=streamed.request, response=excerpt(call), note=problem))
    return CheckOutcome(
        not evidence,
        "name and JSON arguments assembled correctly" if not evidence else problem or evidence[0].note,
        evidence,
        {"streamed": call, "non_streamed": expected},
    )


def _json(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        return None


@check("tool-result", "Tool result fed back")
def tool_result(ctx: CheckContext) -> CheckOutcome:
    """A get_weather call and its result in the conversation; the answer must state the returned temperature and
    condition in its own words. The tools are not offered again, so the answer is about the result, not a
    second call."""
    messages = [
        *user(QUESTION),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": CITY})}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(WEATHER)},
    ]
    reply = chat(ctx, {"messages": messages, "temperature": 0, "max_tokens": answer_budget(ctx, 64)})
    answer = reply.content
    uses_temperature = WEATHER["temperature_c"] in numbers_in(answer)
    uses_condition = any(word.startswith("fog") for word in normalize(answer).split())
    if no_answer_note(reply):
        problem: str | None = no_answer_note(reply)
    elif "<tool_response>" in answer or '"temperature_c"' in answer:
        problem = "the answer echoes the tool message instead of using it"
    elif not (uses_temperature and uses_condition):
        missing = [w for w, ok in (("23", uses_temperature), ("foggy", uses_condition)) if not ok]
        problem = f"the answer does not use the returned values: {' and '.join(missing)} missing"
    else:
        problem = None
    return CheckOutcome(
        problem is None,
        "the answer uses the returned values" if problem is None else problem,
        [reply.evidence(problem)] if problem else [],
        {"answer": answer, "tool_result": WEATHER},
    )
