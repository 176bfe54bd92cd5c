"""Server settings: llama-server's flag names, each also read from ``SLOTSERVE_<NAME>``.

Precedence: command-line flag, then environment variable, then default. Parsed once at
start-up; nothing below reads the environment again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import field_validator
from pydantic_settings import PydanticBaseSettingsSource, SettingsConfigDict

from engine import DEMO_MODEL
from server.config.llama_env import LlamaEnv
from server.config.lora_settings import LoraSettings
from server.config.media_settings import MediaSettings
from server.config.router_settings import RouterSettings
from server.config.sampler_settings import SamplerSettings
from server.config.setting import setting


class ServerSettings(SamplerSettings, LoraSettings, RouterSettings, MediaSettings):
    model_config = SettingsConfigDict(env_prefix="SLOTSERVE_", extra="forbid", protected_namespaces=())

    model: Path = setting(
        DEMO_MODEL,
        description="Hugging Face checkpoint folder (default: the embedded demo model)",
        flags=("-m", "--model"),
        router=True,
        llama_env="LLAMA_ARG_MODEL",
    )
    alias: str | None = setting(
        None,
        description="model names reported by the API, comma-separated (default: the folder name)",
        flags=("-a", "--alias"),
        router=True,
        llama_env="LLAMA_ARG_ALIAS",
    )
    tags: str | None = setting(
        None,
        description="model tags listed by /v1/models, comma-separated (informational)",
        flags=("--tags",),
        llama_env="LLAMA_ARG_TAGS",
    )
    host: str = setting(
        "127.0.0.1",
        description="addresses to listen on, comma-separated (a path ending in .sock: UNIX)",
        flags=("--host",),
        router=True,
        llama_env="LLAMA_ARG_HOST",
    )
    port: int = setting(
        8080,
        ge=0,
        le=65535,
        description="port to listen on",
        flags=("--port",),
        router=True,
        llama_env="LLAMA_ARG_PORT",
    )
    ctx_size: int = setting(
        4096,
        gt=0,
        description="KV cache cells of all slots together (see --kv-unified)",
        flags=("-c", "--ctx-size"),
        llama_env="LLAMA_ARG_CTX_SIZE",
    )
    parallel: int = setting(
        4, gt=0, description="number of slots", flags=("-np", "--parallel"), llama_env="LLAMA_ARG_N_PARALLEL"
    )
    batch_size: int = setting(
        2048,
        gt=0,
        description="logical token budget of one step",
        flags=("-b", "--batch-size"),
        llama_env="LLAMA_ARG_BATCH",
    )
    ubatch_size: int = setting(
        512,
        gt=0,
        description="physical token budget of one forward (step = min(-b, -ub))",
        flags=("-ub", "--ubatch-size"),
        llama_env="LLAMA_ARG_UBATCH",
    )
    kv_unified: bool = setting(
        False,
        description="one block pool shared by all slots (one slot may use all); off: each slot owns ctx-size/parallel",
        flags=("--kv-unified",),
        off=("--no-kv-unified",),
        llama_env="LLAMA_ARG_KV_UNIFIED",
    )
    swa_full: bool = setting(
        False,
        description="sliding-window layers keep full-size caches (more memory; allows --context-shift)",
        flags=("--swa-full",),
        off=("--no-swa-full",),
        llama_env="LLAMA_ARG_SWA_FULL",
    )
    ctx_checkpoints: int = setting(
        2,
        ge=0,
        description="sliding-window checkpoints kept per slot, for prefix reuse behind the window",
        flags=("--ctx-checkpoints", "--swa-checkpoints"),
        llama_env="LLAMA_ARG_CTX_CHECKPOINTS",
    )
    ssm_checkpoints: int = setting(
        4,
        ge=0,
        description="recurrent-state checkpoints kept per slot (Mamba layers), for prefix reuse and rollback",
        flags=("--ssm-checkpoints",),
    )
    ssm_checkpoint_every: int = setting(
        512,
        gt=0,
        description="tokens between recurrent-state checkpoints (one is also taken at each prompt's end)",
        flags=("--ssm-checkpoint-every",),
    )
    kv_cache_tokens: int | None = setting(
        None,
        gt=0,
        description="cap on the KV cache's cells whatever --ctx-size says (memory is committed as used)",
        flags=("--kv-cache-tokens",),
    )
    kv_cache_demand_paged: bool = setting(
        True,
        description="accepted for llama.cpp compatibility: cache memory is always committed on first use",
        flags=("--kv-cache-demand-paged",),
        off=("--no-kv-cache-demand-paged",),
    )
    block_size: int = setting(16, gt=0, description="KV cells per block", flags=("--block-size",))
    dtype: str = setting(
        "auto",
        pattern="^(auto|float32|bfloat16|float16)$",
        description="weights and activations (auto: bfloat16 on CUDA, float32 on the CPU)",
        flags=("--dtype",),
    )
    device: str = setting(
        "auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="where the model runs (auto: CUDA when there is one)",
        flags=("--device",),
    )  # fmt: skip
    enforce_eager: bool = setting(
        False, description="never capture CUDA graphs: decode steps run eagerly (vLLM's)", flags=("--enforce-eager",)
    )
    gpu_memory_utilization: float = setting(
        0.9,
        gt=0,
        le=1,
        description="share of the GPU's memory for weights, KV cache and activations; the KV pool takes what is "
        "left of it (-c stays a cap)",
        flags=("--gpu-memory-utilization",),
    )
    quantization: str | None = setting(
        None,
        pattern="^(q8_0|q4_0|q4_k)$",
        description="quantize a float checkpoint's linear layers at load (vLLM's flag) into GGUF blocks: "
        "q8_0, q4_0 or q4_k (with --dtype float32)",
        flags=("-q", "--quantization"),
    )
    mmap: bool = setting(
        True,
        description="map a GGUF file's quantized weights instead of reading them into memory of their own "
        "(llama.cpp's default; --no-mmap reads them)",
        flags=("--mmap",),
        off=("--no-mmap",),
    )
    repack: bool = setting(
        True,
        description="repack Q4_0, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights into 8-row groups at load for the "
        "integer kernels (llama.cpp's --repack; -nr / --no-repack keeps the file's layout)",
        flags=("--repack",),
        off=("-nr", "--no-repack"),
        llama_env="LLAMA_ARG_REPACK",
    )
    slot_save_path: Path | None = setting(
        None,
        description="folder for slot files (slot save/restore off without it)",
        flags=("--slot-save-path",),
        router=True,
    )
    api_key: str | None = setting(
        None,
        description="comma-separated API keys (Bearer or X-Api-Key)",
        flags=("--api-key",),
        router=True,
        llama_env="LLAMA_API_KEY",
    )
    api_key_file: Path | None = setting(
        None,
        description="file with one API key per line",
        flags=("--api-key-file",),
        router=True,
        llama_env="LLAMA_ARG_API_KEY_FILE",
    )
    slot_prompt_similarity: float = setting(
        0.1, ge=0, le=1, description="prefix share that picks a slot", flags=("-sps", "--slot-prompt-similarity")
    )
    cache_ram: int = setting(
        8192,
        ge=-1,
        description="MiB of host RAM for the prompt cache: states of slots taken for other prompts, restored "
        "when a prompt starts the same way (llama-server's; -1: no limit, 0: off)",
        flags=("-cram", "--cache-ram"),
    )
    cache_idle_slots: bool = setting(
        True,
        description="save an idle slot's state to the prompt cache before the slot takes another prompt",
        flags=("--cache-idle-slots",),
        off=("--no-cache-idle-slots",),
    )
    cache_type_k: str | None = setting(
        None,
        pattern="^(f32|f16|bf16|q8_0)$",
        description="type attention caches store keys in: f32, f16, bf16 or q8_0 (llama-server's; default: f16 "
        "for weights in GGUF blocks, the model's dtype for a float checkpoint)",
        flags=("-ctk", "--cache-type-k"),
    )
    cache_type_v: str | None = setting(
        None,
        pattern="^(f32|f16|bf16|q8_0)$",
        description="type attention caches store values in (as --cache-type-k)",
        flags=("-ctv", "--cache-type-v"),
    )
    spec_type: str | None = setting(
        None,
        pattern="^(ngram-simple|draft-simple|none)$",
        description="speculative decoding: ngram-simple proposes what followed the last n-gram's earlier "
        "occurrence in the prompt or output; draft-simple what the draft model (-md) picks; verified in one step "
        "(attention caches; default: draft-simple with -md, else none)",
        flags=("--spec-type",),
    )
    spec_ngram_simple_size_n: int = setting(
        12, ge=1, description="tokens of the n-gram looked up (ngram-simple)", flags=("--spec-ngram-simple-size-n",)
    )
    spec_ngram_simple_size_m: int = setting(
        48,
        ge=0,
        description="most tokens proposed after a match (ngram-simple; a step carries at most 16 decode rows)",
        flags=("--spec-ngram-simple-size-m",),
    )
    model_draft: Path | None = setting(
        None,
        description="draft model for speculative decoding (HF folder or GGUF with the model's vocabulary)",
        flags=("-md", "--model-draft", "--spec-draft-model"),
    )
    spec_draft_n_max: int = setting(
        3,
        ge=0,
        description="most tokens the draft model proposes a step",
        flags=("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"),
    )
    spec_draft_n_min: int = setting(
        0,
        ge=0,
        description="shorter proposals are not verified",
        flags=("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
    )
    spec_draft_p_min: float = setting(
        0.0,
        ge=0,
        le=1,
        description="a draft guess less likely than this (to the draft) ends the proposal",
        flags=("--spec-draft-p-min", "--draft-p-min"),
    )
    cache_disk: Path | None = setting(
        None,
        description="folder for the prompt cache's disk tier: what falls out of --cache-ram is written there "
        "as slot files, found again after a restart and by replicas sharing the folder (off without it)",
        flags=("--cache-disk",),
    )
    cache_disk_size: int = setting(
        32768,
        ge=-1,
        description="MiB the disk tier's entries may take (least recently used go first; -1: no limit)",
        flags=("--cache-disk-size",),
    )
    context_shift: bool = setting(
        False,
        description="a full slot drops old tokens instead of stopping",
        flags=("--context-shift",),
        off=("--no-context-shift",),
        llama_env="LLAMA_ARG_CONTEXT_SHIFT",
    )
    keep: int = setting(
        0,
        ge=-1,
        description="prompt tokens a context shift keeps (requests without n_keep; -1: all)",
        flags=("--keep",),
    )
    reverse_prompt: str | None = setting(
        None, description="a stop string for requests that give none", flags=("-r", "--reverse-prompt")
    )
    special: bool = setting(
        False,
        description="special tokens are written into the output text",
        flags=("-sp", "--special"),
        off=("--no-special",),
    )
    cache_prompt: bool = setting(
        True,
        description="reuse a slot's cache for requests without cache_prompt",
        flags=("--cache-prompt",),
        off=("--no-cache-prompt",),
        llama_env="LLAMA_ARG_CACHE_PROMPT",
    )
    grammar: str | None = setting(
        None, description="GBNF grammar for requests without a constraint of their own", flags=("--grammar",)
    )
    grammar_file: Path | None = setting(None, description="the same, read from a file", flags=("--grammar-file",))
    json_schema: str | None = setting(
        None, description="JSON schema for requests without a constraint of their own", flags=("-j", "--json-schema")
    )
    json_schema_file: Path | None = setting(
        None, description="the same, read from a file", flags=("-jf", "--json-schema-file")
    )
    api_prefix: str = setting(
        "",
        pattern=r"^(/[^/\s]+)*$",
        description="path prefix every route is served under",
        flags=("--api-prefix",),
        router=True,
        llama_env="LLAMA_ARG_API_PREFIX",
    )
    sse_ping_interval: int = setting(
        30,
        ge=-1,
        description="seconds a quiet stream waits for an SSE comment (-1: off)",
        flags=("--sse-ping-interval",),
        llama_env="LLAMA_ARG_SSE_PING_INTERVAL",
    )
    n_predict: int = setting(
        -1,
        ge=-1,
        description="default max tokens when a request sets none (-1: to context)",
        flags=("-n", "--n-predict"),
        llama_env="LLAMA_ARG_N_PREDICT",
    )
    threads: int | None = setting(
        None, gt=0, description="torch threads for the engine", flags=("-t", "--threads"), llama_env="LLAMA_ARG_THREADS"
    )
    timeout: float = setting(
        600,
        gt=0,
        description="idle keep-alive connection timeout, seconds",
        flags=("-to", "--timeout"),
        llama_env="LLAMA_ARG_TIMEOUT",
    )
    max_queue: int = setting(256, ge=0, description="requests waiting for a slot before 503", flags=("--max-queue",))
    sleep_idle_seconds: float = setting(
        -1,
        description="free the model's weights and caches after this many seconds without a request "
        "(the next request wakes it; slots go to the --cache-disk tier first); -1: never",
        flags=("--sleep-idle-seconds",),
    )
    drain_timeout: float = setting(
        30, ge=0, description="seconds in-flight requests get after SIGTERM", flags=("--drain-timeout",)
    )
    stall_timeout: float = setting(
        60,
        gt=0,
        description="a step this long fails /health; a stream write blocked this long cuts its client",
        flags=("--stall-timeout",),
    )
    max_body_size: int = setting(
        8 << 20, gt=0, description="largest request body in bytes; larger is 413", flags=("--max-body-size",)
    )
    max_inputs: int = setting(
        2048,
        gt=0,
        description="most inputs of one embeddings request, and documents of one rerank request; more is 413",
        flags=("--max-inputs",),
    )
    log_prompts: bool = setting(
        False,
        description="log prompt and completion text (off: never in the logs)",
        flags=("--log-prompts",),
        off=("--no-log-prompts",),
    )
    webui: bool = setting(
        True,
        description="serve the web page (chat, slots, live view) at /",
        flags=("--webui", "--ui"),
        off=("--no-webui", "--no-ui"),
        llama_env="LLAMA_ARG_UI",
    )
    ui_mcp_proxy: bool = setting(
        False,
        description="serve the MCP CORS proxy (/cors-proxy): not on untrusted networks",
        flags=("--webui-mcp-proxy", "--ui-mcp-proxy"),
        off=("--no-webui-mcp-proxy", "--no-ui-mcp-proxy"),
        llama_env="LLAMA_ARG_UI_MCP_PROXY",
    )
    ui_mcp_proxy_private: bool = setting(
        False,
        description="let the CORS proxy reach loopback, link-local and private addresses (refused: 403)",
        flags=("--ui-mcp-proxy-private",),
        off=("--no-ui-mcp-proxy-private",),
    )
    verbose: bool = setting(
        False,
        description="tracebacks with errors (a model that fails to load, for one), and __verbose in OpenAI answers "
        "(llama-server's native answer with the rendered prompt)",
        flags=("-v", "--verbose"),
        off=("--no-verbose",),
    )
    metrics: bool = setting(
        False,
        description="serve Prometheus metrics on /metrics (off by default, as in llama-server: 501 without it)",
        flags=("--metrics",),
        router=True,
        off=("--no-metrics",),
        llama_env="LLAMA_ARG_ENDPOINT_METRICS",
    )
    metrics_public: bool = setting(
        False,
        description="/metrics without the API key",
        flags=("--metrics-public",),
        router=True,
        off=("--no-metrics-public",),
    )
    slots: bool = setting(
        True,
        description="serve the slot monitoring endpoint GET /slots (off: 501)",
        flags=("--slots",),
        off=("--no-slots",),
        llama_env="LLAMA_ARG_ENDPOINT_SLOTS",
    )
    props: bool = setting(
        False,
        description="accept POST /props (off: 501; it changes nothing, as llama-server's)",
        flags=("--props",),
        off=("--no-props",),
        llama_env="LLAMA_ARG_ENDPOINT_PROPS",
    )
    embeddings: bool = setting(
        False,
        description="serve /v1/embeddings and /embedding(s), beside generation (off: 501)",
        flags=("--embedding", "--embeddings"),
        off=("--no-embeddings",),
        llama_env="LLAMA_ARG_EMBEDDINGS",
    )
    rerank: bool = setting(
        False,
        description="serve /v1/rerank, /rerank, /reranking and /v1/reranking (pooling rank: a cross-encoder's "
        "classification head scores each query-document pair)",
        flags=("--rerank", "--reranking"),
        off=("--no-rerank",),
        llama_env="LLAMA_ARG_RERANKING",
    )
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = setting(
        None,
        description="how embeddings pool the final hidden states (default: the checkpoint's, else last; "
        "rank: a reranker's score, as --rerank)",
        flags=("--pooling",),
        llama_env="LLAMA_ARG_POOLING",
    )
    embd_normalize: int = setting(
        2,
        ge=-1,
        le=64,
        description="how embeddings are normalized where a request does not say (embd_normalize): "
        "-1 none, 0 max absolute to int16, 1 taxicab, 2 Euclidean, >2 p-norm",
        flags=("--embd-normalize",),
    )
    slots_debug: bool = setting(
        False,
        description="GET /slots shows each running request's sampling params",
        flags=("--slots-debug",),
        off=("--no-slots-debug",),
        llama_env="LLAMA_SERVER_SLOTS_DEBUG",
    )
    chat_template: str | None = setting(
        None,
        description="a built-in chat template by name (chatml, llama3, mistral, gemma, ...) or jinja text",
        flags=("--chat-template",),
        llama_env="LLAMA_ARG_CHAT_TEMPLATE",
    )
    chat_template_file: Path | None = setting(
        None,
        description="a jinja chat template file (instead of the model's)",
        flags=("--chat-template-file",),
        llama_env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
    )
    chat_template_kwargs: str | None = setting(
        None,
        description='JSON object of extra template variables, e.g. {"enable_thinking": false}',
        flags=("--chat-template-kwargs",),
        llama_env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
    )
    jinja: bool = setting(
        True,
        description="accepted for llama.cpp compatibility: templates are always jinja",
        flags=("--jinja",),
        off=("--no-jinja",),
        llama_env="LLAMA_ARG_JINJA",
    )
    reasoning_format: str = setting(
        "auto",
        pattern="^(none|auto|deepseek|deepseek-legacy)$",
        description="thoughts in <think> go to reasoning_content (auto, deepseek), also stay in content "
        "(deepseek-legacy), or stay in content (none)",
        flags=("--reasoning-format",),
        llama_env="LLAMA_ARG_THINK",
    )
    prefill_assistant: bool = setting(
        True,
        description="a final assistant message is continued (off: rendered as a finished turn)",
        flags=("--prefill-assistant",),
        off=("--no-prefill-assistant",),
        llama_env="LLAMA_ARG_PREFILL_ASSISTANT",
    )
    reasoning_budget: int = setting(
        -1,
        ge=-1,
        description="tokens in a <think> block (-1: free; 0: none)",
        flags=("--reasoning-budget",),
        llama_env="LLAMA_ARG_THINK_BUDGET",
    )
    reasoning_budget_message: str | None = setting(
        None,
        description="forced before </think> when the budget is spent",
        flags=("--reasoning-budget-message",),
        llama_env="LLAMA_ARG_THINK_BUDGET_MESSAGE",
    )
    cors_origins: str = setting(
        "*",
        description="origins browsers may call from: *, localhost, or a comma-separated / JSON list",
        flags=("--cors-origins", "--allowed-origins"),
        router=True,
        llama_env="LLAMA_ARG_CORS_ORIGINS",
    )
    cors_methods: str = setting(
        "GET, POST, DELETE, OPTIONS",
        description="CORS preflight: allowed methods",
        flags=("--cors-methods",),
        router=True,
        llama_env="LLAMA_ARG_CORS_METHODS",
    )
    cors_headers: str = setting(
        "*",
        description="CORS preflight: allowed headers",
        flags=("--cors-headers",),
        router=True,
        llama_env="LLAMA_ARG_CORS_HEADERS",
    )
    cors_credentials: bool = setting(
        True,
        description="CORS: allow credentials (echoes the Origin when origins is *)",
        flags=("--cors-credentials",),
        router=True,
        off=("--no-cors-credentials",),
        llama_env="LLAMA_ARG_CORS_CREDENTIALS",
    )

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
