"""A chat request's prompt: the template in use applied (with the request's tools and
template variables), a final assistant message continued (prefill), conversations the
template cannot take refused with a 400."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from engine import ChatTemplate, ChatTemplateError, EngineService
from server.errors import APIError
from server.pipeline.tool_calls import tools_system_prompt
from server.schemas.requests import ChatFields, Message

PREFILL_MARK = "\u2063slotserve-prefill\u2063"  # never in a template's own text


def chat_template(engine: EngineService) -> ChatTemplate:
    template = engine.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions or start with --chat-template")
    return template


def _turn(m: Message) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": m.role, "content": m.text()}
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
    """The template applied (in a worker thread: a big conversation renders slowly).

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
    turns = [_turn(m) for m in messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if uses_tools(body) else None
    if tools and not template.takes_tools:
        turns = _tools_as_text(turns, tools)
    given = {**(kwargs or {}), **(body.chat_template_kwargs or {})}
    variables = {k: v for k, v in given.items() if k not in ("messages", "add_generation_prompt", "tools")}
    prefill = last_is_assistant and (continue_final if continue_final is not None else prefill)

    def render() -> str:
        if not prefill:
            return template.render(turns, body.add_generation_prompt, tools, **variables)
        marked = [*turns[:-1], {**turns[-1], "content": turns[-1]["content"] + PREFILL_MARK}]
        text = template.render(marked, False, tools, **variables)
        end = text.rfind(PREFILL_MARK)  # the prompt stops where the given content does
        if end < 0:
            raise ChatTemplateError("the template does not keep the final assistant message as given")
        return text[:end]

    try:
        text = await asyncio.to_thread(render)
    except ChatTemplateError as exc:
        raise APIError(400, f"chat template: {exc}") from exc
    tok = engine.tokenizer
    if tok.adds_bos and tok.bos_token and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token) :]  # encoding adds it (llama-server's rule: no double BOS)
    return text
