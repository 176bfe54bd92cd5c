"""llama-server's built-in chat formats by name (``--chat-template NAME``): the prompt
each one renders, as llama.cpp's C++ formatter (llama-chat.cpp) writes it, so a name
gives the same prompt on both servers (tests/data/llama_templates.json holds
llama-server's renderings; tests/llamacpp_compat/test_template_names.py compares).

Each format is a function of the messages ({"role", "content"} dicts) and whether an
assistant turn is opened at the end. Most are "role prefix, content, role suffix"
(``turns``); the others are written out."""

from __future__ import annotations

from engine.text.llama_format_rules import (
    KIMI,
    Format,
    Messages,
    bailing,
    bailing2,
    by_role,
    gemma,
    gigachat,
    granite,
    granite3,
    grok2,
    hunyuan_dense,
    hunyuan_moe,
    hunyuan_vl,
    llama2,
    message_text,
    minicpm,
    mistral_v1_v3,
    mistral_v7,
    monarch,
    openchat,
    orion,
    pangu,
    rwkv,
    smolvlm,
    turns,
    vicuna,
    ws_trim,
)

EXAONE3 = {"system": ("[|system|]", "[|endofturn|]\n"), "user": ("[|user|]", "\n"),
            "assistant": ("[|assistant|]", "[|endofturn|]\n")}  # fmt: skip

FORMATS: dict[str, Format] = {
    "chatml": turns(lambda r, c: f"<|im_start|>{r}\n{c}<|im_end|>\n", "<|im_start|>assistant\n"),
    "llama2": llama2(system=False),
    "llama2-sys": llama2(system=True),
    "llama2-sys-bos": llama2(system=True, bos_inside=True),
    "llama2-sys-strip": llama2(system=True, strip=True),
    "mistral-v1": mistral_v1_v3(" ", " ", False),
    "mistral-v3": mistral_v1_v3("", " ", True),
    "mistral-v3-tekken": mistral_v1_v3("", "", False),
    "mistral-v7": mistral_v7(" "),
    "mistral-v7-tekken": mistral_v7(""),
    "phi3": turns(lambda r, c: f"<|{r}|>\n{c}<|end|>\n", "<|assistant|>\n"),
    "phi4": turns(lambda r, c: f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": turns(lambda r, c: f"<|{r}|>\n{c}\n", "<|assistant|>\n"),
    "zephyr": turns(lambda r, c: f"<|{r}|>\n{c}<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": monarch,
    "gemma": gemma,
    "orion": orion,
    "openchat": openchat,
    "vicuna": vicuna(orca=False),
    "vicuna-orca": vicuna(orca=True),
    "deepseek": by_role(
        {"system": ("", ""), "user": ("### Instruction:\n", "\n"), "assistant": ("### Response:\n", "\n<|EOT|>\n")},
        "### Response:\n",
    ),
    "deepseek2": by_role(
        {"system": ("", "\n\n"), "user": ("User: ", "\n\n"), "assistant": ("Assistant: ", "<｜end▁of▁sentence｜>")},
        "Assistant:",
    ),
    "deepseek3": by_role(
        {"system": ("", "\n\n"), "user": ("<｜User｜>", ""), "assistant": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")},
        "<｜Assistant｜>",
    ),
    "deepseek-ocr": lambda messages, _: "".join(message_text(m) for m in messages),
    "command-r": by_role(
        {
            "system": ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "user": ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "assistant": ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        },
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        trim=True,
    ),
    "llama3": turns(
        lambda r, c: f"<|start_header_id|>{r}<|end_header_id|>\n\n{c}<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        trim=True,
    ),
    "chatglm3": lambda m, a: "[gMASK]sop" + turns(lambda r, c: f"<|{r}|>\n {c}", "<|assistant|>")(m, a),
    "chatglm4": lambda m, a: "[gMASK]<sop>" + turns(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>\n")(m, a),
    "glmedge": turns(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>"),
    "minicpm": minicpm,
    "exaone3": by_role(EXAONE3, "[|assistant|]", trim=True),
    "exaone4": by_role({**EXAONE3, "tool": ("[|tool|]", "[|endofturn|]\n")}, "[|assistant|]", trim=True),
    "exaone-moe": by_role(
        {r: (f"<|{r}|>\n", "<|endofturn|>\n") for r in ("system", "user", "assistant", "tool")},
        "<|assistant|>\n",
        trim=True,
    ),
    "rwkv-world": rwkv,
    "granite": turns(granite3, "<|start_of_role|>assistant<|end_of_role|>"),
    "granite-4.0": turns(granite, "<|start_of_role|>assistant<|end_of_role|>"),
    "granite-4.1": turns(granite, "<|start_of_role|>assistant<|end_of_role|>"),
    "gigachat": gigachat,
    "megrez": turns(
        lambda r, c: f"<|role_start|>{r}<|role_end|>{c}<|turn_end|>", "<|role_start|>assistant<|role_end|>"
    ),
    "yandex": by_role({"user": (" Пользователь: ", "\n\n"), "assistant": (" Ассистент: ", "\n\n")}, " Ассистент:[SEP]"),
    "bailing": bailing(think=False),
    "bailing-think": bailing(think=True),
    "bailing2": bailing2,
    "llama4": turns(
        lambda r, c: f"<|header_start|>{r}<|header_end|>\n\n{c}<|eot|>",
        "<|header_start|>assistant<|header_end|>\n\n",
        trim=True,
    ),
    "smolvlm": smolvlm,
    "hunyuan-moe": hunyuan_moe,
    "gpt-oss": turns(
        lambda r, c: f"<|start|>{r}<|message|>{c}" + ("<|return|>" if r == "assistant" else "<|end|>"),
        "<|start|>assistant",
    ),
    "hunyuan-dense": hunyuan_dense,
    "hunyuan-vl": hunyuan_vl,
    "kimi-k2": turns(
        lambda r, c: (f"{KIMI[r]}<|im_middle|>" if r in KIMI else "") + c + "<|im_end|>",
        "<|im_assistant|>assistant<|im_middle|>",
    ),
    "seed_oss": turns(
        lambda r, c: f"<seed:bos>{r}\n{ws_trim(c) if r == 'assistant' else c}<seed:eos>", "<seed:bos>assistant\n"
    ),
    "grok-2": grok2,
    "pangu-embedded": pangu,
    "solar-open": turns(lambda r, c: f"<|begin|>{r}<|content|>{c}<|end|>", "<|begin|>assistant"),
}


class FormattedTemplate:
    """One of ``FORMATS`` behind ChatTemplate's interface (engine/text/chat_template.py):
    it renders no tools itself (the server puts them in a system turn) and takes no
    template variables."""

    takes_tools = False
    content_forms = (True, False)  # llama-server's formats take a message's content as a string
    image_text = None

    def __init__(self, name: str):
        self.name, self._format = name, FORMATS[name]
        sample = [{"role": r, "content": "{" + r + "}"} for r in ("system", "user", "assistant")]
        self.source = self._format(sample, True)  # what the format looks like (/props; the tool-call family)

    def render(self, messages: Messages, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        return self._format(messages, add_generation_prompt)
