"""How each template family writes a thought: the markers that open and close it, and
the markers around the answer that are the format's, not the answer's (dropped from
``content`` when the reasoning is split). ``thinking_family(source)`` picks the first
whose marks the chat template holds; else DeepSeek's and Qwen's ``<think>``."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Thinking:
    name: str
    marks: tuple[str, ...]  # all in the template source: this family
    start: str
    end: str
    drop: tuple[str, ...] = ()  # the format's markers around the answer
    repeats: bool = False  # a thought may open again after the answer began (harmony's messages)


THINK = Thinking("think", (), "<think>", "</think>")
FAMILIES: tuple[Thinking, ...] = (
    # harmony: every analysis message is a thought; a commentary message without a
    # recipient is a preamble the user sees (content, its markers dropped)
    Thinking(
        "gpt-oss",
        ("<|channel|>",),
        "<|channel|>analysis<|message|>",
        "<|end|>",
        (
            "<|start|>assistant",
            "<|channel|>final<|message|>",
            "<|channel|>commentary<|message|>",
            "<|return|>",
            "<|end|>",
        ),
        repeats=True,
    ),
    Thinking(
        "muse",
        ("<atem:function_calls>",),
        "to=self<|message|>",
        "<|eom|>",
        ("<|start|>assistant to=user<|message|>", "<|start|>assistant", " to=user<|message|>", "<|eot|>"),
    ),
    Thinking("seed", ("<seed:think>",), "<seed:think>", "</seed:think>"),
    Thinking(
        "command-r7b",
        ("<|START_THINKING|>",),
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
    ),
    Thinking(
        "kimi-k3",
        ("Kimi K3 tool call",),
        "<|open|>think<|sep|>",
        "<|close|>think<|sep|>",
        ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
    ),
    Thinking("minimax-m3", ("<mm:think>",), "<mm:think>", "</mm:think>"),
    Thinking("hunyuan", (":opensource", "think"), "<think:opensource>", "</think:opensource>"),
    Thinking("gemma4", ("<|channel>", "<channel|>"), "<|channel>thought", "<channel|>"),
    Thinking("solar", ("<|think|>", "<|content|>"), "<|think|>", "<|end|>", ("<|begin|>assistant", "<|content|>")),
    Thinking("apertus", ("<|inner_prefix|>",), "<|inner_prefix|>", "<|inner_suffix|>"),
    Thinking("mistral", ("[THINK]",), "[THINK]", "[/THINK]"),
    Thinking(
        "apriel",
        ("[BEGIN FINAL RESPONSE]",),
        "Here are my reasoning steps:\n",
        "[BEGIN FINAL RESPONSE]",
        ("[END FINAL RESPONSE]", "<|end|>"),
    ),
    Thinking(
        "granite", ("<|start_of_role|>", "<response>", "<think>"), "<think>", "</think>", ("<response>", "</response>")
    ),
    THINK,
)
BY_NAME = {t.name: t for t in FAMILIES}


@functools.lru_cache(maxsize=16)  # once per template, not per request
def thinking_family(source: str | None) -> Thinking:
    """The thought syntax of a chat template's source (``<think>`` when none other)."""
    return next((t for t in FAMILIES if source and t.marks and all(m in source for m in t.marks)), THINK)
