"""A checkpoint's config.json, normalized across transformers 4 and 5 spellings.

transformers 4 writes ``torch_dtype``, ``rope_theta`` and ``rope_scaling``;
transformers 5 writes ``dtype`` and ``rope_parameters`` (theta inside). Both load into
the same frozen ``ModelConfig``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    rope: RopeConfig
    checkpoint_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical config JSON (for slot files and caches)."""
        blob = json.dumps(self.raw, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


def _require(raw: dict, key: str, path: Path) -> Any:
    if key not in raw or raw[key] is None:
        raise CheckpointError(f"{path}: required field '{key}' is missing")
    return raw[key]


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(x) for x in value)


def _rope(raw: dict, path: Path) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "rope_theta" in raw and "rope_theta" not in params:
        params["rope_theta"] = raw["rope_theta"]
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{path}: field 'rope_scaling.rope_type' is '{rope_type}'; supported: {', '.join(ROPE_TYPES)}"
        )
    known = {f for f in RopeConfig.__dataclass_fields__ if f not in ("rope_type", "theta")}
    kwargs = {k: params[k] for k in known if params.get(k) is not None}
    return RopeConfig(rope_type=rope_type, theta=float(params.get("rope_theta", 10000.0)), **kwargs)


def parse_model_config(raw: dict, path: Path) -> ModelConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else str(raw.get("model_type", ""))
    n_heads = int(_require(raw, "num_attention_heads", path))
    hidden = int(_require(raw, "hidden_size", path))
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    return ModelConfig(
        architecture=arch,
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(_require(raw, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=int(_require(raw, "intermediate_size", path)),
        n_layers=int(_require(raw, "num_hidden_layers", path)),
        n_heads=n_heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
        head_dim=int(raw.get("head_dim") or hidden // n_heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope=_rope(raw, path),
        checkpoint_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_as_ids(raw.get("eos_token_id")),
        sliding_window=int(window) if window else None,
        raw=raw,
    )


def load_model_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (is '{folder}' a Hugging Face checkpoint folder?)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: malformed JSON: {exc}") from exc
    return parse_model_config(raw, path)
