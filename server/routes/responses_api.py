"""OpenAI's Responses API (``POST /v1/responses``, ``/v1/responses/input_tokens``), as
Codex and the OpenAI SDK's ``responses.create`` use it, and as llama-server serves it:
stateless. The request becomes the chat body it means and goes the one way chat requests
go (server/pipeline/chat.py: the same template, tools, reasoning split, structured
outputs and sampling); the answer, or its chunks, are written as output items (server/pipeline/responses_output.py).

Choices (docs/architecture.md): ``previous_response_id`` is a 400 (nothing is stored;
``store`` is accepted and answered ``false``); tools other than functions are skipped
(there is nothing to run them), as llama-server does; an answer cut by
``max_output_tokens`` has ``status: incomplete`` and its stream still ends with
``response.completed``, the event clients wait for."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field, ValidationError

from server.errors import APIError
from server.pipeline.chat import chat_prompt, open_chat
from server.pipeline.responses_output import finished, new_id, output_items, response_events
from server.pipeline.sse import SSEResponse
from server.schemas.answers import ResponseObject, ResponseTokenCount, documented
from server.schemas.requests import ChatCompletionRequest, Int, ToolName, _Body, text_only

router = APIRouter()
log = logging.getLogger("slotserve")


class Part(_Body):
    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file", "reasoning_text"]
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None  # input_image: a data: URL (base64)


class MessageItem(_Body):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]


class ReasoningItem(_Body):
    type: Literal["reasoning"]
    summary: list[dict] = []
    content: list[Part] | None = None


Item = MessageItem | FunctionCallItem | FunctionOutputItem | ReasoningItem


class ResponsesTool(_Body):
    type: str
    name: ToolName | None = None
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(_Body):
    format: TextFormat | None = None


class Reasoning(_Body):
    effort: str | None = None
    summary: str | None = None


class ResponsesFields(_Body):
    """What shapes the prompt (shared with ``input_tokens``). Other fields of the chat
    completion request (``top_k``, ``seed``, ``timings_per_token``, ``return_progress``,
    ...) are taken as they are, as llama-server takes them."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | Annotated[list[Item], Field(min_length=1)]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None


class ResponsesRequest(ResponsesFields):
    max_output_tokens: Int(ge=1) | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    store: bool = False
    metadata: dict | None = None


# chat fields that a Responses request names otherwise, or that would break its one output
_NOT_PASSED = {"messages", "n", "stream_options", "response_format", "max_tokens", "max_completion_tokens", "verbose"}


def _text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    for p in content:
        if p.type in ("input_image", "input_file"):
            raise APIError(400, f"{where}: {text_only(p.type.removeprefix('input_'))}")
    return "".join(p.text or p.refusal or "" for p in content)


def _user_content(content: str | list[Part], where: str) -> str | list[dict]:
    """A user's (or system's) content: its text, or with images the chat parts in order."""
    if isinstance(content, str) or not any(p.type == "input_image" for p in content):
        return _text(content, where)
    parts = []
    for p in content:
        if p.type == "input_file":
            raise APIError(400, f"{where}: {text_only('file')}")
        if p.type == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": p.image_url} if p.image_url else None})
        else:
            parts.append({"type": "text", "text": p.text or p.refusal or ""})
    return parts


def _messages(body: ResponsesFields) -> list[dict]:
    """The chat messages of ``instructions`` and ``input`` (an assistant's message, calls
    and reasoning that follow each other are one assistant turn, as in llama-server)."""
    out: list[dict] = []
    if body.instructions is not None:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]

    def assistant() -> dict:
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        return out[-1]

    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        if isinstance(item, MessageItem) and item.role != "assistant":
            out.append({"role": item.role, "content": _user_content(item.content, where)})
        elif isinstance(item, MessageItem):
            turn = assistant()
            turn["content"] += _text(item.content, where)
        elif isinstance(item, FunctionCallItem):
            fn = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": fn}
            assistant().setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, where)})
        else:
            parts = item.content or [Part(type="reasoning_text", text=s.get("text", "")) for s in item.summary]
            assistant()["reasoning_content"] = _text(parts, where)
    return out


def to_chat(body: ResponsesFields, extra: dict | None = None) -> ChatCompletionRequest:
    """The chat completion request a Responses request means."""
    if body.previous_response_id:
        raise APIError(400, "previous_response_id is not supported: this server stores no responses; send the input")
    chat: dict[str, Any] = {k: v for k, v in (body.model_extra or {}).items() if k not in _NOT_PASSED}
    chat |= {"messages": _messages(body), "parallel_tool_calls": body.parallel_tool_calls, **(extra or {})}
    tools = [t for t in body.tools or [] if t.type == "function"]
    for t in body.tools or []:
        if t.type != "function":
            log.warning("responses: a %r tool is skipped (only function tools are served)", t.type)
    if tools:
        chat["tools"] = [{"type": "function", "function": _function(t)} for t in tools]
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None and (tools or choice != "auto"):
        chat["tool_choice"] = choice
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_schema":
        spec = {"name": fmt.name or "output", "schema": fmt.schema_ or {}, "strict": fmt.strict}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if body.reasoning is not None and body.reasoning.effort is not None:
        kwargs = chat.get("chat_template_kwargs") or {}
        chat["chat_template_kwargs"] = {"reasoning_effort": body.reasoning.effort, **kwargs}
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # what the chat request refuses, named as a 400
        raise RequestValidationError(exc.errors()) from exc


def _function(tool: ResponsesTool) -> dict:
    if not tool.name:
        raise APIError(400, "tools: a function tool needs a name")
    fn = {"name": tool.name, "description": tool.description or "", "parameters": tool.parameters or {}}
    return fn if tool.strict is None else {**fn, "strict": tool.strict}


def response_object(body: ResponsesRequest, rid: str, model: str, created: int) -> dict:
    """The response before its output: what the request asked for, echoed as OpenAI does."""
    fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else None
    choice = body.tool_choice.model_dump() if isinstance(body.tool_choice, FunctionChoice) else body.tool_choice
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": False,
        "temperature": body.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": body.metadata or {},
    }


def _sampling(body: ResponsesRequest) -> dict:
    out: dict[str, Any] = {"stream": body.stream}
    if body.max_output_tokens is not None:
        out["max_tokens"] = body.max_output_tokens
    for name in ("temperature", "top_p"):
        if getattr(body, name) is not None:
            out[name] = getattr(body, name)
    return out


@router.post(
    "/v1/responses", response_model=None, responses=documented(ResponseObject, 400, 413, 500, 503, stream=True)
)
@router.post("/responses", include_in_schema=False)
async def responses(body: ResponsesRequest, http: HTTPRequest) -> Response:
    """OpenAI's Responses API, stateless (streamed with ``stream``)."""
    state = http.app.state.slotserve
    chat = await open_chat(http, to_chat(body, _sampling(body)))
    if chat is None:
        return Response(status_code=499)
    response = response_object(body, new_id("resp"), body.model or state.settings.model_name, int(time.time()))
    if body.stream:
        return SSEResponse(response_events(chat.stream(include_usage=True), response), chat.run)
    await chat.run.collect()
    choice = (await chat.choices())[0]
    response["output"] = output_items(choice["message"])
    return JSONResponse(finished(response, choice["finish_reason"], chat.run.usage()))


@router.post("/v1/responses/input_tokens", response_model=None, responses=documented(ResponseTokenCount, 400, 413, 503))
@router.post("/responses/input_tokens", include_in_schema=False)
async def input_tokens(body: ResponsesFields, http: HTTPRequest) -> dict:
    """The prompt's tokens as the template renders it, however many."""
    state = http.app.state.slotserve
    ids = (await chat_prompt(state, state.require_ready(), to_chat(body))).ids
    return {"object": "response.input_tokens", "input_tokens": len(ids)}
