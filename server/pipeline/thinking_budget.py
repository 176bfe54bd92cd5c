"""A chat request's reasoning budget, as llama-server takes it: the request's
``reasoning_budget_tokens`` (or ``thinking_budget_tokens``; Anthropic's
``thinking.budget_tokens``), else ``--reasoning-budget``; the message forced before
the end tag, ``reasoning_budget_message``, else ``--reasoning-budget-message``. The
engine enforces it on the family's thoughts (engine/sampling/reasoning_budget.py)."""

from __future__ import annotations

from engine import BudgetSpec
from server.pipeline.reasoning import opens_thinking
from server.pipeline.thinking_syntax import THINK, Thinking


def budget_spec(state, engine, body, prompt: str, thinking: Thinking = THINK) -> BudgetSpec | None:
    """None where thinking is free (a budget of -1, the default); ``thinking``: the
    family's thought markers, which the budget counts between."""
    tokens = next((t for t in (body.reasoning_budget_tokens, body.thinking_budget_tokens) if t is not None), -1)
    if tokens == -1:
        tokens = state.settings.reasoning_budget
    if tokens < 0:
        return None
    message = body.reasoning_budget_message
    message = state.settings.reasoning_budget_message if message is None else message
    encode = lambda text: tuple(engine.tokenizer.encode(text, False))  # noqa: E731 (the tags may be special tokens)
    end = encode(thinking.end)
    opened = opens_thinking(prompt, thinking)
    return BudgetSpec(tokens, encode(thinking.start), (end,), (encode(message) if message else ()) + end, opened)
