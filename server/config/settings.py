"""Server settings: llama-server's flag names, each also read from ``SLOTSERVE_<NAME>``.

Precedence: command-line flag, then environment variable, then default. Parsed once at
start-up; nothing below reads the environment again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource, SettingsConfigDict

from engine import DEMO_MODEL
from server.config.lora_settings import LoraSettings
from server.config.sampler_settings import SamplerSettings


class ServerSettings(SamplerSettings, LoraSettings):
    model_config = SettingsConfigDict(env_prefix="SLOTSERVE_", extra="forbid", protected_namespaces=())

    model: Path = Field(DEMO_MODEL, description="Hugging Face checkpoint folder (default: the embedded demo model)")
    alias: str | None = Field(
        None, description="model names reported by the API, comma-separated (default: the folder name)"
    )
    tags: str | None = Field(None, description="model tags listed by /v1/models, comma-separated (informational)")
    host: str = Field("127.0.0.1", description="addresses to listen on, comma-separated (a path ending in .sock: UNIX)")
    port: int = Field(8080, ge=0, le=65535, description="port to listen on")
    ctx_size: int = Field(4096, gt=0, description="KV cache cells of all slots together (see --kv-unified)")
    parallel: int = Field(4, gt=0, description="number of slots")
    batch_size: int = Field(2048, gt=0, description="logical token budget of one step")
    ubatch_size: int = Field(512, gt=0, description="physical token budget of one forward (step = min(-b, -ub))")
    kv_unified: bool = Field(
        False,
        description="one block pool shared by all slots (one slot may use all); off: each slot owns ctx-size/parallel",
    )
    swa_full: bool = Field(
        False, description="sliding-window layers keep full-size caches (more memory; allows --context-shift)"
    )
    ctx_checkpoints: int = Field(
        2, ge=0, description="sliding-window checkpoints kept per slot, for prefix reuse behind the window"
    )
    ssm_checkpoints: int = Field(
        4, ge=0, description="recurrent-state checkpoints kept per slot (Mamba layers), for prefix reuse and rollback"
    )
    ssm_checkpoint_every: int = Field(
        512, gt=0, description="tokens between recurrent-state checkpoints (one is also taken at each prompt's end)"
    )
    kv_cache_tokens: int | None = Field(
        None, gt=0, description="cap on the KV cache's cells whatever --ctx-size says (memory is committed as used)"
    )
    kv_cache_demand_paged: bool = Field(
        True, description="accepted for llama.cpp compatibility: cache memory is always committed on first use"
    )
    block_size: int = Field(16, gt=0, description="KV cells per block")
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$", description="weights and activations")
    quantization: str | None = Field(
        None,
        pattern="^(q8_0|q4_0|q4_k)$",
        description="quantize a float checkpoint's linear layers at load (vLLM's flag) into GGUF blocks: "
        "q8_0, q4_0 or q4_k (with --dtype float32)",
    )
    mmap: bool = Field(
        True,
        description="map a GGUF file's quantized weights instead of reading them into memory of their own "
        "(llama.cpp's default; --no-mmap reads them)",
    )
    repack: bool = Field(
        True,
        description="repack Q4_0, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights into 8-row groups at load for the "
        "integer kernels (llama.cpp's --repack; -nr / --no-repack keeps the file's layout)",
    )
    slot_save_path: Path | None = Field(None, description="folder for slot files (slot save/restore off without it)")
    api_key: str | None = Field(None, description="comma-separated API keys (Bearer or X-Api-Key)")
    api_key_file: Path | None = Field(None, description="file with one API key per line")
    slot_prompt_similarity: float = Field(0.1, ge=0, le=1, description="prefix share that picks a slot")
    cache_ram: int = Field(
        8192,
        ge=-1,
        description="MiB of host RAM for the prompt cache: states of slots taken for other prompts, restored "
        "when a prompt starts the same way (llama-server's; -1: no limit, 0: off)",
    )
    cache_idle_slots: bool = Field(
        True, description="save an idle slot's state to the prompt cache before the slot takes another prompt"
    )
    cache_type_k: str | None = Field(
        None,
        pattern="^(f32|f16|bf16|q8_0)$",
        description="type attention caches store keys in: f32, f16, bf16 or q8_0 (llama-server's; default: f16 "
        "for weights in GGUF blocks, the model's dtype for a float checkpoint)",
    )
    cache_type_v: str | None = Field(
        None, pattern="^(f32|f16|bf16|q8_0)$", description="type attention caches store values in (as --cache-type-k)"
    )
    spec_type: str | None = Field(
        None,
        pattern="^(ngram-simple|draft-simple|none)$",
        description="speculative decoding: ngram-simple proposes what followed the last n-gram's earlier "
        "occurrence in the prompt or output; draft-simple what the draft model (-md) picks; verified in one step "
        "(attention caches; default: draft-simple with -md, else none)",
    )
    spec_ngram_simple_size_n: int = Field(12, ge=1, description="tokens of the n-gram looked up (ngram-simple)")
    spec_ngram_simple_size_m: int = Field(
        48, ge=0, description="most tokens proposed after a match (ngram-simple; a step carries at most 16 decode rows)"
    )
    model_draft: Path | None = Field(
        None, description="draft model for speculative decoding (HF folder or GGUF with the model's vocabulary)"
    )
    spec_draft_n_max: int = Field(3, ge=0, description="most tokens the draft model proposes a step")
    spec_draft_n_min: int = Field(0, ge=0, description="shorter proposals are not verified")
    spec_draft_p_min: float = Field(
        0.0, ge=0, le=1, description="a draft guess less likely than this (to the draft) ends the proposal"
    )
    cache_disk: Path | None = Field(
        None,
        description="folder for the prompt cache's disk tier: what falls out of --cache-ram is written there "
        "as slot files, found again after a restart and by replicas sharing the folder (off without it)",
    )
    cache_disk_size: int = Field(
        32768, ge=-1, description="MiB the disk tier's entries may take (least recently used go first; -1: no limit)"
    )
    context_shift: bool = Field(False, description="a full slot drops old tokens instead of stopping")
    keep: int = Field(0, ge=-1, description="prompt tokens a context shift keeps (requests without n_keep; -1: all)")
    reverse_prompt: str | None = Field(None, description="a stop string for requests that give none")
    special: bool = Field(False, description="special tokens are written into the output text")
    cache_prompt: bool = Field(True, description="reuse a slot's cache for requests without cache_prompt")
    grammar: str | None = Field(None, description="GBNF grammar for requests without a constraint of their own")
    grammar_file: Path | None = Field(None, description="the same, read from a file")
    json_schema: str | None = Field(None, description="JSON schema for requests without a constraint of their own")
    json_schema_file: Path | None = Field(None, description="the same, read from a file")
    api_prefix: str = Field("", pattern=r"^(/[^/\s]+)*$", description="path prefix every route is served under")
    sse_ping_interval: int = Field(30, ge=-1, description="seconds a quiet stream waits for an SSE comment (-1: off)")
    n_predict: int = Field(-1, ge=-1, description="default max tokens when a request sets none (-1: to context)")
    threads: int | None = Field(None, gt=0, description="torch threads for the engine")
    timeout: float = Field(600, gt=0, description="idle keep-alive connection timeout, seconds")
    max_queue: int = Field(256, ge=0, description="requests waiting for a slot before 503")
    drain_timeout: float = Field(30, ge=0, description="seconds in-flight requests get after SIGTERM")
    stall_timeout: float = Field(
        60, gt=0, description="a step this long fails /health; a stream write blocked this long cuts its client"
    )
    max_body_size: int = Field(8 << 20, gt=0, description="largest request body in bytes; larger is 413")
    log_prompts: bool = Field(False, description="log prompt and completion text (off: never in the logs)")
    webui: bool = Field(True, description="serve the web page (chat, slots, live view) at /")
    ui_mcp_proxy: bool = Field(False, description="serve the MCP CORS proxy (/cors-proxy): not on untrusted networks")
    ui_mcp_proxy_private: bool = Field(
        False, description="let the CORS proxy reach loopback, link-local and private addresses (refused: 403)"
    )
    verbose: bool = Field(
        False,
        description="tracebacks with errors (a model that fails to load, for one), and __verbose in OpenAI answers "
        "(llama-server's native answer with the rendered prompt)",
    )
    metrics: bool = Field(
        False, description="serve Prometheus metrics on /metrics (off by default, as in llama-server: 501 without it)"
    )
    metrics_public: bool = Field(False, description="/metrics without the API key")
    slots: bool = Field(True, description="serve the slot monitoring endpoint GET /slots (off: 501)")
    props: bool = Field(False, description="accept POST /props (off: 501; it changes nothing, as llama-server's)")
    embeddings: bool = Field(False, description="serve /v1/embeddings and /embedding(s), beside generation (off: 501)")
    pooling: Literal["none", "mean", "cls", "last"] | None = Field(
        None, description="how embeddings pool the final hidden states (default: the checkpoint's, else last)"
    )
    slots_debug: bool = Field(False, description="GET /slots shows each running request's sampling params")
    chat_template: str | None = Field(
        None, description="a built-in chat template by name (chatml, llama3, mistral, gemma, ...) or jinja text"
    )
    chat_template_file: Path | None = Field(None, description="a jinja chat template file (instead of the model's)")
    chat_template_kwargs: str | None = Field(
        None, description='JSON object of extra template variables, e.g. {"enable_thinking": false}'
    )
    jinja: bool = Field(True, description="accepted for llama.cpp compatibility: templates are always jinja")
    reasoning_format: str = Field(
        "auto",
        pattern="^(none|auto|deepseek|deepseek-legacy)$",
        description="thoughts in <think> go to reasoning_content (auto, deepseek), also stay in content "
        "(deepseek-legacy), or stay in content (none)",
    )
    prefill_assistant: bool = Field(
        True, description="a final assistant message is continued (off: rendered as a finished turn)"
    )
    reasoning_budget: int = Field(-1, ge=-1, description="tokens in a <think> block (-1: free; 0: none)")
    reasoning_budget_message: str | None = Field(None, description="forced before </think> when the budget is spent")
    cors_origins: str = Field(
        "*", description="origins browsers may call from: *, localhost, or a comma-separated / JSON list"
    )
    cors_methods: str = Field("GET, POST, DELETE, OPTIONS", description="CORS preflight: allowed methods")
    cors_headers: str = Field("*", description="CORS preflight: allowed headers")
    cors_credentials: bool = Field(True, description="CORS: allow credentials (echoes the Origin when origins is *)")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init), then SLOTSERVE_* variables, then llama-server's LLAMA_ARG_* ones."""
        return init_settings, env_settings, LlamaEnv(settings_cls), dotenv_settings, file_secret_settings

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        from server.middleware.cors import parse_origins

        parse_origins(value)  # ValueError: a clear start-up error
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs_object(cls, value: str | None) -> str | None:
        import json

        if value is not None and not isinstance(json.loads(value), dict):
            raise ValueError("--chat-template-kwargs must be a JSON object")
        return value

    @property
    def hosts(self) -> list[str]:
        return [h.strip() for h in self.host.split(",") if h.strip()] or ["127.0.0.1"]

    @property
    def template_kwargs(self) -> dict:
        """Server-wide template variables (a request's chat_template_kwargs override them)."""
        import json

        kwargs = json.loads(self.chat_template_kwargs) if self.chat_template_kwargs else {}
        return {"enable_thinking": False, **kwargs} if self.reasoning_budget == 0 else kwargs

    @property
    def template_spec(self) -> str | None:
        """--chat-template-file's text, else --chat-template's value, else None (the model's)."""
        if self.chat_template_file is not None:
            return self.chat_template_file.read_text(encoding="utf-8")
        return self.chat_template

    @property
    def default_constraint(self) -> tuple[str, str] | None:
        """(kind, source) of --grammar(-file) / --json-schema(-file), or None."""
        given = [
            ("gbnf", self.grammar),
            ("gbnf", self.grammar_file and self.grammar_file.read_text(encoding="utf-8")),
            ("json_schema", self.json_schema),
            ("json_schema", self.json_schema_file and self.json_schema_file.read_text(encoding="utf-8")),
        ]
        given = [(kind, source) for kind, source in given if source]
        if len(given) > 1:
            raise ValueError("give one of --grammar, --grammar-file, --json-schema, --json-schema-file")
        return given[0] if given else None

    @field_validator("api_key_file", "chat_template_file", "grammar_file", "json_schema_file")
    @classmethod
    def _key_file_exists(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"{v}: file not found")
        return v

    @property
    def api_keys(self) -> frozenset[str]:
        keys = [k.strip() for k in (self.api_key or "").split(",")]
        if self.api_key_file is not None:
            lines = [line.strip() for line in self.api_key_file.read_text().splitlines()]
            keys += [line for line in lines if not line.startswith("#")]  # comments, as llama-server
        return frozenset(k for k in keys if k)

    @property
    def model_aliases(self) -> list[str]:
        """Every name of the model, sorted (llama-server keeps them in a sorted set)."""
        names = sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})
        return names or [Path(self.model).name]

    @property
    def model_name(self) -> str:
        """The name answers carry: the first alias, as llama-server's."""
        return self.model_aliases[0]

    @property
    def model_tags(self) -> list[str]:
        return sorted({t.strip() for t in (self.tags or "").split(",") if t.strip()})

    @property
    def step_tokens(self) -> int:
        return min(self.batch_size, self.ubatch_size)


# flag spellings: llama-server's short and long names for each field
LLAMA_ENV = {  # setting -> the variable llama-server reads for the same flag (llama.cpp common/arg.cpp)
    "model": "LLAMA_ARG_MODEL",
    "repack": "LLAMA_ARG_REPACK",
    "alias": "LLAMA_ARG_ALIAS",
    "chat_template": "LLAMA_ARG_CHAT_TEMPLATE",
    "chat_template_file": "LLAMA_ARG_CHAT_TEMPLATE_FILE",
    "chat_template_kwargs": "LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
    "prefill_assistant": "LLAMA_ARG_PREFILL_ASSISTANT",
    "webui": "LLAMA_ARG_UI",
    "ui_mcp_proxy": "LLAMA_ARG_UI_MCP_PROXY",
    "jinja": "LLAMA_ARG_JINJA",
    "reasoning_format": "LLAMA_ARG_THINK",
    "reasoning_budget": "LLAMA_ARG_THINK_BUDGET",
    "reasoning_budget_message": "LLAMA_ARG_THINK_BUDGET_MESSAGE",
    "tags": "LLAMA_ARG_TAGS",
    "api_prefix": "LLAMA_ARG_API_PREFIX",
    "sse_ping_interval": "LLAMA_ARG_SSE_PING_INTERVAL",
    "cache_prompt": "LLAMA_ARG_CACHE_PROMPT",
    "host": "LLAMA_ARG_HOST",
    "port": "LLAMA_ARG_PORT",
    "ctx_size": "LLAMA_ARG_CTX_SIZE",
    "parallel": "LLAMA_ARG_N_PARALLEL",
    "batch_size": "LLAMA_ARG_BATCH",
    "ubatch_size": "LLAMA_ARG_UBATCH",
    "api_key": "LLAMA_API_KEY",
    "api_key_file": "LLAMA_ARG_API_KEY_FILE",
    "n_predict": "LLAMA_ARG_N_PREDICT",
    "threads": "LLAMA_ARG_THREADS",
    "timeout": "LLAMA_ARG_TIMEOUT",
    "kv_unified": "LLAMA_ARG_KV_UNIFIED",
    "swa_full": "LLAMA_ARG_SWA_FULL",
    "ctx_checkpoints": "LLAMA_ARG_CTX_CHECKPOINTS",
    "context_shift": "LLAMA_ARG_CONTEXT_SHIFT",
    "metrics": "LLAMA_ARG_ENDPOINT_METRICS",
    "slots": "LLAMA_ARG_ENDPOINT_SLOTS",
    "props": "LLAMA_ARG_ENDPOINT_PROPS",
    "embeddings": "LLAMA_ARG_EMBEDDINGS",
    "pooling": "LLAMA_ARG_POOLING",
    "slots_debug": "LLAMA_SERVER_SLOTS_DEBUG",
    "cors_origins": "LLAMA_ARG_CORS_ORIGINS",
    "cors_methods": "LLAMA_ARG_CORS_METHODS",
    "cors_headers": "LLAMA_ARG_CORS_HEADERS",
    "cors_credentials": "LLAMA_ARG_CORS_CREDENTIALS",
    "temp": "LLAMA_ARG_TEMPERATURE",
    "top_k": "LLAMA_ARG_TOP_K",
    "top_p": "LLAMA_ARG_TOP_P",
    "min_p": "LLAMA_ARG_MIN_P",
}
_LLAMA_BOOL = {"enabled": "true", "disabled": "false"}  # llama.cpp's spellings beside true/1/on


class LlamaEnv(PydanticBaseSettingsSource):
    """Settings from llama-server's environment variables (below SLOTSERVE_* ones)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:
        name = LLAMA_ENV.get(field_name)
        value = os.environ.get(name) if name else None
        if value is not None and field.annotation is bool:
            value = _LLAMA_BOOL.get(value.strip().lower(), value)
        return value, field_name, False

    def __call__(self) -> dict[str, object]:
        out = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                out[name] = value
        return out
