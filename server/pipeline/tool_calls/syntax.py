"""A tool-call syntax (``Syntax``): how a chat template shows it is that family, the
markers its calls are written between, the reader of what is between them, and the
grammar that forces a call; and the pieces several families share (the ``<invoke>``
and ``<function=...>`` shapes, DeepSeek's markers). The families: families.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.pipeline.tool_calls import readers as r
from server.pipeline.tool_calls.grammar import Build, keyed
from server.pipeline.tool_calls.readers import Reader


@dataclass(frozen=True)
class Syntax:
    """``pairs``: (opening, closing) markers; a closing None runs to the answer's end.
    ``whole``: the reader gets the markers with the text; ``first``: a call only where
    the answer begins (Llama 3's bare JSON); ``keep``: openings that are the call's own
    first characters."""

    name: str
    marks: tuple[str, ...]  # all in the template source: this family
    pairs: tuple[tuple[str, str | None], ...]
    read: Reader
    grammar: Build
    whole: bool = False
    first: bool = False
    keep: tuple[str, ...] = field(default_factory=tuple)

    def region(self, opening: str, body: str, closing: str) -> str:
        if self.whole:
            return opening + body + closing
        return opening + body if opening in self.keep else body


HERMES = ("<tool_call>", "</tool_call>")


def invoke(prefix: str) -> Reader:
    """MiniMax M2, DeepSeek V3.2/V4 (DSML), Muse: ``<invoke name=...>`` with
    ``<parameter name=...>`` elements (DSML says ``string="true|false"``)."""
    return r.keyed(
        rf'<{prefix}invoke name="(?P<name>[^"]+)">(?P<body>.*?)</{prefix}invoke>',
        rf'<{prefix}parameter name="(?P<key>[^"]+)"(?: string="(?P<string>true|false)")?>'
        rf"(?P<value>.*?)</{prefix}parameter>",
    )


def invoke_grammar(prefix: str, section: tuple[str, str], typed: bool = False) -> Build:
    def opening(key: str, schema: dict) -> str:
        said = f' string="{str(schema.get("type") == "string").lower()}"' if typed else ""
        return f'<{prefix}parameter name="{key}"{said}>'

    return keyed(
        lambda n: f'<{prefix}invoke name="{n}">\n',
        f"</{prefix}invoke>\n",
        opening,
        f"</{prefix}parameter>\n",
        section=(section[0] + "\n", section[1]),
    )


XML_CALL = r"<function=(?P<name>[^>\n]+)>\n?(?P<body>.*?)</function>"
XML_PARAM = r"<parameter=(?P<key>[^>\n]+)>\n?(?P<value>.*?)\n?</parameter>\n?"
GLM_PARAM = r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>\s*"
HY = ":opensource"
DS_CALL = "<｜tool▁call▁begin｜>(?P<head>.*?)<｜tool▁sep｜>(?P<args>.*?)<｜tool▁call▁end｜>"
DS_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
KIMI3_TYPES = {"integer": "number"}


def xml_grammar(section: tuple[str, str], newlines: bool = True) -> Build:
    n = "\n" if newlines else ""
    return keyed(
        lambda name: f"<function={name}>\n",
        "</function>\n",
        lambda key, _: f"<parameter={key}>{n}",
        f"{n}</parameter>\n",
        section=section,
        joiner="\n",
    )
