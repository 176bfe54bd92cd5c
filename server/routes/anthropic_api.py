"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as
llama-server and Claude-speaking tools use it: the request becomes the chat body it means
and goes the one way chat requests go (server/pipeline/chat.py: same template, tools,
reasoning split, sampling); its answer or its chunks are written in Anthropic's shapes
(content blocks; the event sequence ``message_start``, ``content_block_start/delta/stop``,
``message_delta``, ``message_stop``). Errors take Anthropic's shape on these routes (server/errors.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationError

from server.errors import APIError
from server.pipeline.chat import chat_prompt, open_chat
from server.pipeline.sse import SSEResponse
from server.schemas.answers import AnthropicError, AnthropicMessageOut, AnthropicTokenCount, documented
from server.schemas.requests import ChatCompletionRequest, Int, NonEmpty, ToolName, _Body, text_only

router = APIRouter()
INT32 = 2**31 - 1  # bounds of Anthropic's integers (exact in a JSON document's doubles)


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ImageBlock(_Body):
    type: Literal["image", "document"]  # accepted in shape, refused: text only
    source: dict | None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict = {}


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Body):
    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""
    signature: str | None = None


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(_Body):
    name: ToolName
    description: str | None = None
    input_schema: dict = {"type": "object"}


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class Thinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Int(ge=0, le=INT32) | None = None


class MessagesFields(_Body):
    model: str | None = None
    messages: list[AnthropicMessage]  # none at all is taken, as llama-server: the prompt is the template's opening
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(MessagesFields):
    """Anthropic's request. Images and documents are refused (400): text only."""

    max_tokens: Int(ge=1, le=INT32)
    stop_sequences: Annotated[list[NonEmpty], Field(max_length=16)] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: Int(ge=0, le=INT32) | None = None
    stream: bool = False
    metadata: dict | None = None


def _text(content: str | list) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextBlock))


BILLING = "x-anthropic-billing-header:"


def _system(system: str | list) -> str | None:
    """The system prompt less Claude Code's billing header: a first system block that is
    only an ``x-anthropic-billing-header: ...; cch=<nonce>;`` line, with a new nonce on
    every request. In the prompt it would make every turn's first tokens new, so no
    turn would read its conversation from the cache (sglang and vllm-mlx drop it too).
    None when the header was all there was."""
    if isinstance(system, str):
        first, _, rest = system.partition("\n")
        return (rest or None) if first.strip().startswith(BILLING) else system
    kept = [b for b in system if not (isinstance(b, TextBlock) and _is_billing(b.text))]
    return _text(kept) if kept else None


def _is_billing(text: str) -> bool:
    text = text.strip()
    return text.startswith(BILLING) and "\n" not in text


def _chat_part(block: TextBlock | ImageBlock) -> dict:
    """A text or image block as a chat content part (an image: a data: URL of its base64
    source; a URL source goes as it is, and the chat route says what it takes)."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    else:
        url = source.get("url")
    return {"type": "image_url", "image_url": {"url": url} if isinstance(url, str) else None}


def to_chat(body: MessagesFields, extra: dict | None = None) -> ChatCompletionRequest:
    """The chat completion request an Anthropic request means."""
    messages: list[dict] = []
    system = _system(body.system) if body.system else None
    if system is not None:
        messages.append({"role": "system", "content": system})
    for m in body.messages:
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        nested = [
            c for b in blocks if isinstance(b, ToolResultBlock) and isinstance(b.content, list) for c in b.content
        ]
        media = next((b for b in [*blocks, *nested] if isinstance(b, ImageBlock) and b.type != "image"), None)
        if media is not None:  # a document block
            raise APIError(400, text_only(media.type))
        images = [b for b in blocks if isinstance(b, ImageBlock)]
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                result: str | list[dict] = _text(b.content)
                if isinstance(b.content, list) and any(isinstance(c, ImageBlock) for c in b.content):
                    result = [_chat_part(c) for c in b.content]  # a tool's image: the tool message's part
                messages.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
        calls = [
            {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
            for b in blocks
            if isinstance(b, ToolUseBlock)
        ]
        only_results = blocks and all(isinstance(b, ToolResultBlock) for b in blocks)
        if not only_results:
            content: str | list[dict] = text
            texts = [b for b in blocks if isinstance(b, TextBlock)]
            if images or len(texts) > 1:  # the blocks in their order, each its own part (the chat route takes them)
                content = [_chat_part(b) for b in blocks if isinstance(b, TextBlock | ImageBlock)]
            msg: dict[str, Any] = {"role": m.role, "content": content}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = thinking
            messages.append(msg)
    chat: dict[str, Any] = {"messages": messages, **(extra or {})}
    if body.tools:
        chat["tools"] = [_function(t) for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.name or ""}}
        else:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if body.thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": body.thinking.type != "disabled"}
        if body.thinking.type == "enabled":  # llama-server's reading: a budget, 10000 when not given
            chat["thinking_budget_tokens"] = (
                10000 if body.thinking.budget_tokens is None else body.thinking.budget_tokens
            )
    empty = not messages
    if empty:
        chat["messages"] = [{"role": "user", "content": ""}]  # validated with one, rendered with none
    try:
        out = ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # what the chat request refuses, named as a 400
        raise RequestValidationError(exc.errors()) from exc
    if empty:
        out.messages = []
    return out


def _function(tool: AnthropicTool) -> dict:
    fn = {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema}
    return {"type": "function", "function": fn}


def _sampling(body: MessagesRequest) -> dict:
    out = {"max_tokens": body.max_tokens, "stream": body.stream}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            out[name] = getattr(body, name)
    if body.stop_sequences:
        out["stop"] = body.stop_sequences
    return out


STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}


def _blocks(message: dict) -> list[dict]:
    """An OpenAI assistant message as Anthropic content blocks."""
    out = []
    if message.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        out.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"] or "{}")}
        )
    return out


@router.post(
    "/v1/messages",
    response_model=None,
    responses=documented(AnthropicMessageOut, 400, 413, 500, 503, stream=True, error=AnthropicError),
)
async def messages(body: MessagesRequest, http: HTTPRequest) -> Response:
    """Anthropic's Messages API (streamed with ``stream``)."""
    state = http.app.state.slotserve
    chat = await open_chat(http, to_chat(body, _sampling(body)))
    if chat is None:
        return Response(status_code=499)
    model = body.model or state.settings.model_name
    if body.stream:  # with usage: the stream's output tokens, for message_delta
        n_prompt = len(chat.run.req.prompt_ids)
        return SSEResponse(_events(chat.stream(include_usage=True), model, n_prompt), chat.run)
    await chat.run.collect()
    choice = (await chat.choices())[0]
    reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")  # tool_calls when the answer is calls
    stop_sequence = chat.run.choices[0].stop_word or None
    if reason == "end_turn" and stop_sequence:
        reason = "stop_sequence"
    usage = chat.run.usage()
    return JSONResponse(
        {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _blocks(choice["message"]),
            "stop_reason": reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "cache_read_input_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "cache_creation_input_tokens": 0,
            },
        }
    )


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


async def _events(chunks: AsyncIterator[dict], model: str, n_prompt: int) -> AsyncIterator[str]:
    """OpenAI chat chunks -> Anthropic's event sequence."""
    message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model, "content": []}
    message |= {"stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": n_prompt, "output_tokens": 0}}
    yield _event("message_start", {"message": message})
    open_kind, index, reason, usage = None, -1, "end_turn", {}
    async for data in chunks:
        if "error" in data:
            error = data["error"]
            yield _event("error", {"error": {"type": error.get("type", "api_error"), "message": error["message"]}})
            return
        usage = data.get("usage") or usage
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            pieces = []
            if delta.get("reasoning_content"):
                pieces.append(("thinking", {"type": "thinking_delta", "thinking": delta["reasoning_content"]}, None))
            if delta.get("content"):
                pieces.append(("text", {"type": "text_delta", "text": delta["content"]}, None))
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                start = None
                if fn.get("name"):  # a new call opens its block
                    start = {"type": "tool_use", "id": call.get("id"), "name": fn["name"], "input": {}}
                pieces.append(
                    ("tool_use", {"type": "input_json_delta", "partial_json": fn.get("arguments") or ""}, start)
                )
            for kind, piece, start in pieces:
                if kind != open_kind or start is not None:
                    if open_kind is not None:
                        yield _event("content_block_stop", {"index": index})
                    index, open_kind = index + 1, kind
                    empty = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else None
                    block = start or empty or {"type": "text", "text": ""}
                    yield _event("content_block_start", {"index": index, "content_block": block})
                yield _event("content_block_delta", {"index": index, "delta": piece})
            if choice.get("finish_reason"):
                reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
    if open_kind is not None:
        yield _event("content_block_stop", {"index": index})
    out = {"output_tokens": usage.get("completion_tokens", 0), "input_tokens": usage.get("prompt_tokens", 0)}
    yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": None}, "usage": out})
    yield _event("message_stop", {})


@router.post(
    "/v1/messages/count_tokens",
    response_model=None,
    responses=documented(AnthropicTokenCount, 400, 413, 503, error=AnthropicError),
)
async def count_tokens(body: MessagesFields, http: HTTPRequest) -> dict:
    """The prompt's tokens as the template renders it (Anthropic's ``input_tokens``),
    however many: counting is not running, so a prompt longer than a slot is counted."""
    state = http.app.state.slotserve
    ids = (await chat_prompt(state, state.require_ready(), to_chat(body))).ids
    return {"input_tokens": len(ids)}
