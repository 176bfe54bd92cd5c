"""The config.json a GGUF's metadata stands for, recurrent models and hybrids: Mamba2,
Granite 4.0, Falcon-H1, Jamba, LFM2, Nemotron-H, Qwen3.5 / Qwen3-Next."""

from __future__ import annotations

from engine.loading.gguf.configs_attention import base_config
from engine.loading.gguf.tensors import GGUFMetadata, kv_heads
from engine.models.qwen3_5 import TILED


def _ssm(ck: GGUFMetadata, prefix: str) -> dict:
    """Mamba2 mixer fields (``prefix``: "" for Mamba2, "mamba_" for the hybrids)."""
    a = ck.arch
    inner, heads = ck.get(f"{a}.ssm.inner_size"), ck.get(f"{a}.ssm.time_step_rank")
    layer = next(i for i in range(ck.get(f"{a}.block_count")) if f"blk.{i}.ssm_in.weight" in ck.tensors)
    return {
        f"{prefix}n_heads" if prefix else "num_heads": heads,
        f"{prefix}d_head" if prefix else "head_dim": inner // heads,
        f"{prefix}d_state" if prefix else "state_size": ck.get(f"{a}.ssm.state_size"),
        f"{prefix}n_groups" if prefix else "n_groups": ck.get(f"{a}.ssm.group_count") or 1,
        f"{prefix}d_conv" if prefix else "conv_kernel": ck.get(f"{a}.ssm.conv_kernel"),
        f"{prefix}expand" if prefix else "expand": inner // ck.get(f"{a}.embedding_length"),
        f"{prefix}conv_bias" if prefix else "use_conv_bias": f"blk.{layer}.ssm_conv1d.bias" in ck.tensors,
        f"{prefix}proj_bias" if prefix else "use_bias": f"blk.{layer}.ssm_in.bias" in ck.tensors,
    }


def mamba2_config(ck: GGUFMetadata) -> dict:
    a = ck.arch
    return {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "hidden_size": ck.get(f"{a}.embedding_length"),
        "num_hidden_layers": ck.get(f"{a}.block_count"),
        "vocab_size": ck.vocab_size,
        "layer_norm_epsilon": ck.get(f"{a}.attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in ck.tensors,
        "torch_dtype": "float32",
        **_ssm(ck, ""),
    }


def granite_hybrid_config(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = {**base_config(ck, "granitemoehybrid"), **_ssm(ck, "mamba_")}
    cfg["layer_types"] = ["attention" if k else "mamba" for k in kv_heads(ck)]
    cfg["mamba_d_ssm"] = ck.get(f"{a}.ssm.inner_size")
    cfg["position_embedding_type"] = "rope" if ck.get(f"{a}.rope.scaling.finetuned") else None
    pairs = (("embedding_multiplier", "embedding_scale"), ("residual_multiplier", "residual_scale"),
             ("attention_multiplier", "attention.scale"), ("logits_scaling", "logit_scale"),
             ("num_local_experts", "expert_count"), ("num_experts_per_tok", "expert_used_count"),
             ("shared_intermediate_size", "expert_shared_feed_forward_length"))  # fmt: skip
    for hf_key, key in pairs:
        if ck.get(f"{a}.{key}") is not None:
            cfg[hf_key] = ck.get(f"{a}.{key}")
    return cfg


def falcon_h1_config(ck: GGUFMetadata) -> dict:
    """The converter multiplies every muP multiplier into the weights: all stay 1 here."""
    cfg = {**base_config(ck, "falcon_h1"), **_ssm(ck, "mamba_")}
    cfg["mamba_d_ssm"] = ck.get(f"{ck.arch}.ssm.inner_size")
    cfg["mamba_rms_norm"] = "blk.0.ssm_norm.weight" in ck.tensors
    cfg["projectors_bias"] = "blk.0.ssm_out.bias" in ck.tensors
    return cfg


def _every(layers: list[int], n: int) -> tuple[int, int]:
    """(period, offset) of a regular set of layer indices."""
    if not layers:
        return n + 1, n
    return (layers[1] - layers[0] if len(layers) > 1 else n), layers[0]


def jamba_config(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = base_config(ck, "jamba")
    n = cfg["num_hidden_layers"]
    attn = [i for i, k in enumerate(kv_heads(ck)) if k]
    moe = [i for i in range(n) if f"blk.{i}.ffn_gate_exps.weight" in ck.tensors]
    cfg["attn_layer_period"], cfg["attn_layer_offset"] = _every(attn, n)
    cfg["expert_layer_period"], cfg["expert_layer_offset"] = _every(moe, n)
    layer = next(i for i in range(n) if f"blk.{i}.ssm_in.weight" in ck.tensors)
    cfg.update(
        num_experts=ck.get(f"{a}.expert_count") or 1,
        num_experts_per_tok=ck.get(f"{a}.expert_used_count") or 1,
        mamba_d_state=ck.get(f"{a}.ssm.state_size"),
        mamba_d_conv=ck.get(f"{a}.ssm.conv_kernel"),
        mamba_expand=ck.get(f"{a}.ssm.inner_size") // cfg["hidden_size"],
        mamba_dt_rank=ck.get(f"{a}.ssm.time_step_rank"),
        mamba_conv_bias=f"blk.{layer}.ssm_conv1d.bias" in ck.tensors,
        mamba_proj_bias=f"blk.{layer}.ssm_in.bias" in ck.tensors,
    )
    return cfg


def lfm2_config(ck: GGUFMetadata) -> dict:
    """LFM2 and LFM2-MoE: the converter writes 0 KV heads for the short-convolution
    layers and the feed-forward size already adjusted (``block_auto_adjust_ff_dim`` off
    here); of the experts, neither a weight scale nor whether the chosen weights are
    renormalized (llama.cpp's rule stands in: renormalized, unscaled)."""
    a = ck.arch
    cfg = base_config(ck, "lfm2_moe" if a == "lfm2moe" else "lfm2")
    cfg["layer_types"] = ["full_attention" if k else "conv" for k in kv_heads(ck)]
    cfg.update(conv_L_cache=ck.get(f"{a}.shortconv.l_cache", 3), block_auto_adjust_ff_dim=False)
    cfg["conv_bias"] = "blk.0.shortconv.in_proj.bias" in ck.tensors
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            num_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            num_dense_layers=ck.get(f"{a}.leading_dense_block_count") or 0,
            use_expert_bias="blk.{}.exp_probs_b.bias".format(cfg["num_hidden_layers"] - 1) in ck.tensors,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
        )
    return cfg


def nemotron_h_config(ck: GGUFMetadata) -> dict:
    """Nemotron-H: each block's mixer from what the file holds (KV heads: attention;
    ``ssm_in``: Mamba2; stacked experts: MoE; else the MLP); the MLP's width from its
    tensor (the converter writes 0 for it); no time-step limit is written, and none
    applies (llama.cpp's reading, and transformers' default ``time_step_limit``)."""
    a = ck.arch
    cfg = base_config(ck, "nemotron_h")
    n = cfg.pop("num_hidden_layers")
    heads = kv_heads(ck)

    def kind(i: int) -> str:
        if heads[i]:
            return "full_attention"
        if f"blk.{i}.ssm_in.weight" in ck.tensors:
            return "linear_attention"
        return "moe" if f"blk.{i}.ffn_up_exps.weight" in ck.tensors else "mlp"

    cfg["layers_block_type"] = [kind(i) for i in range(n)]
    dense = next((i for i, k in enumerate(cfg["layers_block_type"]) if k == "mlp"), None)
    cfg["intermediate_size"] = ck.tensors[f"blk.{dense}.ffn_up.weight"][1][0] if dense is not None else 1
    inner, ssm_heads = ck.get(f"{a}.ssm.inner_size"), ck.get(f"{a}.ssm.time_step_rank")
    cfg.update(
        mamba_num_heads=ssm_heads,
        mamba_head_dim=inner // ssm_heads if ssm_heads else 1,
        ssm_state_size=ck.get(f"{a}.ssm.state_size"),
        n_groups=ck.get(f"{a}.ssm.group_count") or 1,
        conv_kernel=ck.get(f"{a}.ssm.conv_kernel") or 4,
        layer_norm_epsilon=ck.get(f"{a}.attention.layer_norm_epsilon"),
        use_conv_bias=any(name.endswith("ssm_conv1d.bias") for name in ck.tensors),
    )
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            n_routed_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            n_group=ck.get(f"{a}.expert_group_count") or 1,
            topk_group=ck.get(f"{a}.expert_group_used_count") or 1,
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            moe_shared_expert_intermediate_size=ck.get(f"{a}.expert_shared_feed_forward_length"),
            norm_topk_prob=bool(ck.get(f"{a}.expert_weights_norm", True)),
            routed_scaling_factor=ck.get(f"{a}.expert_weights_scale") or 1.0,
            moe_latent_size=ck.get(f"{a}.moe_latent_size"),
        )
    return cfg


QWEN35_TYPES = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text", "qwen3next": "qwen3_next"}


def qwen35_config(ck: GGUFMetadata) -> dict:
    """Qwen3.5 text (dense and MoE) and Qwen3-Next: Gated DeltaNet sizes in the file's
    ``ssm.*`` keys (key heads as groups, their width as the state size, value heads as
    the time-step rank), the rotary part of each head as ``rope.dimension_count``; the
    experts' sizes, dense layers where no ``ffn_gate_exps`` is written, the chosen
    experts' weights renormalized (llama.cpp's rule: the file does not say)."""
    a = ck.arch
    cfg = base_config(ck, QWEN35_TYPES[a])
    cfg[TILED] = a != "qwen3next"  # the converter tiles Qwen3.5's value heads (not Qwen3-Next's)
    cfg["layer_types"] = [
        "linear_attention" if r else "full_attention" for r in ck.get(f"{a}.attention.recurrent_layers")
    ]
    heads = ck.get(f"{a}.ssm.time_step_rank")
    cfg.update(
        linear_num_key_heads=ck.get(f"{a}.ssm.group_count"),
        linear_key_head_dim=ck.get(f"{a}.ssm.state_size"),
        linear_num_value_heads=heads,
        linear_value_head_dim=ck.get(f"{a}.ssm.inner_size") // heads,
        linear_conv_kernel_dim=ck.get(f"{a}.ssm.conv_kernel"),
    )
    if ck.get(f"{a}.expert_count"):
        n = cfg["num_hidden_layers"]
        cfg.update(
            num_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            shared_expert_intermediate_size=ck.get(f"{a}.expert_shared_feed_forward_length"),
            mlp_only_layers=[i for i in range(n) if f"blk.{i}.ffn_gate_exps.weight" not in ck.tensors],
            norm_topk_prob=True,
        )
    rotated = ck.get(f"{a}.rope.dimension_count") or cfg["head_dim"]
    cfg["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": cfg["rope_theta"],
        "partial_rotary_factor": rotated / cfg["head_dim"],
    }
    sections = ck.get(f"{a}.rope.dimension_sections")  # interleaved M-RoPE's (time, height, width, 0)
    if sections:
        cfg["rope_parameters"]["mrope_section"] = [int(s) for s in sections[:3]]
    return cfg
