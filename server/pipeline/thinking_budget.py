"""A chat request's reasoning budget, as llama-server takes it: the request's
``reasoning_budget_tokens`` (or ``thinking_budget_tokens``; Anthropic's
``thinking.budget_tokens``), else ``--reasoning-budget``; the message forced before
the end tag, ``reasoning_budget_message``, else ``--reasoning-budget-message``. The
engine enforces it on ``<think>`` blocks (engine/sampling/reasoning_budget.py)."""

from __future__ import annotations

from engine import BudgetSpec
from server.pipeline.reasoning import END, START, opens_thinking


def budget_spec(state, engine, body, prompt: str) -> BudgetSpec | None:
    """None where thinking is free (a budget of -1, the default)."""
    tokens = next((t for t in (body.reasoning_budget_tokens, body.thinking_budget_tokens) if t is not None), -1)
    if tokens == -1:
        tokens = state.settings.reasoning_budget
    if tokens < 0:
        return None
    message = body.reasoning_budget_message
    message = state.settings.reasoning_budget_message if message is None else message
    encode = lambda text: tuple(engine.tokenizer.encode(text, False))  # noqa: E731 (the tags may be special tokens)
    end = encode(END)
    return BudgetSpec(tokens, encode(START), (end,), (encode(message) if message else ()) + end, opens_thinking(prompt))
