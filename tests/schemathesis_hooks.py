"""Hooks for the schemathesis run of tests/test_openapi.py (its coverage and fuzzing
phases): they keep out of the positive cases what no JSON schema can rule out.

A prompt longer than the slot is refused (400, exceed_context_size_error): only the
rendered prompt's length says, so a positive case whose body is over ~700 bytes (the
test model reads a token per byte; tools are rendered as JSON) is not proposed on a
route that evaluates its prompt. Images (a prompt object's ``multimodal_data``, an
``image_url`` part anywhere) are refused by the text model under test.

A chat request is refused (400) for rules that count messages from the end, which a
JSON schema cannot state: two assistant messages at the end, or
``continue_final_message`` without a final assistant message. The document says so in
words (ChatCompletionRequest's description); these hooks keep the generator from
proposing such requests as schema-valid ones. Everything else is checked as before.

Image and document blocks of Anthropic messages are in the schema so that they get a
clear 400 ("text only") rather than a shape error; positive cases do not carry them.
Likewise llama-server's prompt objects with ``multimodal_data`` (/tokenize's content):
the server under test serves a text model.

A Responses request is refused (400) for what its schema leaves open on purpose, so
that the answer names it: media parts (text only), ``previous_response_id`` (nothing is
stored), a function tool without a name; positive cases do not carry them.

An embedding input must hold a token: the empty string does only where the model adds
BOS (as in llama-server), which no schema can say; positive cases carry no empty input.

The retrieval run (an encoder server: embeddings, or a cross-encoder's rerank, with lists
at and past ``--max-inputs``) sets ``SLOTSERVE_ST_ENCODER_BYTES``: there each input is
bounded alone (an embeddings input; a rerank query with one document, as one pair), not
the body, and an empty text is an input (the encoder adds its own tokens).

Likewise a structured-output constraint (a grammar, a JSON schema, a regex, a required
tool call) must compile, which no JSON schema can say of a string: positive cases that
carry one are not proposed (negative ones still are; the constraint tests cover what
compiles and what is refused).
"""

from __future__ import annotations

import json
import os

import schemathesis

ENCODER_BYTES = int(os.environ.get("SLOTSERVE_ST_ENCODER_BYTES", "0"))  # the retrieval run: see above
PROMPT_BYTES = int(os.environ.get("SLOTSERVE_ST_PROMPT_BYTES", "700"))  # 700 for a slot of 1024 tokens: see _too_long

CONSTRAINTS = (
    "grammar",
    "json_schema",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
)


def _positive(case) -> bool:
    meta = getattr(case, "meta", None)
    mode = getattr(getattr(meta, "generation", None), "mode", None)
    return mode is None or "negative" not in str(mode).lower()


def _constrained(body: dict) -> bool:
    if any(body.get(k) not in (None, "", {}, []) for k in CONSTRAINTS):
        return True
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    choice = body.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


def _media(body: dict) -> bool:
    """An Anthropic message with an image or document block (refused: text only)."""
    for m in body.get("messages") or []:
        blocks = m.get("content") if isinstance(m, dict) and isinstance(m.get("content"), list) else []
        for b in blocks:
            inner = b.get("content") if isinstance(b, dict) and isinstance(b.get("content"), list) else []
            if any(isinstance(x, dict) and x.get("type") in ("image", "document") for x in [b, *inner]):
                return True
    return False


def _responses_refused(body: dict) -> bool:
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if body.get("previous_response_id") or (isinstance(fmt, dict) and fmt.get("type") != "text"):
        return True
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    if any(isinstance(t, dict) and t.get("type") == "function" and not t.get("name") for t in tools):
        return True
    items = body.get("input") if isinstance(body.get("input"), list) else []
    for item in items:
        parts = [*(item.get("content") or []), *(item.get("output") or [])] if isinstance(item, dict) else []
        if any(isinstance(p, dict) and p.get("type") in ("input_image", "input_file") for p in parts):
            return True
    return False


def _images(body: dict) -> bool:
    """A prompt object with ``multimodal_data``, or a content entry or chat message with an image part."""
    entries = [body.get("content"), body.get("input"), body.get("messages"), body.get("prompt")]
    entries += [x for e in entries if isinstance(e, list) for x in e]
    for e in entries:
        if isinstance(e, dict) and e.get("multimodal_data"):
            return True
        parts = e.get("content") if isinstance(e, dict) and isinstance(e.get("content"), list) else []
        if any(isinstance(p, dict) and p.get("type") == "image_url" for p in parts):
            return True
    return False


NOT_EVALUATED = (  # routes whose text is not a prompt run in a slot
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/slots",
    "/lora-adapters",
    "/props",
)


def _too_long(path: str, body: dict) -> bool:
    """A body whose text may not fit the slot (PROMPT_BYTES: 700 for 1024 tokens, one
    per byte with the test model's byte tokenizer): every string in it, keys too (tools
    are rendered as JSON), against a margin for the template's own text. Only the size of the rendered prompt
    says, and no schema can."""
    if path.startswith(NOT_EVALUATED):
        return False
    return len(json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")) > PROMPT_BYTES


def _size(entry) -> int:
    """An embeddings input's most tokens on the test encoders (at most one a byte)."""
    if isinstance(entry, str):
        return len(entry.encode("utf-8", "surrogatepass"))
    if isinstance(entry, int):
        return 1
    if isinstance(entry, list):
        return sum(map(_size, entry))
    if isinstance(entry, dict):
        text = entry.get("prompt_string", "")
        parts = entry.get("content") if isinstance(entry.get("content"), list) else []
        return _size(text) + sum(_size(p.get("text", "")) for p in parts if isinstance(p, dict))
    return 0


def _encoder_fits(path: str, body: dict) -> bool:
    """Whether each input of a retrieval request fits the encoder (ENCODER_BYTES)."""
    if path.endswith("rerank"):
        docs = body.get("documents") if body.get("documents") is not None else body.get("texts")
        query = _size(body.get("query", ""))
        return all(query + _size(d.get("text", "") if isinstance(d, dict) else d) <= ENCODER_BYTES for d in docs or [])
    given = body.get("input") if body.get("input") is not None else body.get("content")
    many = isinstance(given, list) and not (
        all(isinstance(x, int | str) for x in given) and any(isinstance(x, int) for x in given)
    )
    return all(_size(e) <= ENCODER_BYTES for e in (given if many else [given]))


@schemathesis.hook
def filter_case(context, case) -> bool:
    body = case.body
    if ENCODER_BYTES and isinstance(body, dict) and _positive(case):
        return not _images(body) and _encoder_fits(str(case.path), body)
    if isinstance(body, dict) and _positive(case) and _constrained(body):
        return False
    if isinstance(body, dict) and _positive(case) and _too_long(str(case.path), body):
        return False
    if str(case.path).endswith(("/embedding", "/embeddings")) and isinstance(body, dict) and _positive(case):
        entries = [body.get("input"), body.get("content")]
        entries += [x for e in entries if isinstance(e, list) for x in e]
        if any(_size(e) == 0 for e in entries if e is not None):  # "", empty pieces or parts: no token
            return False
    if isinstance(body, dict) and _positive(case) and _images(body):
        return False  # images: a text model refuses them
    if str(case.path).startswith("/v1/responses") and isinstance(body, dict) and _positive(case):
        if _responses_refused(body):
            return False
    if str(case.path).startswith("/v1/messages") and isinstance(body, dict) and _positive(case):
        if _media(body) or (not body.get("messages") and not body.get("system")):
            return False  # media: text only; no turn at all: served where the template renders something
    chat = ("/v1/chat/completions", "/chat/completions", "/apply-template", "/v1/messages")  # the same message rules
    if not str(case.path).startswith(chat) or not isinstance(body, dict):
        return True
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return True
    roles = [m.get("role") for m in messages]
    if roles[-2:] == ["assistant", "assistant"]:
        return False
    return not (body.get("continue_final_message") is True and roles[-1] != "assistant")
