"""The config.json a GGUF's metadata stands for, attention models: Llama-likes, Gemma 2 /
3 / 3n / 4, SmolLM3, Phi-3 / 4, and the mixtures of experts with attention (Qwen3-MoE,
Qwen2-MoE, GLM-4 MoE). ``base_config`` reads what every architecture writes; the
``architectures`` entry is the table's (engine/loading/gguf/archs.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

from engine.loading.gguf.tensors import GGUFMetadata, kv_heads


def base_config(ck: GGUFMetadata, model_type: str) -> dict:
    a = ck.arch
    n_head = ck.get(f"{a}.attention.head_count") or 0
    hidden = ck.get(f"{a}.embedding_length")
    cfg = {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": ck.get(f"{a}.feed_forward_length"),
        "num_hidden_layers": ck.get(f"{a}.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": max(kv_heads(ck)) or n_head,
        "head_dim": ck.get(f"{a}.attention.key_length") or (hidden // n_head if n_head else None),
        "rms_norm_eps": ck.get(f"{a}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": ck.get(f"{a}.context_length"),
        "vocab_size": ck.vocab_size,
        "rope_theta": ck.get(f"{a}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in ck.tensors,
        "attention_bias": "blk.0.attn_q.bias" in ck.tensors,
        "torch_dtype": "float32",
    }
    eos = ck.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        cfg["eos_token_id"] = eos
    scaling, factor = ck.get(f"{a}.rope.scaling.type"), ck.get(f"{a}.rope.scaling.factor")
    if scaling == "linear" and factor:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return {k: v for k, v in cfg.items() if v is not None}


def llama_like_config(model_type: str) -> Callable[[GGUFMetadata], dict]:
    def config(ck: GGUFMetadata) -> dict:
        cfg = base_config(ck, model_type)
        window = ck.get(f"{ck.arch}.attention.sliding_window")
        if window:
            cfg["sliding_window"] = window
        sections = ck.get(f"{ck.arch}.rope.dimension_sections")  # Qwen2-VL's M-RoPE (qwen2vl): 4, the last 0
        if sections:
            cfg["rope_parameters"] = {
                "rope_type": "default",
                "rope_theta": cfg["rope_theta"],
                "mrope_section": sections[:3],
            }
        return cfg

    return config


def gemma_config(model_type: str) -> Callable[[GGUFMetadata], dict]:
    """Gemma 2 and 3. The file does not say which layers slide nor the query scale:
    llama.cpp's rules stand in (Gemma 2 alternates, Gemma 3 makes every 6th layer
    global unless a pattern is given; the scale is 1/sqrt(head_dim), or
    1/sqrt(hidden/heads) for the 27B models, 46 and 62 layers)."""

    def config(ck: GGUFMetadata) -> dict:
        a = ck.arch
        cfg = base_config(ck, model_type)
        n = cfg["num_hidden_layers"]
        pattern = ck.get(f"{a}.attention.sliding_window_pattern")
        if isinstance(pattern, list):
            slides = [bool(x) for x in pattern]
        else:
            every = 2 if a == "gemma2" else int(pattern or 6)
            slides = [(i + 1) % every != 0 for i in range(n)]
        cfg["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]
        cfg["sliding_window"] = ck.get(f"{a}.attention.sliding_window") or 4096
        scale = ck.get(f"{a}.attention.scale")
        wide = n in (46, 62)
        cfg["query_pre_attn_scalar"] = (
            1.0 / scale**2 if scale else (cfg["hidden_size"] // cfg["num_attention_heads"] if wide else cfg["head_dim"])
        )
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if ck.get(f"{a}.{key}") is not None:
                cfg[key] = ck.get(f"{a}.{key}")
        if a != "gemma2":  # sliding layers' own rope base
            cfg["rope_local_base_freq"] = ck.get(f"{a}.rope.freq_base_swa", 10000.0)
        return cfg

    return config


def gemma3n_config(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = gemma_config("gemma3n_text")(ck)
    del cfg["query_pre_attn_scalar"]  # Gemma 3n does not scale queries (its q/k norms do)
    scales = ck.get(f"{a}.activation_sparsity_scale") or [-math.inf] * cfg["num_hidden_layers"]
    cfg.update(
        intermediate_size=ck.get(f"{a}.feed_forward_length"),
        activation_sparsity_pattern=[0.5 * (1 + math.erf(s / math.sqrt(2))) for s in scales],  # back from icdf
        altup_active_idx=ck.get(f"{a}.altup.active_idx", 0),
        altup_num_inputs=ck.get(f"{a}.altup.num_inputs", 4),
        hidden_size_per_layer_input=ck.get(f"{a}.embedding_length_per_layer_input"),
        num_kv_shared_layers=ck.get(f"{a}.attention.shared_kv_layers", 0),
        laurel_rank=ck.tensors["blk.0.laurel_l.weight"][1][0],
        vocab_size_per_layer_input=ck.tensors["per_layer_token_embd.weight"][1][0],
    )
    return cfg


def gemma4_config(ck: GGUFMetadata) -> dict:
    """Gemma 4: per-layer KV heads and feed-forward widths, the two head sizes
    (``key_length`` full, ``key_length_swa`` sliding), k = v where a full layer that
    keeps its own cache has no ``attn_v``, the full layers' rotated share from
    ``rope_freqs`` (1 where an angle turns, 1e30 where it stands)."""
    a = ck.arch
    cfg = base_config(ck, "gemma4_text")
    n = cfg["num_hidden_layers"]
    slides = [bool(x) for x in ck.get(f"{a}.attention.sliding_window_pattern")]
    heads, ffn = kv_heads(ck), ck.get(f"{a}.feed_forward_length")
    ffn = ffn if isinstance(ffn, list) else [ffn] * n
    full_head, swa_head = ck.get(f"{a}.attention.key_length"), ck.get(f"{a}.attention.key_length_swa")
    shared = ck.get(f"{a}.attention.shared_kv_layers") or 0
    own_full = [i for i in range(n - shared) if not slides[i]]
    turning = full_head // 2
    if "rope_freqs.weight" in ck.tensors:
        turning = int((ck.small_tensor("rope_freqs.weight") < 2).sum())
    cfg.update(
        layer_types=["sliding_attention" if s else "full_attention" for s in slides],
        sliding_window=ck.get(f"{a}.attention.sliding_window"),
        head_dim=swa_head,
        num_key_value_heads=next((heads[i] for i in range(n) if slides[i]), heads[0]),
        per_layer_config={
            str(i): {"head_dim": swa_head if slides[i] else full_head, "num_key_value_heads": heads[i]}
            for i in range(n)
        },
        attention_k_eq_v=bool(own_full) and f"blk.{own_full[0]}.attn_v.weight" not in ck.tensors,
        intermediate_size=ffn[0],
        use_double_wide_mlp=any(f == 2 * ffn[0] for f in ffn[n - shared :]) if shared else False,
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=ck.get(f"{a}.embedding_length_per_layer_input") or 0,
        final_logit_softcapping=ck.get(f"{a}.final_logit_softcapping"),
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "rope_theta": cfg["rope_theta"],
                               "partial_rotary_factor": 2 * turning / full_head},
            "sliding_attention": {"rope_type": "default", "rope_theta": ck.get(f"{a}.rope.freq_base_swa", 10000.0)},
        },
    )  # fmt: skip
    if "per_layer_token_embd.weight" in ck.tensors:
        cfg["vocab_size_per_layer_input"] = ck.tensors["per_layer_token_embd.weight"][1][0]
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            enable_moe_block=True,
            num_experts=ck.get(f"{a}.expert_count"),
            top_k_experts=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
        )
    return cfg


def qwen_moe_config(model_type: str) -> Callable[[GGUFMetadata], dict]:
    """Qwen3-MoE and Qwen2-MoE: the experts' sizes and, for Qwen2-MoE, the shared
    expert's; dense layers where no ``ffn_gate_exps`` is written. The chosen experts'
    weights are renormalized for Qwen3-MoE and not for Qwen2-MoE: llama.cpp's rules (the
    file does not say)."""

    def config(ck: GGUFMetadata) -> dict:
        a = ck.arch
        cfg = base_config(ck, model_type)
        n = cfg["num_hidden_layers"]
        cfg.update(
            num_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            mlp_only_layers=[i for i in range(n) if f"blk.{i}.ffn_gate_exps.weight" not in ck.tensors],
            norm_topk_prob=a == "qwen3moe",
        )
        shared = ck.get(f"{a}.expert_shared_feed_forward_length")
        if shared:
            cfg["shared_expert_intermediate_size"] = shared
        return cfg

    return config


def _partial_rope(ck: GGUFMetadata, cfg: dict) -> dict:
    """Default rope over the first ``rope.dimension_count`` of each head."""
    turned = ck.get(f"{ck.arch}.rope.dimension_count") or cfg["head_dim"]
    return {"rope_type": "default", "rope_theta": cfg["rope_theta"], "partial_rotary_factor": turned / cfg["head_dim"]}


def smollm3_config(ck: GGUFMetadata) -> dict:
    """SmolLM3: llama.cpp's fixed rule, every 4th layer without rotary positions."""
    return llama_like_config("smollm3")(ck) | {"no_rope_layer_interval": 4}


def phi3_config(ck: GGUFMetadata) -> dict:
    """Phi-3 / Phi-4: the rotated part of each head from ``rope.dimension_count``; LongRoPE
    from the ``rope_factors_short`` / ``_long`` tensors, the original context and the
    attention factor the converter wrote; a sliding window where one is given (0: none)."""
    a = ck.arch
    cfg = base_config(ck, "phi3")
    rope = _partial_rope(ck, cfg)
    if "rope_factors_long.weight" in ck.tensors:
        rope.update(
            rope_type="longrope",
            short_factor=ck.small_tensor("rope_factors_short.weight").tolist(),
            long_factor=ck.small_tensor("rope_factors_long.weight").tolist(),
            original_max_position_embeddings=ck.get(f"{a}.rope.scaling.original_context_length"),
            attention_factor=ck.get(f"{a}.rope.scaling.attn_factor"),
        )
    cfg["rope_parameters"] = rope
    window = ck.get(f"{a}.attention.sliding_window")
    if window:
        cfg["sliding_window"] = window
    return cfg


def glm4_moe_config(ck: GGUFMetadata) -> dict:
    """GLM-4 MoE: the layers less the next-token-prediction ones the file carries after
    them (not read), the dense leading layers, the router's groups, scale and
    renormalization as written, the rotated part of each head, q/k norms where present."""
    a = ck.arch
    cfg = base_config(ck, "glm4_moe")
    cfg["num_hidden_layers"] -= ck.get(f"{a}.nextn_predict_layers") or 0
    cfg["rope_parameters"] = _partial_rope(ck, cfg)
    cfg.update(
        n_routed_experts=ck.get(f"{a}.expert_count"),
        num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
        moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
        n_shared_experts=ck.get(f"{a}.expert_shared_count", 1),
        first_k_dense_replace=ck.get(f"{a}.leading_dense_block_count", 0),
        n_group=ck.get(f"{a}.expert_group_count", 1),
        topk_group=ck.get(f"{a}.expert_group_used_count", 1),
        routed_scaling_factor=ck.get(f"{a}.expert_weights_scale", 1.0),
        norm_topk_prob=bool(ck.get(f"{a}.expert_weights_norm", True)),
        use_qk_norm="blk.0.attn_q_norm.weight" in ck.tensors,
    )
    return cfg


def gpt_oss_config(ck: GGUFMetadata) -> dict:
    """gpt-oss: YaRN as llama.cpp reads the file (the converter drops the folder's
    ``truncate: false``; ggml_rope_yarn_corr_dims floors and ceils the correction range,
    which is transformers' ``truncate: true``), the experts' sizes, every other layer
    sliding from the first (llama.cpp's rule: the file names the window, not the layers)
    and the clamped SwiGLU's constants llama.cpp fixes (alpha 1.702, limit 7)."""
    a = ck.arch
    cfg = base_config(ck, "gpt_oss")
    n = cfg["num_hidden_layers"]
    cfg["rope_parameters"] = {
        "rope_type": "yarn",
        "rope_theta": cfg["rope_theta"],
        "factor": ck.get(f"{a}.rope.scaling.factor", 1.0),
        "original_max_position_embeddings": ck.get(f"{a}.rope.scaling.original_context_length"),
        "beta_fast": ck.get(f"{a}.rope.scaling.yarn_beta_fast", 32.0),
        "beta_slow": ck.get(f"{a}.rope.scaling.yarn_beta_slow", 1.0),
        "truncate": True,
    }
    cfg.update(
        num_local_experts=ck.get(f"{a}.expert_count"),
        num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
        intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
        sliding_window=ck.get(f"{a}.attention.sliding_window"),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
    )
    return cfg
