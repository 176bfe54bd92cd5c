"""Request bodies (pydantic). Unknown fields are ignored, as OpenAI clients send many."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from server.schemas.fields import (  # noqa: F401 (re-exported: the bodies' building blocks)
    INT64,
    Bias,
    BiasPair,
    EmbedSize,
    Int,
    NonEmpty,
    SlotId,
    TokenId,
    TokenIds,
    _Body,
    _limit,
    text_only,
)
from server.schemas.sampler_fields import SamplerFields


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's ``response_format``; llama-server also takes ``schema`` beside
    ``type: json_object``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict | None = Field(None, alias="schema")


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` (one of them)."""

    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    grammar: str | None = None


class LoraScale(_Body):
    id: Int(ge=0, **_limit("lora"))  # < the number of adapters loaded
    scale: float = Field(ge=-100, le=100)


class SamplingFields(SamplerFields):
    """Fields shared by every generating endpoint (OpenAI names plus llama-server's)."""

    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: Int(ge=-1) | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    seed: Int(ge=-1, le=2**53 - 1) | None = None  # JSON's safe integers: larger ones lose precision in clients
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    logit_bias: dict[str, Bias] | Annotated[list[BiasPair], Field(max_length=1024)] | None = Field(
        None,
        description="token id (decimal) or text -> bias; or [[token_id_or_text, bias], ...] (llama-server). "
        "Text gets the bias on each of its tokens; false bans a token",
        **_limit("token_keys"),
    )
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=16)] | None = None
    ignore_eos: bool = False
    n_indent: Int(ge=0, le=2**31 - 1, description="lines after the first open with this many spaces/tabs") = 0
    t_max_predict_ms: Int(ge=-1, description="once this long after the first token, stop at a newline") = -1
    id_slot: SlotId | None = None
    cache_prompt: bool | None = None  # None: the server's (--cache-prompt, on)
    n_keep: Int(ge=-1) | None = None  # None: the server's (--keep, 0)
    stream: bool = False
    timings_per_token: bool = False  # llama-server: timings in every stream chunk
    return_progress: bool = False  # llama-server: prompt_progress chunks while a streamed prompt is computed
    sse_ping_interval: Int(ge=-1, le=86400) | None = None  # llama-server: this stream's ping interval (s; -1 off)
    lora: list[LoraScale] | None = Field(
        None, description="LoRA adapters for this request by id (GET /lora-adapters); unlisted ones: scale 0"
    )
    verbose: bool | None = Field(
        None,
        description="add __verbose (llama-server's native answer, with the prompt) to an OpenAI answer "
        "(default: the server's --verbose)",
    )
    spec_n_max: Int(ge=0) | None = Field(
        None, alias="speculative.n_max", description="most tokens speculative decoding proposes a step for this request"
    )
    spec_n_min: Int(ge=0) | None = Field(
        None, alias="speculative.n_min", description="shorter proposals are not verified (default: the server's)"
    )
    spec_p_min: float | None = Field(
        None,
        ge=0,
        le=1,
        alias="speculative.p_min",
        description="a draft model's guess below this probability ends its proposal (default: the server's)",
    )
    grammar: str | None = Field(
        None, description="GBNF (llama.cpp's grammar format). Every constraint must compile: otherwise a 400 naming why"
    )
    json_schema: dict | None = Field(None, description="the output is JSON valid against this schema")
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | str | None = None  # vLLM's older names
    guided_regex: str | None = None
    guided_choice: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    guided_grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v):
        for key in v if isinstance(v, dict) else ():
            if key.isdigit() and key != str(int(key)):
                raise ValueError(f"logit_bias keys must be token ids without leading zeros or text, got {key!r}")
        return v


class OpenAIFields(SamplingFields):
    model: str | None = None
    n: Int(ge=1, description="choices (at most the number of slots)", **_limit("n_slots")) = 1
    max_tokens: Int(ge=0, description="at most; generation also ends at the slot's context") | None = None
    stream_options: StreamOptions | None = None


class CompletionRequest(OpenAIFields):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "description": "echo with logprobs (prompt logprobs are not computed)",
                "required": ["echo", "logprobs"],
                "properties": {"echo": {"const": True}, "logprobs": {"type": "integer"}},
            }
        }
    )

    prompt: (
        NonEmpty
        | TokenIds
        | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    ) = Field(description="one prompt: text or token ids (a list of one of them is taken too)")
    echo: bool = False
    logprobs: Int(ge=0, le=20) | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        return v[0] if isinstance(v, list) and isinstance(v[0], str | list) else v


class ContentPart(_Body):
    type: Literal["text"]
    text: str


MEDIA_MARKER = "<__media__>"  # where an image goes in a flattened message (llama-server's marker)


class ImageURL(_Body):
    url: str = Field(description="a data: URL (base64) of the image")
    detail: str | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL | None = None  # checked where the model is known (a text model refuses any image part)


class FunctionCall(_Body):
    name: str
    arguments: str | dict = "{}"


class MessageToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


MEDIA = {"input_audio": "audio", "audio_url": "audio", "video_url": "video", "file": "file"}  # (images: ImagePart)


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart | ImagePart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v):
        """A media part is refused in llama-server's words, not as a shape error."""
        types = [p.get("type") for p in v if isinstance(p, dict)] if isinstance(v, list) else []
        kind = next((MEDIA[t] for t in types if isinstance(t, str) and t in MEDIA), None)  # a type may be any JSON
        if kind is not None:
            raise PydanticCustomError("media", text_only(kind))
        return v

    def text(self) -> str:
        """The content as text, each image part a ``MEDIA_MARKER``."""
        if isinstance(self.content, list):
            return "".join(p.text if isinstance(p, ContentPart) else MEDIA_MARKER for p in self.content)
        return self.content or ""

    def images(self) -> list[str | None]:
        """The URLs of the content's image parts, in order (None: a part without one)."""
        parts = self.content if isinstance(self.content, list) else []
        return [p.image_url.url if p.image_url else None for p in parts if isinstance(p, ImagePart)]


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern="^[A-Za-z0-9_.-]+$")]


class FunctionDef(_Body):
    name: ToolName
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


ReasoningFormat = Literal["none", "auto", "deepseek", "deepseek-legacy"]


class ChatFields(_Body):
    """What shapes a chat prompt (shared by chat completions, /apply-template and token
    counting)."""

    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = False  # llama-server's default; OpenAI's is true
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None  # vLLM's; None: continue a final assistant message (llama-server)
    chat_template_kwargs: dict | None = None


class ChatCompletionRequest(OpenAIFields, ChatFields):
    """A final assistant message is continued (a prefill). Refused (400): two assistant
    messages at the end; ``continue_final_message`` true without a final assistant
    message, or together with an explicitly true ``add_generation_prompt``."""

    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["continue_final_message", "add_generation_prompt"],
                "properties": {"continue_final_message": {"const": True}, "add_generation_prompt": {"const": True}},
            }
        }
    )
    max_completion_tokens: Int(ge=0) | None = None
    logprobs: bool = False
    top_logprobs: Int(ge=0, le=20) | None = None
    reasoning_format: ReasoningFormat | None = None
    reasoning_budget_tokens: Int(ge=-1, le=2**31 - 1) | None = None  # tokens in a <think> block (-1: the server's)
    thinking_budget_tokens: Int(ge=-1, le=2**31 - 1) | None = None  # the same (llama-server's other name)
    reasoning_budget_message: str | None = None  # forced before </think> when the budget is spent


class PromptObject(_Body):
    """llama-server's JSON-object prompt: text, and images (base64) that go where the text
    holds ``MEDIA_MARKER``s, in order (a model that takes images; others refuse)."""

    prompt_string: NonEmpty
    multimodal_data: Annotated[list[str], Field(max_length=16)] | None = None


MixedPrompt = Annotated[list[TokenId | NonEmpty], Field(min_length=1)]


class NativeCompletionRequest(SamplingFields):
    """llama-server's POST /completion. ``prompt``: text, token ids (text pieces may be
    mixed in), a JSON object, or a list of prompts (strings, objects or id lists: a
    batch, answered with a list). A list of ids and text is one prompt; a list that also
    holds lists or objects is a batch (a bare id in it is a one-token prompt)."""

    prompt: (
        NonEmpty | PromptObject | Annotated[list[TokenId | NonEmpty | MixedPrompt | PromptObject], Field(min_length=1)]
    )
    n_predict: Int(ge=-1) = -1
    n_probs: Int(ge=0, le=20) = 0
    response_fields: list[str] | None = None
    n_cmpl: Int(ge=1, le=2**31 - 1, **_limit("n_slots")) | None = None  # completions of each prompt (<= slots)
    n: Int(ge=1, **_limit("n_slots")) = 1  # n_cmpl's other name (llama-server's alias)

    def prompts(self) -> tuple[list[str | list | PromptObject], bool]:
        """(prompts, batch): each prompt as text, a list of ids and text pieces, or an
        object with images (``multimodal_data``)."""
        p = self.prompt
        if isinstance(p, PromptObject):
            return [p if p.multimodal_data else p.prompt_string], False
        if isinstance(p, str):
            return [p], False
        if all(isinstance(x, int | str) for x in p) and any(isinstance(x, int) for x in p):
            return [p], False  # ids, perhaps with text pieces: one prompt

        def one(x):
            if isinstance(x, PromptObject):
                return x if x.multimodal_data else x.prompt_string
            return [x] if isinstance(x, int) else x

        return [one(x) for x in p], True


class TokenizeRequest(_Body):
    content: str | PromptObject  # an object with images: tokenized as /completion computes it (BOS included)
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[TokenId]


class ApplyTemplateRequest(ChatFields):
    pass
