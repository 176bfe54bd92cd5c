"""A chat request's prompt: the model's template applied, a final assistant message
continued (prefill), conversations the template cannot take refused with a 400."""

from __future__ import annotations

import asyncio

from engine.chat_template import ChatTemplateError
from engine.service import EngineService
from server.errors import APIError
from server.schemas import Message

PREFILL_MARK = "\u2063slotserve-prefill\u2063"  # never in a template's own text


async def render_chat(
    engine: EngineService,
    messages: list[Message],
    add_generation_prompt: bool = True,
    continue_final: bool | None = None,
) -> str:
    """The chat template applied (in a worker thread: a big conversation renders slowly).

    A final assistant message is a prefill: the prompt ends inside it, so the model
    continues it (llama-server's default; vLLM's ``continue_final_message``).
    ``continue_final``: None continues when the last message is the assistant's; True
    requires it to be; False renders it as a finished turn."""
    template = engine.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions")
    if len(messages) >= 2 and messages[-1].role == messages[-2].role == "assistant":
        raise APIError(400, "messages: two assistant messages at the end; at most the last one is continued")
    last_is_assistant = messages[-1].role == "assistant"
    if continue_final and not last_is_assistant:
        raise APIError(400, "continue_final_message: the last message must be the assistant's")
    turns = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages]
    prefill = last_is_assistant and continue_final is not False

    def render() -> str:
        if not prefill:
            return template.render(turns, add_generation_prompt=add_generation_prompt)
        marked = [*turns[:-1], {**turns[-1], "content": turns[-1]["content"] + PREFILL_MARK}]
        text = template.render(marked, add_generation_prompt=False)
        end = text.rfind(PREFILL_MARK)  # the prompt stops where the given content does
        if end < 0:
            raise ChatTemplateError("the template does not keep the final assistant message as given")
        return text[:end]

    try:
        return await asyncio.to_thread(render)
    except ChatTemplateError as exc:
        raise APIError(400, f"chat template: {exc}") from exc
