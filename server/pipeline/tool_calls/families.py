"""Every tool-call family slotserve reads, in the order they are tried:
server/pipeline/template_family.py picks the first whose marks the template holds; a
template with none is ``hermes`` (templates that render no tools get Hermes'
instructions in a system turn of the server's own)."""

from __future__ import annotations

from server.pipeline.tool_calls import readers as r
from server.pipeline.tool_calls.grammar import NL, keyed, lit, named, objects
from server.pipeline.tool_calls.readers import MINIMAX3_SEP
from server.pipeline.tool_calls.syntax import (
    DS_CALL,
    DS_SECTION,
    GLM_PARAM,
    HERMES,
    HY,
    KIMI3_TYPES,
    XML_CALL,
    XML_PARAM,
    Syntax,
    invoke,
    invoke_grammar,
    xml_grammar,
)

FAMILIES: tuple[Syntax, ...] = (
    Syntax(
        "dsml-v4",
        ("｜DSML｜", "'tool_calls>"),
        (("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"), ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>")),
        invoke("｜DSML｜"),
        invoke_grammar("｜DSML｜", ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"), typed=True),
    ),
    Syntax(
        "dsml",
        ("｜DSML｜",),
        (("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"), ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>")),
        invoke("｜DSML｜"),
        invoke_grammar("｜DSML｜", ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"), typed=True),
    ),
    Syntax(
        "minimax-m2",
        ("<minimax:tool_call>",),
        (("<minimax:tool_call>", "</minimax:tool_call>"),),
        invoke(""),
        invoke_grammar("", ("<minimax:tool_call>", "</minimax:tool_call>")),
    ),
    Syntax(
        "minimax-m3",
        (MINIMAX3_SEP,),
        ((MINIMAX3_SEP + "<tool_call>", MINIMAX3_SEP + "</tool_call>"),),
        r.minimax3,
        keyed(
            lambda n: f'\n{MINIMAX3_SEP}<invoke name="{n}">',
            f"{MINIMAX3_SEP}</invoke>\n",
            lambda key, _: f"{MINIMAX3_SEP}<{key}>",
            lambda key: f"{MINIMAX3_SEP}</{key}>",
            section=(MINIMAX3_SEP + "<tool_call>", MINIMAX3_SEP + "</tool_call>"),
        ),
    ),
    Syntax(
        "muse",
        ("<atem:function_calls>",),
        ((" to=", "</atem:function_calls>"), ("<atem:function_calls>", "</atem:function_calls>")),
        r.after("<atem:function_calls>", invoke("atem:")),
        keyed(
            lambda n: f' to={n}<|message|><atem:function_calls>\n<atem:invoke name="{n}">\n',
            "</atem:invoke>\n</atem:function_calls>",
            lambda key, _: f'<atem:parameter name="{key}">',
            "</atem:parameter>\n",
            joiner="<|eom|><|start|>assistant",
        ),
    ),
    Syntax(
        "seed",
        ("<seed:tool_call>",),
        (("<seed:tool_call>", "</seed:tool_call>"),),
        r.keyed(XML_CALL, XML_PARAM),
        xml_grammar(("<seed:tool_call>\n", "</seed:tool_call>"), newlines=False),
    ),
    Syntax(
        "hunyuan",
        (HY, "toolcalls_begin_token"),
        ((f"<tool_calls{HY}>", f"</tool_calls{HY}>"),),
        r.keyed(
            f"<tool_call{HY}>(?P<name>[^<]+)<tool_sep{HY}>(?P<body>.*?)</tool_call{HY}>",
            f"<arg_key{HY}>(?P<key>.*?)</arg_key{HY}>\\s*<arg_value{HY}>(?P<value>.*?)</arg_value{HY}>\\s*",
        ),
        keyed(
            lambda n: f"<tool_call{HY}>{n}<tool_sep{HY}>\n",
            f"</tool_call{HY}>\n",
            lambda key, _: f"<arg_key{HY}>{key}</arg_key{HY}>\n<arg_value{HY}>",
            f"</arg_value{HY}>\n",
            section=(f"<tool_calls{HY}>\n", f"</tool_calls{HY}>"),
        ),
    ),
    Syntax(
        "kimi-k2",
        ("<|tool_calls_section_begin|>",),
        (("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),),
        r.named_json(
            r"<\|tool_call_begin\|>(?P<head>.*?)<\|tool_call_argument_begin\|>(?P<args>.*?)<\|tool_call_end\|>",
            lambda head: head.strip().removeprefix("functions.").rsplit(":", 1)[0],
        ),
        named(
            lambda n: (
                f"{lit('<|tool_call_begin|>functions.' + n + ':')} /[0-9]+/ {lit('<|tool_call_argument_begin|>')}"
            ),
            "<|tool_call_end|>",
            section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        ),
    ),
    Syntax(
        "kimi-k3",
        ("Kimi K3 tool call",),
        (("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),),
        r.keyed(
            r'<\|open\|>call tool="(?P<name>[^"]+)"[^<]*<\|sep\|>(?P<body>.*?)<\|close\|>call<\|sep\|>',
            r'<\|open\|>argument key="(?P<key>[^"]+)" type="(?P<string>[^"]+)"<\|sep\|>'
            r"(?P<value>.*?)<\|close\|>argument<\|sep\|>",
        ),
        keyed(
            lambda n: f'<|open|>call tool="{n}" index="1"<|sep|>',
            "<|close|>call<|sep|>",
            lambda key, s: (
                f'<|open|>argument key="{key}" type="{KIMI3_TYPES.get(s.get("type"), s.get("type", "string"))}"<|sep|>'
            ),
            "<|close|>argument<|sep|>",
            section=("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
        ),
    ),
    Syntax(
        "deepseek-r1",
        (DS_SECTION[0], "```json"),
        (DS_SECTION,),
        r.named_json(DS_CALL),
        named(
            lambda n: lit(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n"),
            "\n```<｜tool▁call▁end｜>",
            section=DS_SECTION,
            joiner="\n",
        ),
    ),
    Syntax(
        "deepseek",
        (DS_SECTION[0],),
        (DS_SECTION,),
        r.named_json(DS_CALL),
        named(lambda n: lit(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>"), "<｜tool▁call▁end｜>", section=DS_SECTION),
    ),
    Syntax(
        "solar",
        ("<|tool_call:begin|>",),
        (("<|tool_calls|>", "<|calls|>"),),
        r.named_json(
            r"<\|tool_call:begin\|>(?P<id>.*?)<\|tool_call:name\|>(?P<head>.*?)<\|tool_call:args\|>(?P<args>.*?)<\|tool_call:end\|>"
        ),
        named(
            lambda n: f'"<|tool_call:begin|>" /[A-Za-z0-9_]+/ {lit("<|tool_call:name|>" + n + "<|tool_call:args|>")}',
            "<|tool_call:end|>",
            section=("<|tool_calls|>", "<|calls|>"),
        ),
    ),
    Syntax(
        "lfm2",
        ("<|tool_call_start|>",),
        (("<|tool_call_start|>", "<|tool_call_end|>"),),
        r.pythonic,
        keyed(
            lambda n: f"{n}(",
            ")",
            lambda key, _: f"{key}=",
            "",
            section=("<|tool_call_start|>[", "]<|tool_call_end|>"),
            joiner=", ",
            between=", ",
            quotes="'",
        ),
    ),
    Syntax(
        "gemma4",
        ("<|tool_call>", "<tool_call|>"),
        (("<|tool_call>", "<tool_call|>"),),
        r.gemma4,
        keyed(
            lambda n: f"<|tool_call>call:{n}{{",
            "}<tool_call|>",
            lambda key, _: f"{key}:",
            "",
            between=",",
            quotes='<|"|>',
        ),
    ),
    Syntax(
        "apertus",
        ("<|tools_prefix|>",),
        (("<|tools_prefix|>", "<|tools_suffix|>"),),
        r.json_calls,
        objects("<|tools_prefix|>", "<|tools_suffix|>", mode="list", args_key=None),
    ),
    Syntax(
        "command-r7b",
        ("<|START_ACTION|>",),
        (("<|START_ACTION|>", "<|END_ACTION|>"),),
        r.json_calls,
        objects(
            "<|START_ACTION|>",
            "<|END_ACTION|>",
            mode="list",
            name_key="tool_name",
            args_key="parameters",
            before={"tool_call_id": {"type": "string", "pattern": "^[0-9]+$"}},
            listing=("[\n    ", ",\n    ", "\n]"),
        ),
    ),
    Syntax(
        "command-r",
        ("Action:", "```json"),
        (("Action:", None),),
        r.json_calls,
        objects("Action:\n```json\n", "```", mode="list", name_key="tool_name", args_key="parameters"),
    ),
    Syntax(
        "nemotron-v2",
        ("<TOOLCALL>",),
        (("<TOOLCALL>", "</TOOLCALL>"),),
        r.json_calls,
        objects("<TOOLCALL>", "</TOOLCALL>", mode="list"),
    ),
    Syntax(
        "minimax-m1",
        ("<tool_calls>", "<beginning_of_sentence>"),
        (("<tool_calls>", "</tool_calls>"),),
        r.json_calls,
        objects("<tool_calls>\n", "\n</tool_calls>", mode="lines"),
    ),
    Syntax(
        "apriel",
        ("<tool_calls>",),
        (("<tool_calls>", "</tool_calls>"),),
        r.json_calls,
        objects("<tool_calls>", "</tool_calls>", mode="list"),
    ),
    Syntax(
        "gigachat3.1",
        ("<|function_call|>",),
        (("<|function_call|>", None),),
        r.json_calls,
        objects("<|function_call|>", "", mode="one"),
    ),
    Syntax(
        "gigachat3",
        ("'role': 'function call'",),
        (("function call<|role_sep|>", None),),
        r.json_calls,
        objects("function call<|role_sep|>\n", "", mode="one"),
    ),
    Syntax(
        "gpt-oss",
        ("<|channel|>",),
        (("<|channel|>commentary to=functions.", None), (" to=functions.", None), ("to=functions.", None)),
        r.gpt_oss,
        named(lambda n: lit(f" to=functions.{n}<|channel|>commentary json<|message|>"), "<|call|>"),
    ),
    Syntax(
        "minicpm5",
        ("<function name=", "<param name="),
        (('<function name="', "</function>"),),
        r.keyed(
            r'<function name="(?P<name>[^"]+)">(?P<body>.*?)</function>',
            r'<param name="(?P<key>[^"]+)">(?P<value>.*?)</param>',
        ),
        keyed(
            lambda n: f'<function name="{n}">',
            "</function>",
            lambda key, _: f'<param name="{key}">',
            "</param>",
            joiner="\n",
        ),
        whole=True,
    ),
    Syntax(
        "xml",
        ("<function=", "<parameter=", HERMES[0]),
        (HERMES,),
        r.keyed(XML_CALL, XML_PARAM),
        xml_grammar((HERMES[0] + "\n", HERMES[1])),
    ),
    Syntax(
        "glm",
        ("<arg_key>", "<arg_value>", HERMES[0]),
        (HERMES,),
        r.keyed(r.glm_call, GLM_PARAM),
        keyed(
            lambda n: f"{n}{NL}",
            "",
            lambda key, _: f"<arg_key>{key}</arg_key>{NL}<arg_value>",
            f"</arg_value>{NL}",
            section=HERMES,
            joiner="\n",
        ),
    ),
    Syntax(
        "functionary-v3.1",
        ("<function=", "<|start_header_id|>"),
        (("<function=", "</function>"),),
        r.named_json(r"<function=(?P<head>[^>]+)>(?P<args>.*?)</function>"),
        named(lambda n: lit(f"<function={n}>"), "</function>"),
        whole=True,
    ),
    Syntax(
        "functionary-v3.2",
        (">>>", "<|start_header_id|>"),
        (("", None),),  # the prompt ends with ">>>": the answer begins with a recipient
        r.functionary32,
        named(lambda n: lit(f"{n}\n"), "", joiner=">>>"),
        whole=True,
        first=True,
    ),
    Syntax(
        "firefunction",
        ("functools",),
        (("functools", None),),
        r.json_calls,
        objects(" functools", "", mode="list"),
    ),
    Syntax(
        "granite",
        ("<|tool_call|>",),
        (("<|tool_call|>", None),),
        r.json_calls,
        objects("<|tool_call|>", "", mode="list"),
    ),
    Syntax(
        "mistral",
        ("[TOOL_CALLS]", "[ARGS]"),
        (("[TOOL_CALLS]", None),),
        r.mistral,
        named(lambda n: f'{lit("[TOOL_CALLS]" + n)} ("[CALL_ID]" /[a-zA-Z0-9]{{9}}/)? "[ARGS]"', ""),
    ),
    Syntax(
        "mistral-list",
        ("[TOOL_CALLS]",),
        (("[TOOL_CALLS]", None),),
        r.mistral,
        objects("[TOOL_CALLS]", "", mode="list", after={"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}),
    ),
    Syntax(
        "llama3",
        ("<|start_header_id|>",),
        (("<|python_tag|>", None), ("{", None)),
        r.json_calls,
        objects("", "", mode="one", args_key="parameters"),
        first=True,
        keep=("{",),
    ),
    Syntax("hermes", (), (HERMES,), r.json_calls, objects(HERMES[0] + "\n", "\n" + HERMES[1])),
)
BY_NAME = {s.name: s for s in FAMILIES}
