"""A checkpoint's config.json, normalized across transformers 4 and 5 spellings.

transformers 4 writes ``torch_dtype``, ``rope_theta`` and ``rope_scaling``;
transformers 5 writes ``dtype`` and ``rope_parameters`` (theta inside). Both load into
the same frozen ``ModelConfig``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional", "longrope")


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
    partial_rotary_factor: float = 1.0  # the rotated share of each head ("proportional": of its angles)
    short_factor: tuple[float, ...] | None = None  # "longrope" (Phi-3): per-frequency divisors up to the
    long_factor: tuple[float, ...] | None = None  # original context, and past it


@dataclass(frozen=True)
class MediaConfig:
    """What a vision-language checkpoint (``text_config`` + ``vision_config``) says of its
    images: the encoder's config as written, the placeholder token each image position
    holds in the prompt, the tokens around an image and how many positions one takes."""

    vision: dict[str, Any] = field(compare=False)
    image_token_id: int = 0
    boi_token_id: int | None = None  # begin of image
    eoi_token_id: int | None = None  # end of image
    tokens_per_image: int = 256


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
    layer_types: tuple[str, ...]  # per layer: "full_attention" | "sliding_attention" | "recurrent"
    rope_local: RopeConfig | None  # sliding layers' own rope (Gemma 3), else None: the same as ``rope``
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    media: MediaConfig | None = None  # a vision-language checkpoint's encoder and placeholders, else None

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
    if isinstance(params.get("full_attention"), dict):  # transformers 5, per layer type (Gemma 3)
        params = dict(params["full_attention"])
    if "rope_theta" in raw and "rope_theta" not in params:
        params["rope_theta"] = raw["rope_theta"]
    if raw.get("partial_rotary_factor") is not None and "partial_rotary_factor" not in params:  # older: top level
        params["partial_rotary_factor"] = raw["partial_rotary_factor"]
    if (params.get("rope_type") or params.get("type")) in ("longrope", "su"):  # Phi-3: its original context
        old = params.setdefault("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
        if params.get("factor") is None and old:  # transformers' default: the context's growth
            params["factor"] = raw.get("max_position_embeddings", old) / old
    return _rope_of(params, path)


def _rope_local(raw: dict, path: Path) -> RopeConfig | None:
    """The sliding layers' rope where the config gives them their own: transformers 5
    nests it under ``rope_parameters.sliding_attention``; older Gemma 3 configs say
    ``rope_local_base_freq`` (default rope, no scaling)."""
    params = raw.get("rope_parameters") or {}
    if isinstance(params.get("sliding_attention"), dict):
        return _rope_of(dict(params["sliding_attention"]), path)
    if raw.get("rope_local_base_freq") is not None:
        return RopeConfig(theta=float(raw["rope_local_base_freq"]))
    return None


def _rope_of(params: dict, path: Path) -> RopeConfig:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "mrope":  # transformers 4's Qwen2-VL: default frequencies, split by mrope_section
        rope_type = "default"
    if rope_type == "su":  # Phi-3's first configs' name for LongRoPE
        rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{path}: field 'rope_scaling.rope_type' is '{rope_type}'; supported: {', '.join(ROPE_TYPES)}"
        )
    known = {f for f in RopeConfig.__dataclass_fields__ if f not in ("rope_type", "theta")}
    kwargs = {k: params[k] for k in known if params.get(k) is not None}
    for key in ("short_factor", "long_factor"):
        if key in kwargs:
            kwargs[key] = tuple(float(x) for x in kwargs[key])
    return RopeConfig(rope_type=rope_type, theta=float(params.get("rope_theta", 10000.0)), **kwargs)


LAYER_TYPES = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "sliding_attention": "sliding_attention",
    "linear_attention": "recurrent",  # transformers 5's name for Mamba layers in hybrids
    "mamba": "recurrent",
    "conv": "recurrent",  # LFM2's gated short convolution: its window is a recurrent state
    "mlp": "feed_forward",  # Nemotron-H's layers of one MLP or MoE: no memory
    "moe": "feed_forward",
}
RECURRENT_MODEL_TYPES = ("mamba2",)  # every layer recurrent; no layer list in the config


NEMOTRON_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def _layer_list(raw: dict) -> list | None:
    """The layer list where a config gives one but no ``num_hidden_layers`` (Nemotron-H's
    ``layers_block_type``, or its older ``hybrid_override_pattern`` string)."""
    if raw.get("num_hidden_layers") is not None:
        return None
    if isinstance(raw.get("layers_block_type"), list):
        return raw["layers_block_type"]
    pattern = raw.get("hybrid_override_pattern")
    return [NEMOTRON_PATTERN.get(c, c) for c in pattern] if isinstance(pattern, str) else None


def _layer_types(raw: dict, n_layers: int, window: int | None, path: Path) -> tuple[str, ...]:
    """Per-layer attention kind from ``layer_types`` (transformers 5, with the legacy
    names), else Gemma 3's ``sliding_window_pattern`` (every n-th layer is global), else
    every layer sliding when the config has a window (Mistral), else all full."""
    given = raw.get("layer_types") or raw.get("layers_block_type")  # the latter: older Granite 4 configs
    if given is None and isinstance(raw.get("hybrid_override_pattern"), str):  # Nemotron-H hub configs
        given = [NEMOTRON_PATTERN.get(c, c) for c in raw["hybrid_override_pattern"]]
    if given is None and isinstance(raw.get("full_attn_idxs"), list):  # older LFM2 configs
        given = ["full_attention" if i in raw["full_attn_idxs"] else "conv" for i in range(n_layers)]
    if given is None and raw.get("full_attention_interval"):  # Qwen3-Next / Qwen3.5 configs without the list
        every = int(raw["full_attention_interval"])
        given = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layers)]
    if raw.get("model_type") in RECURRENT_MODEL_TYPES:
        return ("recurrent",) * n_layers
    if given is not None:
        if not isinstance(given, list) or len(given) != n_layers:
            raise CheckpointError(f"{path}: field 'layer_types' must list one type per layer ({n_layers})")
        unknown = sorted({str(t) for t in given if t not in LAYER_TYPES})
        if unknown:
            raise CheckpointError(
                f"{path}: field 'layer_types' names {', '.join(unknown)}, which slotserve does not support; "
                f"supported: {', '.join(sorted(LAYER_TYPES))}"
            )
        types = tuple(LAYER_TYPES[t] for t in given)
    elif raw.get("sliding_window_pattern"):
        pattern = int(raw["sliding_window_pattern"])
        types = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers))
    else:
        types = ("sliding_attention",) * n_layers
    if window is None:  # no window (or switched off): every layer attends to everything
        return tuple("full_attention" if t == "sliding_attention" else t for t in types)
    return types


def _ffn(value: Any) -> int:
    """``intermediate_size``: one size, or one per layer (Gemma 3n): the largest."""
    return max(int(v) for v in value) if isinstance(value, list) else int(value)


def _tokens_per_image(raw: dict) -> int:
    """Positions one image (one frame of a tiled image) takes: Gemma 3's
    ``mm_tokens_per_image``; SmolVLM / Idefics3's patch grid folded by ``scale_factor``;
    0 where it follows the image's size (Qwen2.5-VL)."""
    if raw.get("model_type") in VARIABLE_IMAGE_TYPES:
        return 0
    if "scale_factor" in raw:
        vision = raw["vision_config"]
        side = int(vision.get("image_size", 224)) // int(vision.get("patch_size", 16))
        return side * side // int(raw["scale_factor"]) ** 2
    return int(raw.get("mm_tokens_per_image", 256))


VARIABLE_IMAGE_TYPES = ("qwen2_5_vl", "qwen3_5", "qwen3_5_moe")  # an image's token count follows its size


def _media_config(raw: dict, path: Path) -> ModelConfig:
    """A vision-language checkpoint: its language model's config (``text_config``, with
    the outer architecture, ties and ids where the inner one is silent) plus MediaConfig.
    transformers 4's Qwen2.5-VL keeps the language model's fields at the top level."""
    if "text_config" not in raw:
        raw = raw | {"text_config": {k: v for k, v in raw.items() if k != "vision_config"}}
    text = raw["text_config"]
    if not isinstance(text, dict) or not isinstance(raw["vision_config"], dict):
        raise CheckpointError(f"{path}: fields 'text_config' and 'vision_config' must be JSON objects")
    inner = {k: raw[k] for k in ("tie_word_embeddings", "eos_token_id", "bos_token_id") if k in raw} | text
    inner["architectures"] = raw.get("architectures") or [str(raw.get("model_type", ""))]
    cfg = parse_model_config(inner, path)
    media = MediaConfig(
        vision=raw["vision_config"],
        image_token_id=int(raw.get("image_token_id", raw.get("image_token_index", 0))),
        boi_token_id=raw.get("boi_token_id", raw.get("boi_token_index", raw.get("vision_start_token_id"))),
        eoi_token_id=raw.get("eoi_token_id", raw.get("eoi_token_index", raw.get("vision_end_token_id"))),
        tokens_per_image=_tokens_per_image(raw),
    )
    merged = {k: v for k, v in raw.items() if k != "text_config"} | text  # the model reads text fields from raw
    merged["architectures"], merged["model_type"] = inner["architectures"], raw.get("model_type", "")
    return dataclasses.replace(cfg, model_type=str(raw.get("model_type", "")), raw=merged, media=media)


def parse_model_config(raw: dict, path: Path) -> ModelConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if "vision_config" in raw and ("text_config" in raw or raw.get("model_type") in VARIABLE_IMAGE_TYPES):
        return _media_config(raw, path)
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else str(raw.get("model_type", ""))
    recurrent = raw.get("model_type") in RECURRENT_MODEL_TYPES
    hidden = int(_require(raw, "hidden_size", path))
    n_heads = int(raw.get("num_heads") or 1) if recurrent else int(_require(raw, "num_attention_heads", path))
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    n_layers = int(_require(raw, "num_hidden_layers", path) if _layer_list(raw) is None else len(_layer_list(raw)))
    max_pos = int(raw.get("max_position_embeddings") or (2**20 if recurrent else 4096))  # a state has no limit
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise CheckpointError(f"{path}: field 'sliding_window' is {window!r}; it must be a positive integer")
    return ModelConfig(
        architecture=arch,
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(_require(raw, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=_ffn_size(raw, path, recurrent, hidden),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
        head_dim=int(raw.get("head_dim") or hidden // n_heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", raw.get("layer_norm_epsilon", raw.get("norm_eps", 1e-6)))),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope=_rope(raw, path),
        checkpoint_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_as_ids(raw.get("eos_token_id")),
        sliding_window=int(window) if window else None,
        layer_types=_layer_types(raw, n_layers, int(window) if window else None, path),
        rope_local=_rope_local(raw, path),
        raw=raw,
    )


def _ffn_size(raw: dict, path: Path, recurrent: bool, hidden: int) -> int:
    """The dense MLP's width: ``intermediate_size``; a Mamba's ``expand`` x hidden; an
    expert's width where every layer's MLP is experts and the config writes no dense size
    (transformers' Qwen3_5MoeTextConfig)."""
    if recurrent:
        return _ffn(raw.get("intermediate_size") or int(raw.get("expand", 2) * hidden))
    if raw.get("intermediate_size") is None and raw.get("moe_intermediate_size") is not None:
        return _ffn(raw["moe_intermediate_size"])
    return _ffn(_require(raw, "intermediate_size", path))


def load_model_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (is '{folder}' a Hugging Face checkpoint folder?)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: malformed JSON: {exc}") from exc
    return parse_model_config(raw, path)
