"""Request bodies (pydantic). Unknown fields are ignored, as OpenAI clients send many."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields shared by every generating endpoint (OpenAI names plus llama-server's)."""

    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-1, le=2**64 - 1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    id_slot: int | None = None
    cache_prompt: bool = True
    n_keep: int = Field(0, ge=-1)
    stream: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("stop takes at most 16 non-empty strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v):
        for key in v or {}:
            if not key.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        return v


class OpenAIFields(SamplingFields):
    model: str | None = None
    n: int = Field(1, ge=1, le=64)
    max_tokens: int | None = Field(None, ge=0)
    stream_options: StreamOptions | None = None


class CompletionRequest(OpenAIFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            if len(v) != 1:
                raise ValueError("one prompt per request (send several requests to batch)")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v


class ContentPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        if isinstance(v, list):
            for part in v:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"content parts of type {part.type!r} are not supported (text only)")
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class ChatCompletionRequest(OpenAIFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True


class NativeCompletionRequest(SamplingFields):
    """llama-server's POST /completion."""

    prompt: str | list[int]
    n_predict: int = Field(-1, ge=-1)
    n_probs: int = Field(0, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("the prompt is empty")
        return v


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


class ApplyTemplateRequest(_Body):
    messages: list[Message] = Field(min_length=1)
