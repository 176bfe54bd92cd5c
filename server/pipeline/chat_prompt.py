"""A chat request's prompt: the template in use applied (with the request's tools and
template variables), a final assistant message continued (prefill), conversations the
template cannot take refused with a 400.

A message's content reaches the template in the form it takes (``ChatTemplate.content_forms``,
probed once): as typed parts (``{"type": "text", "text": ...}``, ``{"type": "image"}``)
where the template iterates them and the client sent parts, or where it takes parts
only (SmolVLM's, Idefics3's, which drop a string's text); as a string otherwise, each
image then at llama-server's marker. Parts keep their boundaries, so a template that
trims each text part (Gemma 3 and 4) or joins them its own way (Granite 4) writes what
transformers' processor writes. What the template writes for an image part
(``ChatTemplate.image_text``) becomes the marker again after rendering, where the
request's images are put."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from engine import ChatTemplate, ChatTemplateError, EngineService
from server.errors import APIError
from server.pipeline.tool_calls import tools_system_prompt
from server.schemas.requests import MEDIA_MARKER, ChatFields, ContentPart, Message

PREFILL_MARK = "\u2063slotserve-prefill\u2063"  # never in a template's own text


def chat_template(engine: EngineService) -> ChatTemplate:
    template = engine.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions or start with --chat-template")
    return template


def _content(m: Message, template: ChatTemplate) -> str | list[dict]:
    """The message's content in the form the template takes (see the module's docstring)."""
    strings, parts = template.content_forms
    given = m.content if isinstance(m.content, list) else None
    has_image = given is not None and any(not isinstance(p, ContentPart) for p in given)
    if not parts or (given is None and strings) or (has_image and template.image_text is None):
        return m.text()
    if given is None:
        return [{"type": "text", "text": m.content or ""}]
    return [{"type": "text", "text": p.text} if isinstance(p, ContentPart) else {"type": "image"} for p in given]


def _flat(content: str | list[dict]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] if p["type"] == "text" else MEDIA_MARKER for p in content)


def _turn(m: Message, template: ChatTemplate) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": m.role, "content": _content(m, template)}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key):
            turn[key] = getattr(m, key)
    if m.tool_calls:
        turn["tool_calls"] = [
            {
                "id": c.id or f"call_{i}",
                "type": "function",
                "function": {"name": c.function.name, "arguments": _args(c)},
            }
            for i, c in enumerate(m.tool_calls)
        ]
    return turn


def _args(call) -> dict | str:
    """Arguments as an object for the template (templates write them with tojson)."""
    args = call.function.arguments
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def _tools_as_text(turns: list[dict], tools: list[dict]) -> list[dict]:
    """For a template that knows nothing of tools: the tools described in a system
    turn, past calls written into the assistant's text and results as user turns, in
    the Hermes format the answer is then parsed in."""
    note = tools_system_prompt(tools)
    out = []
    for turn in turns:
        turn = {**turn, "content": _flat(turn["content"])}  # the Hermes text is a string
        if turn.get("tool_calls"):
            calls = "".join(
                "\n<tool_call>\n"
                + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                + "\n</tool_call>"
                for c in turn["tool_calls"]
            )
            turn = {"role": "assistant", "content": (turn["content"] + calls).strip("\n")}
        elif turn["role"] == "tool":
            turn = {"role": "user", "content": f"<tool_response>\n{turn['content']}\n</tool_response>"}
        out.append(turn)
    if out[0]["role"] == "system":
        return [{**out[0], "content": out[0]["content"] + "\n\n" + note}, *out[1:]]
    return [{"role": "system", "content": note}, *out]


def uses_tools(body: ChatFields) -> bool:
    return bool(body.tools) and body.tool_choice != "none"


async def render_chat(engine: EngineService, body: ChatFields, kwargs: dict | None = None, prefill: bool = True) -> str:
    """The template applied (``render_chat_turn``'s prompt)."""
    return (await render_chat_turn(engine, body, kwargs, prefill))[0]


async def render_chat_turn(
    engine: EngineService, body: ChatFields, kwargs: dict | None = None, prefill: bool = True
) -> tuple[str, str]:
    """The template applied (in a worker thread: a big conversation renders slowly), and
    the generation prompt its end is ("" where none: a prefill, or no generation prompt
    asked), i.e. what the render without one lacks. A chat template may write that part
    otherwise once the answer is history (Qwen3.5's drops ``<think>``), so the memory
    keeps a checkpoint where it begins (``Engine.add_sequence``'s ``turn_start``).

    A final assistant message is a prefill: the prompt ends inside it, so the model
    continues it (llama-server's default; vLLM's ``continue_final_message``).
    ``continue_final_message``: None continues when the last message is the
    assistant's; True requires it to be; False renders it as a finished turn.
    ``kwargs``: the server's template variables, under the request's own. ``prefill``
    False (``--no-prefill-assistant``): a final assistant message is a finished turn
    unless the request says ``continue_final_message``."""
    template = chat_template(engine)
    messages, continue_final = body.messages, body.continue_final_message
    if len(messages) >= 2 and messages[-1].role == messages[-2].role == "assistant":
        raise APIError(400, "messages: two assistant messages at the end; at most the last one is continued")
    last_is_assistant = bool(messages) and messages[-1].role == "assistant"
    if continue_final and not last_is_assistant:
        raise APIError(400, "continue_final_message: the last message must be the assistant's")
    turns = [_turn(m, template) for m in messages]
    typed_images = any(p["type"] == "image" for t in turns if isinstance(t["content"], list) for p in t["content"])
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if uses_tools(body) else None
    if tools and not template.takes_tools:
        turns = _tools_as_text(turns, tools)
    given = {**(kwargs or {}), **(body.chat_template_kwargs or {})}
    variables = {k: v for k, v in given.items() if k not in ("messages", "add_generation_prompt", "tools")}
    prefill = last_is_assistant and (continue_final if continue_final is not None else prefill)

    def render() -> tuple[str, str]:
        if not prefill:
            text = template.render(turns, body.add_generation_prompt, tools, **variables)
            if not body.add_generation_prompt:
                return text, ""
            try:
                bare = template.render(turns, False, tools, **variables)
            except ChatTemplateError:  # a template that wants its generation prompt: no point to mark
                return text, ""
            return text, text[len(bare) :] if text.startswith(bare) else ""
        last = turns[-1]["content"]
        mark = last + PREFILL_MARK if isinstance(last, str) else [*last, {"type": "text", "text": PREFILL_MARK}]
        marked = [*turns[:-1], {**turns[-1], "content": mark}]
        text = template.render(marked, False, tools, **variables)
        end = text.rfind(PREFILL_MARK)  # the prompt stops where the given content does
        if end < 0:
            raise ChatTemplateError("the template does not keep the final assistant message as given")
        return text[:end], ""

    try:
        text, opening = await asyncio.to_thread(render)
    except ChatTemplateError as exc:
        raise APIError(400, f"chat template: {exc}") from exc
    if typed_images:  # the template wrote each image its own way: the marker again, for the images
        text = text.replace(template.image_text, MEDIA_MARKER)
    tok = engine.tokenizer
    if tok.adds_bos and tok.bos_token and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token) :]  # encoding adds it (llama-server's rule: no double BOS)
    return text, opening
