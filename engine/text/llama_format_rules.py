"""The written-out parts of llama-server's chat formats (engine/text/llama_formats.py
holds the table): the helpers most formats are built from (a role prefix and suffix
around each message) and the formats that need more (system prompts folded into the
next turn, turns that open and close across messages, per-position rules)."""

from __future__ import annotations

from collections.abc import Callable

Messages = list[dict]
Format = Callable[[Messages, bool], str]
_WS = " \t\n\v\f\r"


def ws_trim(text: str) -> str:
    return text.strip(_WS)


def message_text(m: dict) -> str:
    return m.get("content") or ""


def turns(wrap: Callable[[str, str], str], opening: str, trim: bool = False) -> Format:
    """Every message as ``wrap(role, content)``; ``opening`` for the generation prompt."""

    def render(messages: Messages, add_generation_prompt: bool) -> str:
        body = "".join(wrap(m["role"], ws_trim(message_text(m)) if trim else message_text(m)) for m in messages)
        return body + (opening if add_generation_prompt else "")

    return render


def by_role(parts: dict[str, tuple[str, str]], opening: str, trim: bool = False) -> Format:
    """Role -> (prefix, suffix); roles not named are left out."""
    return turns(lambda r, c: (parts[r][0] + c + parts[r][1]) if r in parts else "", opening, trim)


def mistral_v7(space: str) -> Format:
    def render(messages: Messages, _: bool) -> str:
        out = []
        for m in messages:
            role, text = m["role"], message_text(m)
            if role == "system":
                out.append(f"[SYSTEM_PROMPT]{space}{text}[/SYSTEM_PROMPT]")
            elif role == "user":
                out.append(f"[INST]{space}{text}[/INST]")
            else:
                out.append(f"{space}{text}</s>")
        return "".join(out)

    return render


def mistral_v1_v3(lead: str, trail: str, trim_assistant: bool) -> Format:
    def render(messages: Messages, _: bool) -> str:
        out, inside = [], False
        for m in messages:
            if not inside:
                out.append(f"{lead}[INST]{trail}")
                inside = True
            role, text = m["role"], message_text(m)
            if role == "system":
                out.append(text + "\n\n")
            elif role == "user":
                out.append(f"{text}{lead}[/INST]")
            else:
                out.append(trail + (ws_trim(text) if trim_assistant else text) + "</s>")
                inside = False
        return "".join(out)

    return render


def llama2(system: bool, bos_inside: bool = False, strip: bool = False) -> Format:
    def render(messages: Messages, _: bool) -> str:
        out, inside = ["[INST] "], True
        for m in messages:
            role, text = m["role"], ws_trim(message_text(m)) if strip else message_text(m)
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{text}\n<</SYS>>\n\n" if system else text + "\n")
            elif role == "user":
                out.append(text + " [/INST]")
            else:
                out.append(text + "</s>")
                inside = False
        return "".join(out)

    return render


def gemma(messages: Messages, add_generation_prompt: bool) -> str:
    out, system = [], ""
    for m in messages:
        if m["role"] == "system":  # no system turn: it goes before the next user message
            system += ws_trim(message_text(m))
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(ws_trim(message_text(m)) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_generation_prompt else "")


def monarch(messages: Messages, add_generation_prompt: bool) -> str:
    body = "".join(("<s>" if i else "") + f"{m['role']}\n{message_text(m)}</s>\n" for i, m in enumerate(messages))
    return body + ("<s>assistant\n" if add_generation_prompt else "")


def orion(messages: Messages, _: bool) -> str:
    out, system = [], ""
    for m in messages:
        if m["role"] == "system":
            system += message_text(m)
        elif m["role"] == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + message_text(m) + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(message_text(m) + "</s>")
    return "".join(out)


def openchat(messages: Messages, add_generation_prompt: bool) -> str:
    out = []
    for m in messages:
        role = m["role"]
        if role == "system":
            out.append(message_text(m) + "<|end_of_turn|>")
        else:
            out.append(f"GPT4 Correct {role[:1].upper() + role[1:]}: {message_text(m)}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add_generation_prompt else "")


def vicuna(orca: bool) -> Format:
    system = ("SYSTEM: ", "\n") if orca else ("", "\n\n")
    return by_role({"system": system, "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "</s>\n")}, "ASSISTANT:")


def minicpm(messages: Messages, _: bool) -> str:
    return "".join(
        f"<用户>{ws_trim(message_text(m))}<AI>" if m["role"] == "user" else ws_trim(message_text(m)) for m in messages
    )


def rwkv(messages: Messages, _: bool) -> str:
    out = []
    for i, m in enumerate(messages):
        role, text = m["role"], ws_trim(message_text(m))
        if role == "system":
            out.append(f"System: {text}\n\n")
        elif role == "user":
            out.append(f"User: {text}\n\n" + ("Assistant:" if i == len(messages) - 1 else ""))
        elif role == "assistant":
            out.append(f"Assistant: {text}\n\n")
    return "".join(out)


def granite(role: str, text: str) -> str:
    head = "<|start_of_role|>assistant<|end_of_role|><|tool_call|>" if role == "assistant_tool_call" else None
    return (head or f"<|start_of_role|>{role}<|end_of_role|>") + text + "<|end_of_text|>\n"


def granite3(role: str, text: str) -> str:
    call = "<|tool_call|>" if role == "assistant_tool_call" else ""
    return f"<|start_of_role|>{role}<|end_of_role|>{call}{text}<|end_of_text|>\n"


def gigachat(messages: Messages, add_generation_prompt: bool) -> str:
    has_system = bool(messages) and messages[0]["role"] == "system"
    out = ["<s>" + (message_text(messages[0]) + "<|message_sep|>" if has_system else "")]
    for m in messages[1 if has_system else 0 :]:
        if m["role"] == "user":
            out.append(
                f"user<|role_sep|>{message_text(m)}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
            )
        elif m["role"] == "assistant":
            out.append(f"assistant<|role_sep|>{message_text(m)}<|message_sep|>")
    return "".join(out) + ("assistant<|role_sep|>" if add_generation_prompt else "")


def _bailing_role(role: str) -> str:
    return "HUMAN" if role == "user" else role.upper()


def bailing(think: bool) -> Format:
    opening = "<role>ASSISTANT</role>" + ("<think>" if think else "")
    return turns(lambda r, c: f"<role>{_bailing_role(r)}</role>{c}", opening)


def bailing2(messages: Messages, add_generation_prompt: bool) -> str:
    has_system = bool(messages) and messages[0]["role"] == "system"
    out = [] if has_system else ["<role>SYSTEM</role>detailed thinking off<|role_end|>"]
    out += [f"<role>{_bailing_role(m['role'])}</role>{message_text(m)}<|role_end|>" for m in messages]
    return "".join(out) + ("<role>ASSISTANT</role>" if add_generation_prompt else "")


def smolvlm(messages: Messages, add_generation_prompt: bool) -> str:
    parts = {"system": ("", "\n\n"), "user": ("User: ", "<end_of_utterance>\n")}
    body = "".join(
        parts.get(m["role"], ("Assistant: ", "<end_of_utterance>\n"))[0]
        + message_text(m)
        + parts.get(m["role"], ("", "<end_of_utterance>\n"))[1]
        for m in messages
    )
    return "<|im_start|>" + body + ("Assistant:" if add_generation_prompt else "")


def hunyuan_moe(messages: Messages, _: bool) -> str:
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(f"<|startoftext|>{message_text(m)}<|extra_4|>")
        elif m["role"] == "assistant":
            out.append(message_text(m) + "<|eos|>")
        else:
            out.append(f"<|startoftext|>{message_text(m)}<|extra_0|>")
    return "".join(out)


def hunyuan_dense(messages: Messages, _: bool) -> str:
    out = []
    for i, m in enumerate(messages):
        if i == 0 and m["role"] == "system":
            out.append(message_text(m) + "<｜hy_place▁holder▁no▁3｜>")
        if m["role"] == "assistant":
            out.append(f"<｜hy_Assistant｜>{message_text(m)}<｜hy_place▁holder▁no▁2｜>")
        elif m["role"] == "user":
            out.append(f"<｜hy_User｜>{message_text(m)}<｜hy_Assistant｜>")
    return "".join(out)


def hunyuan_vl(messages: Messages, _: bool) -> str:
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, m in enumerate(messages):
        if i == 0 and m["role"] == "system":
            out.append(message_text(m) + "<｜hy_place▁holder▁no▁3｜>")
        elif m["role"] == "user":
            out.append(message_text(m) + "<｜hy_User｜>")
        elif m["role"] == "assistant":
            out.append(message_text(m) + "<｜hy_Assistant｜>")
    return "".join(out)


KIMI = {"system": "<|im_system|>system", "user": "<|im_user|>user", "assistant": "<|im_assistant|>assistant",
         "tool": "<|im_system|>tool"}  # fmt: skip


def pangu(messages: Messages, add_generation_prompt: bool) -> str:
    names = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}
    out = []
    for i, m in enumerate(messages):
        if i == 0 and m["role"] != "system":
            out.append("[unused9]系统：[unused10]")
        if m["role"] in names:
            out.append(f"[unused9]{names[m['role']]}：{message_text(m)}[unused10]")
    return "".join(out) + ("[unused9]助手：" if add_generation_prompt else "")


def grok2(messages: Messages, add_generation_prompt: bool) -> str:
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(f"System: {ws_trim(message_text(m))}<|separator|>\n\n")
        elif m["role"] == "user":
            out.append(f"Human: {ws_trim(message_text(m))}<|separator|>\n\n")
        elif m["role"] == "assistant":
            out.append(f"Assistant: {message_text(m)}<|separator|>\n\n")
    return "".join(out) + ("Assistant:" if add_generation_prompt else "")
