"""Every real chat template of llama.cpp's ``models/templates/`` (copied from model
repositories; the pinned sdist's) renders here as transformers renders it: the same
text, or both refuse. Conversations: plain, system, multi-turn, multi-part content,
tool definitions, a tool call and its result, and thinking with ``enable_thinking`` on
and off — given to both as transformers takes them (issue 51, item 1: transformers'
template environment; the routes' shaping of messages is item 2's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_tools import TEMPLATES, converter_tree
from transformers.utils.chat_template_utils import render_jinja_template

from engine.text.chat_template import ChatTemplate, ChatTemplateError

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "its name"}},
            "required": ["city"],
        },
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS = {
    "plain": ([{"role": "user", "content": "Hello there"}], None, {}),
    "system": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, {}),
    "turns": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a colour."},
        ],
        None,
        {},
    ),
    "parts": (
        [{"role": "user", "content": [{"type": "text", "text": " A reminder. "}, {"type": "text", "text": "Hi"}]}],
        None,
        {},
    ),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER], {}),
    "call": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C, sunny"},
        ],
        [WEATHER],
        {},
    ),
    "thinking": (
        [
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        None,
        {"enable_thinking": True},
    ),
    "no-thinking": ([{"role": "user", "content": "2 + 2?"}], None, {"enable_thinking": False}),
    "kept-thinking": (  # earlier turns' thoughts kept (GLM 4.7's clear_thinking, Hunyuan's, LFM2.5's ...)
        [
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "Three and three make six."},
            {"role": "user", "content": "And 4 + 4?"},
        ],
        None,
        {"enable_thinking": True, "clear_thinking": False, "preserve_thinking": True, "preserved_thinking": True},
    ),
}


def function_tool(name: str, properties: dict) -> dict:
    """An OpenAI function tool whose every parameter is required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


def corpus() -> dict[str, str]:
    folder = converter_tree() / TEMPLATES
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}


def outcome(render) -> tuple[str, str]:
    """("text", the prompt) or ("refused", why)."""
    try:
        return "text", render()
    except Exception as exc:  # noqa: BLE001 - transformers raises several types; ours ChatTemplateError
        return "refused", f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def templates() -> dict[str, str]:
    return corpus()


def test_the_corpus_is_there(templates):
    assert len(templates) >= 60, sorted(templates)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_every_template_renders_as_transformers_does(templates, conversation):
    messages, tools, kwargs = CONVERSATIONS[conversation]
    differ, both_refuse = {}, []
    for name, source in templates.items():
        theirs = outcome(
            lambda source=source: render_jinja_template(
                [messages], tools=tools, chat_template=source, add_generation_prompt=True, **SPECIAL, **kwargs
            )[0][0]
        )
        ours = outcome(lambda source=source: ChatTemplate(source, SPECIAL).render(messages, True, tools, **kwargs))
        if theirs[0] == ours[0] == "refused":
            both_refuse.append(name)
        elif theirs != ours:
            differ[name] = (theirs, ours)
    assert not differ, {k: (a[0], b[0], b[1][:300] if b[0] == "refused" else "") for k, (a, b) in differ.items()}


def test_a_template_that_raises_is_a_template_error():
    """Whatever the template's code raises (here a type error) is ChatTemplateError,
    which the routes answer with a 400."""
    template = ChatTemplate("{{ messages[0].content + 1 }}", SPECIAL)
    with pytest.raises(ChatTemplateError, match="TypeError"):
        template.render([{"role": "user", "content": "a"}])


def _smolvlm_template() -> str:
    """SmolVLM-256M-Instruct's own template (its chat_template.json), which iterates each
    message's content as parts (transformers 5's built-in copy also takes a string)."""
    return (Path(__file__).parent / "data" / "smolvlm_chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def smolvlm_server(tmp_path_factory):
    """The demo model with SmolVLM's real template (it iterates each message's parts)."""
    from server_proc import InProcessServer

    path = tmp_path_factory.mktemp("template") / "smolvlm.jinja"
    path.write_text(_smolvlm_template(), encoding="utf-8")
    with InProcessServer(chat_template_file=path) as srv:
        yield srv


def test_a_template_that_takes_parts_gets_the_users_text(smolvlm_server):
    """SmolVLM's template iterates ``message['content']``: a string's text was dropped
    (``User: <end_of_utterance>``). Given as a text part, the prompt is transformers'."""
    import httpx

    messages = [{"role": "user", "content": "Describe the sea."}]
    r = httpx.post(smolvlm_server.url + "/apply-template", json={"messages": messages})
    typed = [{"role": "user", "content": [{"type": "text", "text": "Describe the sea."}]}]
    want = render_jinja_template([typed], chat_template=_smolvlm_template(), add_generation_prompt=True)[0][0]
    assert r.status_code == 200 and r.json()["prompt"] == want and "Describe the sea." in want


def test_an_anthropic_clients_text_blocks_keep_their_boundaries(smolvlm_server):
    """Two text blocks (a client's reminder, then the user's text) reach a template that
    takes parts as two parts, through the Anthropic route as through the chat route."""
    import httpx

    blocks = [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Hi"}]
    typed = [{"role": "user", "content": [{"type": "text", "text": b["text"]} for b in blocks]}]
    want = render_jinja_template([typed], chat_template=_smolvlm_template(), add_generation_prompt=True)[0][0]
    r = httpx.post(smolvlm_server.url + "/apply-template", json={"messages": [{"role": "user", "content": blocks}]})
    assert r.status_code == 200 and r.json()["prompt"] == want
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]}
    counted = httpx.post(smolvlm_server.url + "/v1/messages/count_tokens", json=body)
    ids = httpx.post(smolvlm_server.url + "/tokenize", json={"content": want}).json()["tokens"]
    assert counted.status_code == 200 and counted.json()["input_tokens"] == len(ids)


@pytest.mark.parametrize("shape", ["parts", "string"])
def test_every_template_gets_content_in_the_form_it_takes(templates, shape):
    """The chat route's shaping (server/pipeline/chat_prompt.py) for every template of
    the corpus: a multi-part user turn, or a string one, gives transformers' prompt for
    the form the template takes — parts where it iterates them (or takes nothing else),
    the string (parts joined) where it prints the content whole."""
    import asyncio
    from types import SimpleNamespace

    from server.pipeline.chat_prompt import render_chat
    from server.schemas.requests import ChatCompletionRequest

    parts = [{"type": "text", "text": " A reminder. "}, {"type": "text", "text": "Hi"}]
    content = parts if shape == "parts" else "A reminder. Hi"
    body = ChatCompletionRequest(messages=[{"role": "user", "content": content}])
    differ = {}
    for name, source in templates.items():
        template = ChatTemplate(source, SPECIAL)
        strings, typed = template.content_forms
        if not (strings or typed):
            continue  # refuses a lone user turn (both sides do: the plain case above)
        tok = SimpleNamespace(chat_template=template, adds_bos=False, bos_token="<s>")
        engine = SimpleNamespace(tokenizer=tok)
        ours = outcome(lambda engine=engine: asyncio.run(render_chat(engine, body)))
        if shape == "parts":
            given = parts if typed else "".join(p["text"] for p in parts)
        else:
            given = content if strings else [{"type": "text", "text": content}]
        theirs = outcome(
            lambda source=source, given=given: render_jinja_template(
                [[{"role": "user", "content": given}]], chat_template=source, add_generation_prompt=True, **SPECIAL
            )[0][0]
        )
        if theirs != ours and not (theirs[0] == ours[0] == "refused"):
            differ[name] = (theirs[1][:200], ours[1][:200])
    assert not differ, differ


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_the_chat_route_gives_every_template_transformers_prompt(templates, conversation):
    """The chat route's whole shaping (server/pipeline/chat_prompt.py: a client's body,
    tool-call arguments as the JSON string OpenAI clients send, reasoning, tools, the
    template variables) gives, for every template of the corpus, transformers' prompt
    for the same conversation, or both refuse. Templates that render no tools are left
    out of the tool conversations: the server describes the tools in a system turn of
    its own there, so that any chat model can be offered them."""
    import asyncio
    import copy
    import json
    from types import SimpleNamespace

    from server.pipeline.chat_prompt import render_chat
    from server.schemas.requests import ChatCompletionRequest

    messages, tools, kwargs = CONVERSATIONS[conversation]
    sent = copy.deepcopy(messages)
    for m in sent:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    body = ChatCompletionRequest(messages=sent, tools=tools, chat_template_kwargs=kwargs or None)
    differ = {}
    for name, source in templates.items():
        template = ChatTemplate(source, SPECIAL)
        strings, typed = template.content_forms
        if conversation != "parts" and not strings:
            continue  # a template that takes parts only: the shape test above
        if tools and not template.takes_tools:
            continue  # renders no tools: the server offers them in a system turn of its own (a decision)
        tok = SimpleNamespace(chat_template=template, adds_bos=False, bos_token="<s>")
        ours = outcome(lambda tok=tok: asyncio.run(render_chat(SimpleNamespace(tokenizer=tok), body)))
        given = messages
        if conversation == "parts" and not typed:
            given = [{"role": "user", "content": "".join(p["text"] for p in messages[0]["content"])}]
        theirs = outcome(
            lambda source=source, given=given: render_jinja_template(
                [given], tools=tools, chat_template=source, add_generation_prompt=True, **SPECIAL, **kwargs
            )[0][0]
        )
        if theirs != ours and not (theirs[0] == ours[0] == "refused"):
            differ[name] = (theirs[1][-300:], ours[1][-300:])
    assert not differ, differ


PLAN = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plan a trip",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "where"},
                "days": {"type": "integer", "description": "how long"},
                "budget": {"type": "number", "description": "how much"},
                "hotel": {"type": "boolean", "description": "whether"},
                "sights": {"type": "array", "items": {"type": "string"}, "description": "what"},
                "note": {"type": "string", "description": "anything"},
            },
        },
    },
}
TRIPS = [
    {"city": "Paris", "days": 3, "budget": 1200.5, "hotel": True, "sights": ["Louvre", "Orsay"], "note": "2 + 2"},
    {"city": "Lyon", "days": 1, "budget": 300, "hotel": False, "sights": [], "note": "line one\nline two"},
]
# Command R+ writes no end of turn after its calls: the model's own end of answer is where the next turn begins.
NEXT_TURN = "\n<|START_OF_TURN_TOKEN|>"
# Templates that render no past calls (or none without variables of their own): nothing to read back.
NO_CALLS = {"granite", "firefunction"}


def written_answer(source: str, tool: dict, trips: list[dict]) -> tuple[str, list[dict]] | None:
    """The assistant's answer with calls of ``tool`` as the template writes it — the
    whole rendering less the generation prompt and the turn's end — and the calls it
    shows (templates that take one call a turn show the first). None when the template
    renders no calls (ids of Mistral's 9 characters and arguments as JSON text tried)."""
    user = {"role": "user", "content": "Plan two trips."}

    def render(messages, prompt=False):
        return render_jinja_template(
            [messages], tools=[tool], chat_template=source, add_generation_prompt=prompt, **SPECIAL
        )[0][0]

    name = tool["function"]["name"]
    for call_id in ("call_{}", "abcdefgh{}"):
        for as_text in (False, True):
            for n in (len(trips), 1):
                calls = [
                    {"id": call_id.format(k), "type": "function", "function": {"name": name, "arguments": a}}
                    for k, a in enumerate(json.dumps(t) if as_text else t for t in trips[:n])
                ]
                try:
                    full = render([user, {"role": "assistant", "content": "", "tool_calls": calls}])
                    prompt = render([user], prompt=True)
                    plain = render([user, {"role": "assistant", "content": "XYZZY"}])
                except Exception:  # noqa: BLE001 - the template refuses this shape: try the next
                    continue
                text = full[len(prompt) :] if full.startswith(prompt) else full.split("Plan two trips.", 1)[-1]
                end = plain[plain.rindex("XYZZY") + 5 :]
                text = text[: len(text) - len(end)] if end.strip() and text.endswith(end) else text
                text = text.split(NEXT_TURN)[0] if "Action:" in text else text
                shown = [t for t in trips[:n] if t["city"] in text]
                return (text, shown) if shown else None
    return None


def test_calls_a_template_renders_parse_back_to_the_same_calls(templates):
    """The oracle that needs no model: an assistant turn with two calls (arguments of
    every JSON type), rendered by each corpus template, parses back — with the family
    slotserve finds in the template — to the same calls, whole and streamed a character
    at a time, and no part of a call is left in the content. Every family of the
    corpus whose templates render past calls is read (families.FAMILIES)."""
    from server.pipeline.template_family import template_family
    from server.pipeline.tool_calls import FAMILIES, ToolCallStream, parse

    read, wrong = {}, {}
    for name, source in templates.items():
        fmt = template_family(source).name
        written = written_answer(source, PLAN, TRIPS)
        if written is None:
            continue
        text, shown = written
        content, whole = parse(fmt, text, [PLAN])
        stream = ToolCallStream(fmt, [PLAN])
        pieces = [p for ch in text for p in stream.push(ch)] + stream.flush()
        streamed = [[c.name, json.loads(c.arguments)] for c in pieces if not isinstance(c, str)]
        got = [[c.name, json.loads(c.arguments)] for c in whole]
        leaked = [t["city"] for t in shown if t["city"] in content]
        if got != [["plan_trip", t] for t in shown] or streamed != got or leaked:
            wrong[name] = (fmt, got, content[:200])
        read.setdefault(fmt, []).append(name)
    assert not wrong, wrong
    assert set(read) == {s.name for s in FAMILIES} - NO_CALLS, sorted(read)


def test_a_call_the_family_cannot_read_is_content():
    """A malformed call (broken JSON, an unclosed envelope) comes back as the text the
    model wrote, never as an error or a call; text before and after a call stays."""
    from server.pipeline.tool_calls import parse

    broken = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": <｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert parse("deepseek", broken) == (broken, [])
    unclosed = "Sure. <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
    assert parse("xml", unclosed) == (unclosed, [])
    kimi = '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>'
    answer = f"Let me look.<|tool_calls_section_begin|>{kimi}<|tool_calls_section_end|>Done."
    content, (call,) = parse("kimi-k2", answer)
    assert (content, call.name, json.loads(call.arguments)) == ("Let me look.Done.", "f", {"a": 1})


def test_a_qwen3_coder_template_gets_calls_in_its_own_syntax(templates, tmp_path):
    """The demo model under Qwen3-Coder's template, ``tool_choice: required``: the call is
    forced in the template's XML syntax and comes back as OpenAI ``tool_calls`` with
    each argument of its schema's type, whole and streamed; through the Anthropic route
    as a ``tool_use`` block, whole and as ``input_json_delta`` events."""
    import httpx
    from server_proc import InProcessServer

    path = tmp_path / "qwen3-coder.jinja"
    path.write_text(templates["Qwen3-Coder"], encoding="utf-8")
    unit = {"type": "string", "enum": ["celsius", "fahrenheit"]}
    tool = function_tool("forecast", {"unit": unit, "days": {"type": "integer", "minimum": 1, "maximum": 9}})
    body = {"messages": [{"role": "user", "content": "Forecast?"}], "tools": [tool], "tool_choice": "required"}
    body |= {"max_tokens": 60, "temperature": 0}
    with InProcessServer(chat_template_file=path) as srv:
        whole = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120).json()
        (call,) = whole["choices"][0]["message"]["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "forecast" and whole["choices"][0]["finish_reason"] == "tool_calls"
        assert args["unit"] in ("celsius", "fahrenheit") and isinstance(args["days"], int) and 1 <= args["days"] <= 9
        deltas = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    deltas += json.loads(line[6:])["choices"][0]["delta"].get("tool_calls") or []
        assert [json.loads(d["function"]["arguments"]) for d in deltas] == [args]
        anthropic = {"model": "m", "max_tokens": 60, "temperature": 0, "messages": body["messages"]}
        anthropic["tool_choice"] = {"type": "any"}
        anthropic["tools"] = [{"name": "forecast", "input_schema": tool["function"]["parameters"]}]
        answer = httpx.post(srv.url + "/v1/messages", json=anthropic, timeout=120).json()
        (use,) = [b for b in answer["content"] if b["type"] == "tool_use"]
        assert use["name"] == "forecast" and answer["stop_reason"] == "tool_use"
        assert use["input"]["unit"] in unit["enum"] and isinstance(use["input"]["days"], int)
        partial = ""
        with httpx.stream("POST", srv.url + "/v1/messages", json={**anthropic, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"input_json_delta"' in line:
                    partial += json.loads(line[6:])["delta"]["partial_json"]
        assert json.loads(partial) == use["input"]


def test_the_forced_call_is_the_syntax_the_template_writes(templates):
    """``tool_choice: required`` forces a call in the family's own syntax: for every
    template of the corpus that renders a call, the grammar accepts the call exactly as
    the template writes it (before, every family but Mistral's and Llama 3's was forced
    into Hermes' JSON)."""
    from engine import Engine
    from engine.sampling.grammar import GrammarCompiler
    from server.pipeline.template_family import template_family
    from server.pipeline.tool_calls import forced_grammar
    from server.pipeline.tool_calls.families import BY_NAME

    tool = function_tool("forecast", {"city": {"type": "string"}, "days": {"type": "integer"}})
    tok = Engine.from_pretrained().tokenizer
    compiler = GrammarCompiler(tok, tok.hf.get_vocab_size(with_added_tokens=True))
    refused, checked = {}, set()
    for name, source in templates.items():
        written = written_answer(source, tool, [{"city": "Oslo", "days": 3}])
        if written is None:
            continue
        fmt = template_family(source).name
        text = written[0]
        candidates = [text]  # or from the call's opening to its end: what precedes it (thinking) is not forced
        for opening, closing in BY_NAME[fmt].pairs:
            if opening and opening in text:
                end = text.rindex(closing) + len(closing) if closing and closing in text else len(text)
                candidates.append(text[text.index(opening) : end])
        grammar = compiler.compile("lark", forced_grammar(fmt, [tool], False))
        accepted = False
        for written_call in candidates:
            matcher = compiler.matcher(grammar)
            accepted = accepted or (
                matcher.consume_tokens(tok.encode(written_call, add_special=False)) and matcher.is_accepting()
            )
        if not accepted:
            refused[name] = (fmt, text[:200])
        checked.add(fmt)
    assert not refused, refused
    assert checked >= {"xml", "glm", "hermes", "deepseek", "kimi-k2", "gpt-oss", "gemma4", "lfm2", "mistral"}


def split_thought(thinking, text: str, opened: bool, streamed: bool) -> tuple[str, str]:
    from server.pipeline.reasoning import ReasoningSplitter

    splitter = ReasoningSplitter("auto", opened, thinking)
    parts = [splitter.push(c) for c in (text if streamed else [text])] + [splitter.flush()]
    return "".join(p[0] for p in parts).strip(), "".join(p[1] for p in parts)


def test_thoughts_a_template_renders_split_back(templates):
    """An assistant turn with a thought (``reasoning_content``) and an answer, as each
    corpus template writes it after its own generation prompt (thinking on), splits
    back — with the thought syntax slotserve finds in the template — into the same
    thought and answer, whole and streamed a character at a time; the format's own
    markers (gpt-oss's channels, Command R's response tags, ...) are not content."""
    from server.pipeline.reasoning import opens_thinking
    from server.pipeline.template_family import template_family

    user = {"role": "user", "content": "2 + 2?"}
    turn = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "Two and two make four."}
    kwargs = {"enable_thinking": True, "reasoning_effort": "high", **SPECIAL}
    split, wrong = {}, {}
    for name, source in templates.items():
        try:
            full, prompt, plain = (
                render_jinja_template([m], chat_template=source, add_generation_prompt=g, **kwargs)[0][0]
                for m, g in (([user, turn], False), ([user], True), ([user, {**turn, "content": "XYZZY"}], False))
            )
        except Exception:  # noqa: BLE001 - a template that refuses the conversation: nothing to split
            continue
        if "make four" not in full or not full.startswith(prompt):
            continue  # renders no past thought, or not after its own generation prompt
        end = plain[plain.rindex("XYZZY") + 5 :]
        text = full[len(prompt) :]
        text = text[: len(text) - len(end)] if end.strip() and text.endswith(end) else text
        thinking = template_family(source).thinking
        got = [split_thought(thinking, text, opens_thinking(prompt, thinking), s) for s in (False, True)]
        if got[0] != got[1] or got[0][0] != turn["reasoning_content"] or got[0][1].strip() != turn["content"]:
            wrong[name] = (thinking.name, got[0], text[:200])
        split.setdefault(thinking.name, []).append(name)
    assert not wrong, wrong
    assert {"think", "seed", "command-r7b", "kimi-k3", "minimax-m3", "hunyuan", "gpt-oss", "muse"} <= set(split), split


@pytest.mark.parametrize(
    "family,prompt_end,answer",
    [
        ("apriel", "Here are my reasoning steps:\n", "T\n[BEGIN FINAL RESPONSE]\nA[END FINAL RESPONSE]"),
        ("mistral", "[/INST]", "[THINK]T[/THINK]A"),
        ("gemma4", "<|turn>model\n", "<|channel>thought\nT<channel|>A"),
        ("solar", "<|begin|>assistant", "<|think|>T<|end|><|begin|>assistant<|content|>A"),
        ("apertus", "<|assistant_start|>", "<|inner_prefix|>T<|inner_suffix|>A"),
        ("granite", "<|end_of_role|>", "<think>T</think><response>A</response>"),
        ("gpt-oss", "<|start|>assistant", "<|channel|>final<|message|>A<|return|>"),
    ],
)
def test_each_familys_thought_is_split(family, prompt_end, answer):
    """Families whose corpus templates render no past thought: the answer as the model
    writes it (after the template's generation prompt) splits into thought and answer."""
    from server.pipeline.reasoning import opens_thinking
    from server.pipeline.thinking_syntax import BY_NAME

    thinking = BY_NAME[family]
    want = ("" if "T" not in answer else "T", "A")
    for streamed in (False, True):
        assert split_thought(thinking, answer, opens_thinking(prompt_end, thinking), streamed) == want


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen3.5-4B", "openai-gpt-oss-120b", "GLM-4.6"])
def test_an_agents_next_turn_begins_with_its_last_prompt_and_answer(templates, name):
    """Eight turns of an agent with tools and thinking: each turn the model's answer (a
    thought and a call, as the template writes them) is read by the chat route's answer
    path, the client sends that message back with the tool's result, and the next
    prompt the chat route renders begins with the last prompt plus the answer — so the
    slot computes only the new tokens (issue 51's target; the cached count itself is
    measured end to end in test_an_agent_loop_reuses_its_cached_prefix)."""
    import asyncio
    from types import SimpleNamespace

    from server.pipeline.chat_output import ChatAnswer
    from server.pipeline.chat_prompt import render_chat
    from server.pipeline.reasoning import opens_thinking
    from server.pipeline.template_family import template_family
    from server.schemas.requests import ChatCompletionRequest

    source = templates[name]
    template = ChatTemplate(source, SPECIAL)
    tok = SimpleNamespace(chat_template=template, adds_bos=False, bos_token="<s>")
    found = template_family(source)
    thinking, fmt = found.thinking, found.name
    messages: list[dict] = [{"role": "user", "content": "Plan a week of trips."}]  # as the client sends them
    given = list(messages)  # as transformers takes them: arguments as objects
    for k in range(8):
        body = ChatCompletionRequest(messages=messages, tools=[PLAN], chat_template_kwargs={"enable_thinking": True})
        prompt = asyncio.run(render_chat(SimpleNamespace(tokenizer=tok), body))
        trip = {**TRIPS[k % 2], "days": k + 1}
        written = {
            "role": "assistant",
            "content": "",
            "reasoning_content": f"Trip {k}: I should plan it.",
            "tool_calls": [
                {"id": f"call{k}", "type": "function", "function": {"name": "plan_trip", "arguments": trip}}
            ],
        }
        full = render_jinja_template([given + [written]], tools=[PLAN], chat_template=source, **SPECIAL)[0][0]
        assert full.startswith(prompt), (k, full[len(prompt) - 80 : len(prompt) + 80], prompt[-80:])
        answer = full[len(prompt) :]
        last = "}" if fmt == "gpt-oss" else "</tool_call>"  # the answer's end: the end of turn is EOS, not text
        answer = answer[: answer.rindex(last) + len(last)]
        choice = ChatAnswer(1, "auto", opens_thinking(prompt, thinking), fmt, tools=[PLAN], thinking=thinking)
        message = choice.choice(SimpleNamespace(index=0, text=answer, finish_reason="stop", logprobs=[]))["message"]
        assert message["reasoning_content"] == written["reasoning_content"]
        assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [trip]
        result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "booked"}
        messages += [message, result]
        given += [
            {**written, "tool_calls": [{**c, "id": message["tool_calls"][0]["id"]} for c in written["tool_calls"]]}
        ]
        given += [result]
        following = ChatCompletionRequest(
            messages=messages, tools=[PLAN], chat_template_kwargs={"enable_thinking": True}
        )
        after = asyncio.run(render_chat(SimpleNamespace(tokenizer=tok), following))
        assert after.startswith(prompt + answer), (k, after[len(prompt) : len(prompt) + len(answer) + 40], answer)


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "openai-gpt-oss-120b"])
def test_an_agent_loop_reuses_its_cached_prefix(templates, tmp_path, name):
    """An 8-turn agent loop through the server (the demo model under a Qwen3-style and
    a gpt-oss-style template; each answer a forced call, sent back with its result):
    every turn computes only its new tokens — ``cached_tokens`` is the previous prompt
    plus the answer, less the answer's last token, which was sampled but never run
    through the model (llama-server's count is the same)."""
    import httpx
    from server_proc import InProcessServer

    path = tmp_path / "template.jinja"
    path.write_text(templates[name], encoding="utf-8")
    city = {"type": "string", "enum": ["Paris", "Lyon"]}
    tool = function_tool("book", {"city": city, "days": {"type": "integer", "minimum": 1, "maximum": 9}})
    tool["function"]["parameters"]["additionalProperties"] = False
    messages = [{"role": "user", "content": "Plan a week of trips."}]
    body = {"tools": [tool], "tool_choice": "required", "max_tokens": 150, "temperature": 0}
    body["chat_template_kwargs"] = {"enable_thinking": True}
    seen = []
    with InProcessServer(chat_template_file=path) as srv:
        for _ in range(8):
            answer = httpx.post(
                srv.url + "/v1/chat/completions", json={**body, "messages": messages}, timeout=120
            ).json()
            usage, message = answer["usage"], answer["choices"][0]["message"]
            seen.append(
                (usage["prompt_tokens"], usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
            )
            (call,) = message["tool_calls"]
            messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "booked"}]
    for (prompt, completion, _), (_, _, cached) in zip(seen, seen[1:]):
        assert cached == prompt + completion - 1, seen


def test_apply_template_answers_as_transformers_renders_or_refuses(templates, tmp_path):
    """Through HTTP, with a real template that refuses some conversations (llama.cpp's
    DeepSeek R1 template, given tools): /apply-template gives transformers'
    prompt for every conversation of CONVERSATIONS, and where transformers raises, the
    route and the chat route answer 400 in OpenAI's error shape with the template's
    message, and nothing is generated."""
    import copy

    import httpx
    from server_proc import InProcessServer

    from engine import Engine

    source = templates["llama-cpp-deepseek-r1"]
    path = tmp_path / "r1.jinja"
    path.write_text(source, encoding="utf-8")
    tok = Engine.from_pretrained().tokenizer
    tok.use_chat_template("r1", source)
    specials = tok.chat_template.special_tokens
    refused = []
    with InProcessServer(chat_template_file=path) as srv:
        for name, (messages, tools, kwargs) in CONVERSATIONS.items():
            sent = copy.deepcopy(messages)
            for m in sent:
                for call in m.get("tool_calls", []):
                    call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
            body = {"messages": sent, "tools": tools, "chat_template_kwargs": kwargs}
            if name == "parts":  # a template that takes strings gets the parts joined (item 2)
                messages = [{"role": "user", "content": "".join(p["text"] for p in messages[0]["content"])}]
            kind, theirs = outcome(
                lambda messages=messages, tools=tools, kwargs=kwargs: render_jinja_template(
                    [messages], tools=tools, chat_template=source, add_generation_prompt=True, **specials, **kwargs
                )[0][0]
            )
            ours = httpx.post(srv.url + "/apply-template", json=body, timeout=60)
            if kind == "text":
                bos = specials.get("bos_token") if tok.adds_bos else None
                assert ours.status_code == 200 and ours.json()["prompt"] == theirs.removeprefix(bos or ""), name
                continue
            refused.append(name)
            chat = httpx.post(srv.url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
            for answer in (ours, chat):
                assert "error" in answer.json(), (name, answer.status_code, answer.text[:300])
                error = answer.json()["error"]
                assert answer.status_code == 400 and error["type"] == "invalid_request_error", (name, answer.text)
                assert theirs.split(": ", 1)[1][:40] in error["message"], (theirs, error)
    assert set(refused) == {"tools", "call"}


def test_the_compatibility_page_lists_every_family():
    """docs/compatibility.md names every tool-call and reasoning family the server knows;
    every thought syntax is listed under a tool-call family (one record: a template's
    family is found once, and names both)."""
    from server.pipeline.thinking_syntax import BY_FAMILY, BY_NAME
    from server.pipeline.tool_calls import FAMILIES as CALLS

    page = (Path(__file__).parent.parent / "docs" / "compatibility.md").read_text(encoding="utf-8")
    missing = [f.name for f in (*CALLS, *BY_NAME.values()) if f"`{f.name}`" not in page]
    assert not missing, missing
    assert set(BY_FAMILY) <= {f.name for f in CALLS}


def test_the_reasoning_budget_counts_the_familys_own_thought():
    """The reasoning budget opens and closes on the family's markers (gpt-oss's analysis
    channel here), not on ``<think>``: a prompt that opens the channel starts inside it,
    and the forced end is the family's closing marker."""
    from types import SimpleNamespace

    from engine import Engine
    from server.pipeline.thinking_budget import budget_spec
    from server.pipeline.thinking_syntax import BY_NAME

    tok = Engine.from_pretrained().tokenizer
    gpt_oss = BY_NAME["gpt-oss"]
    settings = SimpleNamespace(reasoning_budget=-1, reasoning_budget_message="")
    body = SimpleNamespace(reasoning_budget_tokens=8, thinking_budget_tokens=None, reasoning_budget_message=None)
    state, engine = SimpleNamespace(settings=settings), SimpleNamespace(tokenizer=tok)
    spec = budget_spec(state, engine, body, "<|start|>assistant<|channel|>analysis<|message|>", gpt_oss)
    assert spec.tokens == 8 and spec.opened
    assert spec.start == tuple(tok.encode(gpt_oss.start, False))
    assert spec.forced == tuple(tok.encode(gpt_oss.end, False))
    assert not budget_spec(state, engine, body, "<|start|>assistant", gpt_oss).opened


# values a model may write where a call's number goes: not JSON, or JSON no JSON text may carry
HOSTILE = ["...", "b'x'", "1j", "{1, frozenset({2})}", "1" + "0" * 5000, "NaN", "-Infinity", "[1, {2: 3}]",
           "{'a': b''}"]  # fmt: skip


def _strict(arguments: str) -> object:
    """JSON text as strict JSON reads it (NaN and infinities refused)."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(arguments, parse_constant=refuse)


def test_no_value_a_model_writes_makes_a_reader_raise(templates):
    """Each family's rendered calls with a value JSON cannot carry in place of a number
    (Python literals, bytes, complex, sets, an integer over 4,300 digits, NaN): reading
    never raises, whole or streamed a piece at a time, and every call read has strict
    JSON arguments (it was a 500, or a stream cut after its first chunk)."""
    from server.pipeline.template_family import template_family
    from server.pipeline.tool_calls import ToolCallStream, parse

    for name, source in templates.items():
        fmt, written = template_family(source).name, written_answer(source, PLAN, TRIPS)
        if written is None or "1200.5" not in written[0]:
            continue
        for bad in HOSTILE:
            text = written[0].replace("1200.5", bad)
            content, calls = parse(fmt, text, [PLAN])
            stream = ToolCallStream(fmt, [PLAN])
            pieces = [p for i in range(0, len(text), 7) for p in stream.push(text[i : i + 7])] + stream.flush()
            assert [_strict(c.arguments) for c in calls] == [
                _strict(c.arguments) for c in pieces if not isinstance(c, str)
            ], (name, bad)


def test_a_call_of_a_tool_the_request_did_not_offer_is_content(templates):
    """A call is a call of one of the request's tools: each family's rendered calls with
    another tool's name read as no call, their text kept as content; and a Llama 3
    answer that is a JSON object (``{"name": "Alice", "age": 30}``) is an answer."""
    from server.pipeline.template_family import template_family
    from server.pipeline.tool_calls import parse

    checked = 0
    for name, source in templates.items():
        fmt, written = template_family(source).name, written_answer(source, PLAN, TRIPS)
        if written is None:
            continue
        content, calls = parse(fmt, written[0].replace("plan_trip", "launch_rockets"), [PLAN])
        assert calls == [] and "launch_rockets" in content, (name, fmt)
        assert parse(fmt, written[0], [PLAN])[1], name  # offered: read as calls
        checked += 1
    assert checked > 40
    answer = '{"name": "Alice", "age": 30}'
    assert parse("llama3", answer, [WEATHER]) == (answer, [])
    assert parse("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER])[1]


HARMONY = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Call the tool.<|end|>"
)


@pytest.mark.parametrize(
    "tail,content,calls",
    [
        ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         '{"city": "Paris"}<|call|>', "Let me check.", [("get_weather", {"city": "Paris"})]),
        ("<|start|>assistant<|channel|>final<|message|>Sunny.<|return|>", "Let me check.Sunny.", []),
    ],
)  # fmt: skip
@pytest.mark.parametrize("chunk", [10_000, 1, 4])
def test_harmony_analysis_is_reasoning_and_a_preamble_is_content(tail, content, calls, chunk):
    """gpt-oss (harmony): every analysis message is reasoning, a commentary preamble
    (no recipient) is content without its markers, a call is a call; whole and
    streamed (the second analysis message and the preamble's markers leaked into
    ``content``)."""
    from server.pipeline.chat_output import ChatOutput
    from server.pipeline.thinking_syntax import BY_NAME

    text = HARMONY + tail
    out = ChatOutput("auto", False, "gpt-oss", [WEATHER], BY_NAME["gpt-oss"])
    parts = [out.push(text[i : i + chunk]) for i in range(0, len(text), chunk)] + [out.finish()]
    assert "".join(p.reasoning for p in parts) == "Need the weather.Call the tool."
    assert "".join(p.content for p in parts) == content
    assert [(c.name, json.loads(c.arguments)) for p in parts for c in p.calls] == calls
