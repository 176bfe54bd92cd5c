"""The answer side of the Responses API: output items (reasoning, message, function
calls) from a chat completion's message, the finished response, and the stream of
Responses events rewritten from chat completion chunks."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(message: dict, status: str = "completed") -> list[dict]:
    """An assistant chat message as Responses output items: reasoning, message, calls."""
    out: list[dict] = []
    if message.get("reasoning_content"):
        content = [{"type": "reasoning_text", "text": message["reasoning_content"]}]
        out.append(reasoning_item(new_id("rs"), content, status))
    if message.get("content"):
        out.append(message_item(new_id("msg"), message["content"], status))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        out.append(call_item(call["id"], fn["name"], fn["arguments"], status))
    return out


def reasoning_item(item_id: str, content: list[dict], status: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "encrypted_content": "",
            "status": status}  # fmt: skip


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [output_text(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": f"fc_{call_id}", "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}  # fmt: skip


def finished(response: dict, finish_reason: str | None, usage: dict) -> dict:
    """``response`` completed (or incomplete, cut by ``max_output_tokens``), with usage."""
    cut = finish_reason == "length"
    response |= {"status": "incomplete" if cut else "completed", "completed_at": int(time.time())}
    response["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    response["usage"] = {
        "input_tokens": usage.get("prompt_tokens", 0),
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens", 0),
    }
    return response


class _Events:
    """Chat completion chunks -> Responses events, one output item open at a time:
    ``response.output_item.added``, its deltas, its ``*.done`` events and
    ``response.output_item.done``; each event numbered (``sequence_number``)."""

    def __init__(self, response: dict):
        self.response, self.seq = response, 0
        self.items: list[dict] = []  # the output items so far (the last one may be open)
        self.open: dict | None = None
        self.text = ""  # the open item's text (or a call's arguments)

    def event(self, kind: str, **data) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **data}

    def start(self, item: dict) -> list[dict]:
        out = self.close()
        self.open, self.text = item, ""
        self.items.append(item)
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        if item["type"] == "message":
            out.append(self.where("response.content_part.added", part=output_text("")))
        return out

    def where(self, kind: str, **data) -> dict:
        place = {"item_id": self.open["id"], "output_index": len(self.items) - 1}
        if self.open["type"] != "function_call":
            place["content_index"] = 0
        return self.event(kind, **place, **data)

    def add(self, kind: str, piece: str) -> list[dict]:
        self.text += piece
        names = {"reasoning": "reasoning_text", "message": "output_text", "function_call": "function_call_arguments"}
        return [self.where(f"response.{names[kind]}.delta", delta=piece)]

    def close(self) -> list[dict]:
        item, out = self.open, []
        if item is None:
            return out
        item["status"] = "completed"
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": self.text}]
            out.append(self.where("response.reasoning_text.done", text=self.text))
        elif item["type"] == "message":
            part = output_text(self.text)
            item["content"] = [part]
            out.append(self.where("response.output_text.done", text=self.text, logprobs=[]))
            out.append(self.where("response.content_part.done", part=part))
        else:
            item["arguments"] = self.text
            out.append(self.where("response.function_call_arguments.done", arguments=self.text, name=item["name"]))
        self.open = None
        out.append(self.event("response.output_item.done", output_index=len(self.items) - 1, item=item))
        return out

    def chunk(self, data: dict) -> list[dict]:
        """The events of one chat chunk (``prompt_progress``: a ``response.in_progress``)."""
        out = []
        if "prompt_progress" in data:
            out.append(self.event("response.in_progress", response=self._head()))
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.kind != "reasoning":
                    out += self.start(reasoning_item(new_id("rs"), [], "in_progress"))
                out += self.add("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                if self.kind != "message":
                    out += self.start(message_item(new_id("msg"), None, "in_progress"))
                out += self.add("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if fn.get("name"):  # a new call opens its item
                    out += self.start(call_item(call.get("id") or new_id("call"), fn["name"], "", "in_progress"))
                if fn.get("arguments") and self.kind == "function_call":
                    out += self.add("function_call", fn["arguments"])
        return out

    @property
    def kind(self) -> str | None:
        return self.open["type"] if self.open else None

    def _head(self) -> dict:
        return {**self.response, "output": []}


def _frame(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def response_events(chunks: AsyncIterator[dict], response: dict) -> AsyncIterator[str]:
    """OpenAI chat chunks (with usage last) -> the Responses event sequence:
    ``response.created``, ``response.in_progress``, the items' events,
    ``response.completed`` (with llama-server's ``timings``). Chunk ``timings``
    (``timings_per_token``) and ``prompt_progress`` ride on the events they produce."""
    ev = _Events(response)
    yield _frame(ev.event("response.created", response=ev._head()))
    yield _frame(ev.event("response.in_progress", response=ev._head()))
    reason, usage, timings = None, {}, None
    async for data in chunks:
        if "error" in data:
            error = data["error"]
            yield _frame(ev.event("error", code=error.get("type"), message=error["message"], param=None))
            return
        usage, timings = data.get("usage") or usage, data.get("timings") or timings
        for choice in data.get("choices") or []:
            reason = choice.get("finish_reason") or reason
        events = ev.chunk(data)
        if events and "timings" in data:
            events[-1]["timings"] = data["timings"]
        if events and "prompt_progress" in data:
            events[0]["prompt_progress"] = data["prompt_progress"]
        for event in events:
            yield _frame(event)
    for event in ev.close():
        yield _frame(event)
    done = finished({**response, "output": ev.items}, reason, usage)
    last = ev.event("response.completed", response=done)
    yield _frame({**last, "timings": timings} if timings else last)
