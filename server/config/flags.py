"""The command line: each server setting under llama-server's flag names (``FLAGS``,
and ``SWITCHES`` for on/off pairs), parsed into ``ServerSettings`` (server/config/settings.py).
Unset flags fall through to the environment, then the defaults."""

from __future__ import annotations

import argparse

from server.config.sampler_settings import SAMPLER_FLAGS
from server.config.settings import ServerSettings

FLAGS: dict[str, tuple[str, ...]] = {
    "model": ("-m", "--model"),
    "alias": ("-a", "--alias"),
    "host": ("--host",),
    "port": ("--port",),
    "ctx_size": ("-c", "--ctx-size"),
    "parallel": ("-np", "--parallel"),
    "batch_size": ("-b", "--batch-size"),
    "ubatch_size": ("-ub", "--ubatch-size"),
    "block_size": ("--block-size",),
    "dtype": ("--dtype",),
    "quantization": ("-q", "--quantization"),
    "slot_save_path": ("--slot-save-path",),
    "api_key": ("--api-key",),
    "api_key_file": ("--api-key-file",),
    "slot_prompt_similarity": ("-sps", "--slot-prompt-similarity"),
    "cache_ram": ("-cram", "--cache-ram"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "spec_type": ("--spec-type",),
    "spec_ngram_simple_size_n": ("--spec-ngram-simple-size-n",),
    "spec_ngram_simple_size_m": ("--spec-ngram-simple-size-m",),
    "model_draft": ("-md", "--model-draft", "--spec-draft-model"),
    "spec_draft_n_max": ("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"),
    "spec_draft_n_min": ("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
    "spec_draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "keep": ("--keep",),
    "reverse_prompt": ("-r", "--reverse-prompt"),
    "grammar": ("--grammar",),
    "grammar_file": ("--grammar-file",),
    "json_schema": ("-j", "--json-schema"),
    "json_schema_file": ("-jf", "--json-schema-file"),
    "api_prefix": ("--api-prefix",),
    "sse_ping_interval": ("--sse-ping-interval",),
    "cache_disk": ("--cache-disk",),
    "cache_disk_size": ("--cache-disk-size",),
    "n_predict": ("-n", "--n-predict"),
    "threads": ("-t", "--threads"),
    "timeout": ("-to", "--timeout"),
    "max_queue": ("--max-queue",),
    "drain_timeout": ("--drain-timeout",),
    "stall_timeout": ("--stall-timeout",),
    "max_body_size": ("--max-body-size",),
    "ctx_checkpoints": ("--ctx-checkpoints", "--swa-checkpoints"),
    "kv_cache_tokens": ("--kv-cache-tokens",),
    "ssm_checkpoints": ("--ssm-checkpoints",),
    "ssm_checkpoint_every": ("--ssm-checkpoint-every",),
    "cors_origins": ("--cors-origins", "--allowed-origins"),
    "cors_methods": ("--cors-methods",),
    "cors_headers": ("--cors-headers",),
    "chat_template": ("--chat-template",),
    "chat_template_file": ("--chat-template-file",),
    "chat_template_kwargs": ("--chat-template-kwargs",),
    "reasoning_format": ("--reasoning-format",),
    "reasoning_budget": ("--reasoning-budget",),
    "reasoning_budget_message": ("--reasoning-budget-message",),
    "pooling": ("--pooling",),
    "lora": ("--lora",),
    "lora_scaled": ("--lora-scaled",),
}
SWITCHES: dict[str, tuple[str | tuple[str, ...], str | tuple[str, ...]]] = {
    "kv_unified": ("--kv-unified", "--no-kv-unified"),
    "mmap": ("--mmap", "--no-mmap"),
    "repack": ("--repack", ("-nr", "--no-repack")),
    "cache_idle_slots": ("--cache-idle-slots", "--no-cache-idle-slots"),
    "swa_full": ("--swa-full", "--no-swa-full"),
    "kv_cache_demand_paged": ("--kv-cache-demand-paged", "--no-kv-cache-demand-paged"),
    "context_shift": ("--context-shift", "--no-context-shift"),
    "cache_prompt": ("--cache-prompt", "--no-cache-prompt"),
    "special": (("-sp", "--special"), "--no-special"),
    "metrics": ("--metrics", "--no-metrics"),
    "metrics_public": ("--metrics-public", "--no-metrics-public"),
    "log_prompts": ("--log-prompts", "--no-log-prompts"),
    "verbose": (("-v", "--verbose"), "--no-verbose"),
    "cors_credentials": ("--cors-credentials", "--no-cors-credentials"),
    "slots": ("--slots", "--no-slots"),
    "props": ("--props", "--no-props"),
    "embeddings": (("--embedding", "--embeddings"), "--no-embeddings"),
    "lora_init_without_apply": ("--lora-init-without-apply", "--no-lora-init-without-apply"),
    "slots_debug": ("--slots-debug", "--no-slots-debug"),
    "jinja": ("--jinja", "--no-jinja"),
    "webui": (("--webui", "--ui"), ("--no-webui", "--no-ui")),
    "ui_mcp_proxy": (("--webui-mcp-proxy", "--ui-mcp-proxy"), ("--no-webui-mcp-proxy", "--no-ui-mcp-proxy")),
    "prefill_assistant": ("--prefill-assistant", "--no-prefill-assistant"),
    "ui_mcp_proxy_private": ("--ui-mcp-proxy-private", "--no-ui-mcp-proxy-private"),
}
FLAGS["tags"] = ("--tags",)
FLAGS.update(SAMPLER_FLAGS)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; defaults are None so unset flags fall through to the env."""
    for name, field in ServerSettings.model_fields.items():
        env = f"SLOTSERVE_{name.upper()}"
        default = "" if field.default is None or name == "model" else f"default {field.default}; "
        help_ = f"{field.description} ({default}env {env})"
        if name in SWITCHES:
            on, off = SWITCHES[name]
            ons = on if isinstance(on, tuple) else (on,)
            parser.add_argument(*ons, dest=name, action="store_true", default=None, help=help_)
            offs = off if isinstance(off, tuple) else (off,)
            parser.add_argument(*offs, dest=name, action="store_false", default=None, help=f"turn {ons[-1]} off")
        else:
            parser.add_argument(*FLAGS[name], dest=name, default=None, metavar=name.upper(), help=help_)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    given = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields and v is not None}
    return ServerSettings(**given)
