"""How each template family writes a thought: the markers that open and close it, and
the markers around the answer that are the format's, not the answer's (dropped from
``content`` when the reasoning is split). Listed by tool-call family (``BY_FAMILY``):
server/pipeline/template_family.py finds a template's family once, and with it both
syntaxes; a family without its own writes DeepSeek's and Qwen's ``<think>``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thinking:
    name: str
    marks: tuple[str, ...]  # all in the template source: this family
    start: str
    end: str
    drop: tuple[str, ...] = ()  # the format's markers around the answer
    repeats: bool = False  # a thought may open again after the answer began (harmony's messages)


THINK = Thinking("think", (), "<think>", "</think>")  # DeepSeek's and Qwen's, and any family's without its own
# harmony: every analysis message is a thought; a commentary message without a
# recipient is a preamble the user sees (content, its markers dropped)
GPT_OSS = Thinking(
    "gpt-oss",
    ("<|channel|>",),
    "<|channel|>analysis<|message|>",
    "<|end|>",
    ("<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>", "<|return|>", "<|end|>"),
    repeats=True,
)
MUSE = Thinking(
    "muse",
    ("<atem:function_calls>",),
    "to=self<|message|>",
    "<|eom|>",
    ("<|start|>assistant to=user<|message|>", "<|start|>assistant", " to=user<|message|>", "<|eot|>"),
)
COMMAND_R7B = Thinking(
    "command-r7b",
    ("<|START_THINKING|>",),
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
)
KIMI_K3 = Thinking(
    "kimi-k3",
    ("Kimi K3 tool call",),
    "<|open|>think<|sep|>",
    "<|close|>think<|sep|>",
    ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
)
APRIEL = Thinking(
    "apriel",
    ("[BEGIN FINAL RESPONSE]",),
    "Here are my reasoning steps:\n",
    "[BEGIN FINAL RESPONSE]",
    ("[END FINAL RESPONSE]", "<|end|>"),
)
GRANITE = Thinking(
    "granite", ("<|start_of_role|>", "<response>", "<think>"), "<think>", "</think>", ("<response>", "</response>")
)
# by tool-call family (server/pipeline/tool_calls/families.py): the thought syntaxes its
# templates write, the first whose marks the template holds; none of them: THINK
BY_FAMILY: dict[str, tuple[Thinking, ...]] = {
    "gpt-oss": (GPT_OSS,),
    "muse": (MUSE,),
    "seed": (Thinking("seed", ("<seed:think>",), "<seed:think>", "</seed:think>"),),
    "command-r7b": (COMMAND_R7B,),
    "kimi-k3": (KIMI_K3,),
    "minimax-m3": (Thinking("minimax-m3", ("<mm:think>",), "<mm:think>", "</mm:think>"),),
    "hunyuan": (Thinking("hunyuan", (":opensource", "think"), "<think:opensource>", "</think:opensource>"),),
    "gemma4": (Thinking("gemma4", ("<|channel>", "<channel|>"), "<|channel>thought", "<channel|>"),),
    "solar": (
        Thinking("solar", ("<|think|>", "<|content|>"), "<|think|>", "<|end|>", ("<|begin|>assistant", "<|content|>")),
    ),
    "apertus": (Thinking("apertus", ("<|inner_prefix|>",), "<|inner_prefix|>", "<|inner_suffix|>"),),
    "mistral": (Thinking("mistral", ("[THINK]",), "[THINK]", "[/THINK]"),),
    "apriel": (APRIEL,),
    "granite": (GRANITE,),
}
BY_NAME = {t.name: t for t in [*(t for ts in BY_FAMILY.values() for t in ts), THINK]}
