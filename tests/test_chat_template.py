"""The CPU recipe's tool-aware chat template: identical to SmolLM2's own without tools, Hermes-style with them."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

TEMPLATE = Path(__file__).resolve().parents[1] / "recipes/HuggingFaceTB/SmolLM2-135M-Instruct/tool_chat_template.jinja"
# SmolLM2-135M-Instruct's own template, as the GGUF file carries it.
ORIGINAL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def render(source: str, **context) -> str:
    # The environment transformers (and so vLLM) renders chat templates with.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return env.from_string(source).render(**context)


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_identical_to_the_original_without_tools(messages, add_generation_prompt) -> None:
    ours = render(TEMPLATE.read_text(), messages=messages, add_generation_prompt=add_generation_prompt, tools=None)
    original = render(ORIGINAL, messages=messages, add_generation_prompt=add_generation_prompt)
    assert ours == original


def test_tools_are_rendered_hermes_style() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'},
    ]
    out = render(TEMPLATE.read_text(), messages=messages, add_generation_prompt=True, tools=[WEATHER])
    assert out.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in out
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>' in out
    assert out.endswith("<|im_start|>assistant\n")
