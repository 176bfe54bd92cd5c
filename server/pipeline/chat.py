"""One way through a chat request, whichever API it came by: OpenAI's chat route,
Anthropic's Messages and OpenAI's Responses all call ``open_chat`` with a chat body and
get the admitted run and its answer; each then writes that answer in its own shapes
(no route calls another, nothing is parsed back)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple

from fastapi import Request as HTTPRequest

from engine import Engine, TokenLogprob
from server.errors import APIError
from server.pipeline.chat_output import ChatAnswer
from server.pipeline.chat_prompt import chat_template, render_chat_turn, uses_tools
from server.pipeline.generation import check_text_fits, encode
from server.pipeline.media import ImageBudget, media_prompt
from server.pipeline.openai_run import chunks, header, piece, start_run
from server.pipeline.preserved import preserved
from server.pipeline.reasoning import opens_thinking
from server.pipeline.run import Run
from server.pipeline.template_family import template_family
from server.pipeline.thinking_budget import budget_spec
from server.pipeline.tool_calls import forced_grammar
from server.schemas.requests import ChatCompletionRequest, NamedToolChoice


def chat_logprob(engine: Engine, lp: TokenLogprob) -> dict:
    def entry(tid: int, value: float) -> dict:
        text = piece(engine, tid)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}


class ChatPrompt(NamedTuple):
    text: str  # the rendered prompt
    ids: list[int]
    media: list  # its images (engine MediaItems)
    turn_start: int | None  # where its generation prompt begins (None: unknown, or none)


async def chat_prompt(state, engine, body: ChatCompletionRequest) -> ChatPrompt:
    """The rendered prompt, its token ids, its images and where its generation prompt
    begins (the generation prompt's own tokens, where the prompt's ids end with them)."""
    check_text_fits(engine, sum(len(m.text()) for m in body.messages))
    if body.continue_final_message and "add_generation_prompt" in body.model_fields_set and body.add_generation_prompt:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true")
    kwargs, prefill = state.settings.template_kwargs, state.settings.prefill_assistant
    prompt, opening = await render_chat_turn(engine, body, kwargs, prefill)
    urls = [(i, url) for i, m in enumerate(body.messages) for url in m.images()]
    if urls:
        where = f"messages.{urls[0][0]}.content"
        images = [u for _, u in urls]
        ids, media = await media_prompt(engine, prompt, images, where, state.settings, ImageBudget())
    else:
        ids, media = await encode(engine, prompt, add_special=True), []  # BOS where the tokenizer adds it
    tail = await encode(engine, opening, add_special=False) if opening else []
    fits = tail and len(tail) < len(ids) and ids[len(ids) - len(tail) :] == tail
    return ChatPrompt(prompt, ids, media, len(ids) - len(tail) if fits else None)


def chat_max_tokens(body: ChatCompletionRequest) -> int | None:
    return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens


def chat_top(body: ChatCompletionRequest) -> int | None:
    return (body.top_logprobs or 0) if body.logprobs else None


def forced_call(engine, body: ChatCompletionRequest) -> tuple[str, str] | None:
    """The grammar that makes the answer a call, when tool_choice requires one."""
    choice = body.tool_choice
    if not body.tools or choice in (None, "none", "auto"):
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise APIError(400, "tool_choice: the request has no tools")
        return None
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        if not tools:
            raise APIError(400, f"tool_choice: no tool named {choice.function.name!r}")
    fmt = template_family(chat_template(engine).source).name
    return "lark", forced_grammar(fmt, tools, body.parallel_tool_calls)


@dataclass
class ChatRun:
    """An admitted chat request: its run, its answer being written (reasoning split,
    tool calls), and OpenAI's answer header."""

    engine: object
    body: ChatCompletionRequest
    run: Run
    answer: ChatAnswer
    head: dict

    def stream(self, include_usage: bool, verbose=None) -> AsyncIterator[dict]:
        """OpenAI's chat chunks as dicts (an error ends them as ``{"error": ...}``)."""
        head = {**self.head, "object": "chat.completion.chunk"}
        return chunks(self.run, head, include_usage, self.answer.delta, self.answer.opening(), verbose)

    async def choices(self) -> list[dict]:
        """Every choice as a message (run to its end first: ``run.collect()``)."""
        return await asyncio.to_thread(lambda: [self.answer.choice(c) for c in self.run.choices])  # logprobs: decodes


async def open_chat(http: HTTPRequest, body: ChatCompletionRequest) -> ChatRun | None:
    """The chat body's run, admitted, with its answer; None when the client left.
    Refusals raise APIError (the route's error shape answers them)."""
    state = http.app.state.slotserve
    engine = state.require_ready()
    prompt, ids, media, turn_start = await chat_prompt(state, engine, body)
    found = template_family(chat_template(engine).source)
    thinking = found.thinking
    budget = budget_spec(state, engine, body, prompt, thinking)
    forced = forced_call(engine, body)
    tool_format = found.name if uses_tools(body) else None
    keep = preserved(engine.tokenizer, tool_format, thinking)
    limits = (chat_max_tokens(body), chat_top(body))
    run = await start_run(http, body, ids, *limits, forced, budget, media, keep, turn_start)
    if run is None:
        return None
    fmt = body.reasoning_format or state.settings.reasoning_format
    logprob = (lambda lp: chat_logprob(engine, lp)) if body.logprobs else None
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if tool_format else None
    answer = ChatAnswer(
        body.n, fmt, opens_thinking(prompt, thinking), tool_format, logprob, tools=tools, thinking=thinking
    )
    return ChatRun(engine, body, run, answer, header("chat.completion", state.settings.model_name, engine))
