"""Every real chat template of llama.cpp's ``models/templates/`` (copied from model
repositories; the pinned sdist's) renders here as transformers renders it: the same
text, or both refuse. Conversations: plain, system, multi-turn, multi-part content,
tool definitions, a tool call and its result, and thinking with ``enable_thinking`` on
and off — given to both as transformers takes them (issue 51, item 1: transformers'
template environment; the routes' shaping of messages is item 2's)."""

from __future__ import annotations

import pytest
from gguf_tools import TEMPLATES, converter_tree
from transformers.utils.chat_template_utils import render_jinja_template

from engine.text.chat_template import ChatTemplate, ChatTemplateError

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "its name"}},
            "required": ["city"],
        },
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS = {
    "plain": ([{"role": "user", "content": "Hello there"}], None, {}),
    "system": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, {}),
    "turns": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a colour."},
        ],
        None,
        {},
    ),
    "parts": (
        [{"role": "user", "content": [{"type": "text", "text": " A reminder. "}, {"type": "text", "text": "Hi"}]}],
        None,
        {},
    ),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER], {}),
    "call": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C, sunny"},
        ],
        [WEATHER],
        {},
    ),
    "thinking": (
        [
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        None,
        {"enable_thinking": True},
    ),
    "no-thinking": ([{"role": "user", "content": "2 + 2?"}], None, {"enable_thinking": False}),
}


def corpus() -> dict[str, str]:
    folder = converter_tree() / TEMPLATES
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}


def outcome(render) -> tuple[str, str]:
    """("text", the prompt) or ("refused", why)."""
    try:
        return "text", render()
    except Exception as exc:  # noqa: BLE001 - transformers raises several types; ours ChatTemplateError
        return "refused", f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def templates() -> dict[str, str]:
    return corpus()


def test_the_corpus_is_there(templates):
    assert len(templates) >= 60, sorted(templates)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_every_template_renders_as_transformers_does(templates, conversation):
    messages, tools, kwargs = CONVERSATIONS[conversation]
    differ, both_refuse = {}, []
    for name, source in templates.items():
        theirs = outcome(
            lambda source=source: render_jinja_template(
                [messages], tools=tools, chat_template=source, add_generation_prompt=True, **SPECIAL, **kwargs
            )[0][0]
        )
        ours = outcome(lambda source=source: ChatTemplate(source, SPECIAL).render(messages, True, tools, **kwargs))
        if theirs[0] == ours[0] == "refused":
            both_refuse.append(name)
        elif theirs != ours:
            differ[name] = (theirs, ours)
    assert not differ, {k: (a[0], b[0], b[1][:300] if b[0] == "refused" else "") for k, (a, b) in differ.items()}


def test_a_template_that_raises_is_a_template_error():
    """Whatever the template's code raises (here a type error) is ChatTemplateError,
    which the routes answer with a 400."""
    template = ChatTemplate("{{ messages[0].content + 1 }}", SPECIAL)
    with pytest.raises(ChatTemplateError, match="TypeError"):
        template.render([{"role": "user", "content": "a"}])
