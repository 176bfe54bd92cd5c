"""Hooks for the schemathesis run of tests/test_openapi.py.

A chat request is refused (400) for rules that count messages from the end, which a
JSON schema cannot state: two assistant messages at the end, or
``continue_final_message`` without a final assistant message. The document says so in
words (ChatCompletionRequest's description); these hooks keep the generator from
proposing such requests as schema-valid ones. Everything else is checked as before.
"""

from __future__ import annotations

import schemathesis


@schemathesis.hook
def filter_case(context, case) -> bool:
    body = case.body
    if not str(case.path).startswith(("/v1/chat/completions", "/chat/completions")) or not isinstance(body, dict):
        return True
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return True
    roles = [m.get("role") for m in messages]
    if roles[-2:] == ["assistant", "assistant"]:
        return False
    return not (body.get("continue_final_message") is True and roles[-1] != "assistant")
