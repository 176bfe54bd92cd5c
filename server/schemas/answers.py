"""Response bodies as pydantic models, for the OpenAPI document only: routes build
their JSON directly (no response validation on the hot path), and the schema test
(tests/test_openapi.py) checks that every answer matches what is documented here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    type: str
    code: int | str


class ErrorBody(_Out):
    """Every error: OpenAI's shape, sometimes with extra fields (``n_ctx``, ``n_prompt_tokens``)."""

    error: ErrorDetail


class AnthropicErrorDetail(_Out):
    type: str
    message: str


class AnthropicError(_Out):
    """Errors of the Anthropic routes, in Anthropic's shape."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicMessageOut(_Out):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, int]


class AnthropicTokenCount(_Out):
    input_tokens: int


class ResponseObject(_Out):
    """OpenAI's Responses API answer (the fields OpenAI's carries; output items as dicts)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None


class ResponseTokenCount(_Out):
    object: Literal["response.input_tokens"]
    input_tokens: int


class EmbeddingItem(_Out):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format base64


class EmbeddingList(_Out):
    object: Literal["list"]
    model: str
    data: list[EmbeddingItem]
    usage: dict[str, int]


class NativeEmbedding(_Out):
    """llama-server's /embedding: per input, its vectors (one pooled; pooling none: one per token)."""

    index: int
    embedding: list[list[float]]


class RerankResult(_Out):
    index: int  # the document's place in the request
    relevance_score: float
    document: dict[str, str] | None = None  # {"text": ...} with return_documents


class RerankList(_Out):
    """The rerank answer (llama-server's, Jina's): results best first, at most top_n."""

    object: Literal["list"]
    model: str
    usage: dict[str, int]
    results: list[RerankResult]


class TEIRank(_Out):
    """Hugging Face TEI's rerank answer, one per document (asked with ``texts``)."""

    index: int
    score: float
    text: str | None = None  # with return_text


class LoraAdapter(_Out):
    id: int
    path: str
    scale: float
    task_name: str  # a GGUF adapter's adapter.lora.task_name ("" when not given, as llama-server)
    prompt_prefix: str  # its adapter.lora.prompt_prefix


class Status(_Out):
    status: str
    error: str | None = None


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(_Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatTokenLogprob]


class ChatMessageOut(_Out):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Out):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(_Out):
    id: str
    aliases: list[str] | None = None  # every name the model answers to (--alias, comma-separated), sorted
    tags: list[str] | None = None  # --tags
    object: Literal["model"]
    created: int
    owned_by: str
    meta: dict[str, int] | None = None
    parent: str | None = None  # a LoRA adapter's: the model it adapts (its id is the adapter's name)


class ModelEntry(_Out):
    """llama-server's (Ollama-shaped) entry of ``models``: what the model can do."""

    name: str
    model: str
    capabilities: list[str]  # "completion", and "multimodal" for a model that takes images


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]
    models: list[ModelEntry]


class NativeCompletion(_Out):
    """llama-server's /completion answer (non-streaming); a list of them for a list of
    prompts. ``response_fields`` keeps only the fields it names (so none is required)."""

    index: int | None = None
    content: str | None = None
    tokens: list[int] | None = None
    id_slot: int | None = None
    stop: bool | None = None
    model: str | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    tokens_cached: int | None = None
    stop_type: str | None = None
    stopping_word: str | None = None
    truncated: bool | None = None
    timings: dict[str, float] | None = None
    generation_settings: dict[str, Any] | None = None
    completion_probabilities: list[dict[str, Any]] | None = None


class TokenPiece(_Out):
    id: int
    piece: str


class MediaSpan(_Out):
    start: int  # the first placeholder's index in tokens
    n_tokens: int
    id: str  # the image's digest (what prefix reuse compares)


class TokenizeResult(_Out):
    tokens: list[int] | list[TokenPiece]
    media: list[MediaSpan] | None = None  # a prompt object with images: where each image (frame) stands


class DetokenizeResult(_Out):
    content: str


class ApplyTemplateResult(_Out):
    prompt: str


class Success(_Out):
    success: bool


class SleepingProps(_Out):
    """/props while the model sleeps (--sleep-idle-seconds): what is known without it."""

    is_sleeping: Literal[True]
    total_slots: int
    model_path: str
    model_alias: str
    build_info: str


class Props(_Out):
    default_generation_settings: dict[str, Any]
    total_slots: int
    model_path: str
    model_alias: str
    chat_template: str
    bos_token: str | None
    eos_token: str | None
    build_info: str
    is_sleeping: bool
    cors_proxy_enabled: bool  # whether /cors-proxy is served (--ui-mcp-proxy)
    endpoint_slots: bool  # --slots
    endpoint_props: bool  # --props (POST /props)
    endpoint_metrics: bool  # --metrics
    memory: dict[str, Any]
    modalities: dict[str, bool]  # {"vision": the model takes images, "audio": false} (llama-server's)
    device: dict[str, Any]  # where the model runs: type, name, dtype, KV bytes and cells, decode mode
    weights: dict[str, Any]  # {"bytes": resident weight bytes, "types": bytes by stored type}
    prompt_cache: dict[str, Any]  # the prompt cache: limits, entries, bytes, hits, restores; its disk tier
    speculative: dict[str, Any]  # speculative decoding: type (null: off), n_max, ngram_size, ...


class SlotState(_Out):
    """One slot of GET /slots; ``params`` only with --slots-debug."""

    id: int
    n_ctx: int
    is_processing: bool
    id_task: int | None
    n_prompt_tokens: int
    n_cached: int
    n_decoded: int
    cache: list[dict[str, Any]]
    checkpoints: list[int]
    prompt_cache: dict[str, Any] | None = None  # its latest prompt's restore: {"tier": "ram" | "disk", "n_tokens"}
    params: dict[str, Any] | None = None


class SlotActionResult(_Out):
    """save: n_saved, n_written; restore: n_restored, n_read; erase: n_erased."""

    id_slot: int
    filename: str | None = None
    n_saved: int | None = None
    n_written: int | None = None
    n_restored: int | None = None
    n_read: int | None = None
    n_erased: int | None = None
    timings: dict[str, float] | None = None


class SlotFileEntry(_Out):
    filename: str
    size: int
    n_tokens: int
    created: float
    memory_kind: str | None
    model: dict[str, Any] | None
    model_match: bool


class SlotFileList(_Out):
    object: Literal["list"]
    data: list[SlotFileEntry]


class Deleted(_Out):
    filename: str
    deleted: bool


SSE_EVENT = {  # one server-sent event: `data:` is a JSON chunk, an error object or [DONE]
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
}

_WHY = {
    400: "invalid request (the message names the field)",
    401: "missing or invalid API key",
    404: "not found",
    409: "the slot is busy (nowait) or between states",
    413: "the request body is larger than --max-body-size",
    500: "an engine step failed (a bug or a device fault)",
    501: "slot files are off (no --slot-save-path)",
    503: "loading, shutting down, queue full or cache full (Retry-After)",
    507: "the slot file could not be written (disk full)",
}


def documented(ok: Any, *errors: int, stream: bool = False, text: bool = False, error: type = ErrorBody) -> dict:
    """The ``responses`` of a route: its 200 body (JSON, SSE when ``stream``, plain
    text when ``text``) and each error status it may answer, all in the error shape
    (``error``: OpenAI's, or Anthropic's on its routes)."""
    content: dict = {}
    if text:
        content["text/plain"] = {"schema": {"type": "string"}}
    if stream:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    ok_doc: dict = {"description": "OK"}
    if ok is not None:
        ok_doc["model"] = ok
    if content:
        ok_doc["content"] = content
    out: dict = {200: ok_doc}
    for status in sorted({401, *errors}):
        out[status] = {"model": error, "description": _WHY[status]}
    return out
